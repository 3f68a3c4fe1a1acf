"""One survey job: one task, every configured numerics mode, one `survey_task` record per mode.

`run_survey_task` loads the pinned task (its sha256 re-checked) and seeds and instantiates it
as KernelBench does. Then, sharing the GPU with other survey jobs (kbfuse.workflow.gpulock),
for each numerics mode in turn: the mode's TF32 switches, eager's reference output and its
statistics, the determinism check, FLOPs and bytes, the blind spots and each baseline's
correctness against eager. The baselines are built once, under the first mode whose eager
forward ran (TF32 is a run-time switch of cuBLAS and cuDNN, read at each call: a traced or
compiled forward follows the mode in force), and the record says in which mode (`job`). Then,
alone on the GPU, for each mode: the timing of every baseline that passed those stages, their
kernel profiles, the ratios. A baseline failing at any stage is recorded with that stage and
the job goes on; if eager itself fails in a mode, that mode's record says so and holds no
measurement. Every record is validated against its schema before any is written (each
atomically), so a record on disk always follows the contract. Progress lines go to `say`.

One job for all modes, rather than one per mode, pays the process start-up and the builds
(Inductor's compile above all) once per task; the GPU lock lets those overlap other jobs'
while keeping every timing alone on the device. A task that runs out of memory beside other
jobs (their models and caches hold device memory too), whether loading its model and inputs
or in a baseline, is done again from the start, alone on the device, and its records say so
(`job.rerun_alone`); only then is an out-of-memory failure the task's own (recorded for a
baseline; for the model or its inputs, the job fails).
"""

from __future__ import annotations

import contextlib
import os
import platform
import time
from collections.abc import Callable
from pathlib import Path

from kbfuse.errors import KbfuseError
from kbfuse.io import jsonable, write_json
from kbfuse.results import records
from kbfuse.survey import baselines, blindspots, correctness, determinism, flops, profile, tasks
from kbfuse.survey import timing as survey_timing
from kbfuse.survey.settings import set_numerics
from kbfuse.tasks.kernelbench import load_task, read_pin
from kbfuse.workflow import gpulock

KIND = "survey_task"
SCHEMA_VERSION = 1


def share_compile_caches(root) -> dict:
    """Point Inductor's and Triton's on-disk caches at one folder under `root`, shared by every
    survey job (an FX graph or Triton kernel compiled once serves all later jobs and reruns),
    and let Inductor compile in the job's own process: several survey jobs run at once, and a
    pool of compile workers in each (one per core, each importing torch) would only crowd the
    machine. Call before torch is imported; variables already set are left alone."""
    root = Path(root).resolve()
    paths = {"TORCHINDUCTOR_CACHE_DIR": root / "inductor", "TRITON_CACHE_DIR": root / "triton"}
    for key, path in paths.items():
        path.mkdir(parents=True, exist_ok=True)
        os.environ.setdefault(key, str(path))
    os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
    return {key: os.environ[key] for key in (*paths, "TORCHINDUCTOR_COMPILE_THREADS")}


def environment(device: str) -> dict:
    import torch

    cuda = device == "cuda"
    return {
        "device": device,
        "device_name": torch.cuda.get_device_name() if cuda else (platform.processor() or "cpu"),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
    }


def _sync(device: str) -> Callable[[], None]:
    import torch

    return torch.cuda.synchronize if device == "cuda" else (lambda: None)


def _baseline_entry() -> dict:
    return {
        "status": "ok",
        "failure": None,
        "build_s": None,
        "correctness": None,
        "timing": None,
        "kernels": None,
    }


def _fail(entry: dict, stage: str, exc: BaseException, say) -> None:
    entry["status"] = "failed"
    entry["failure"] = baselines.failure(stage, exc)
    say(f"  {stage} failed: {entry['failure']['error']}: {entry['failure']['message']}")


class _Task:
    """The loaded task and the settings of this job, with its progress log."""

    def __init__(self, checkout, pin_path, settings: dict, say):
        self.settings = settings
        self.device = settings["device"]
        self.seed = settings["seed"]
        self.semantics = settings["semantics"]
        self.protocol = survey_timing.check_protocol(settings)
        self.pin = read_pin(pin_path)
        if len(self.pin["tasks"]) != 1:
            raise KbfuseError(f"survey pin {pin_path} must name exactly one task")
        self.task = int(next(iter(self.pin["tasks"])))
        self.spec = load_task(checkout, self.pin, self.task)
        self.say = say

    def header(self) -> dict:
        record = self.pin["tasks"][str(self.task)]
        return {
            "kind": KIND,
            "schema_version": SCHEMA_VERSION,
            "task": self.task,
            "level": self.pin["level"],
            "file": Path(record["path"]).name,
            "sha256": self.spec.sha256,
            "commit": self.pin["commit"],
            "semantics": self.semantics,
            "seed": self.seed,
        }


class _Mode:
    """One numerics mode of the job: its record and the baselines still ok in it."""

    def __init__(self, name: str, record: dict):
        self.name = name
        self.record = record
        self.runs: dict[str, Callable[[], object]] = {}
        self.reference = None


class Phases:
    """Seconds spent in each phase of the job (the records' `phases_s`)."""

    def __init__(self):
        self.seconds: dict[str, float] = {}

    @contextlib.contextmanager
    def __call__(self, name: str):
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start


def _eager_failed(t: _Task, record: dict, stage: str, exc: BaseException) -> None:
    entries = {name: _baseline_entry() for name in t.settings["baselines"]}
    for entry in entries.values():
        _fail(entry, stage, exc, t.say)
    record.update(
        output=None, determinism=None, flops=None, bytes=None, blind_spots=None,
        blind_spot=False, baselines=entries, ratios={},
    )  # fmt: skip


def _reference(t: _Task, m: _Mode, eager, model, inputs) -> bool:
    """Eager's output in mode `m` and what is learnt from it; False when eager failed."""
    record = m.record
    try:
        m.reference = determinism.seeded_call(eager, t.seed)
        record["output"] = correctness.output_stats(m.reference)
    except Exception as exc:  # noqa: BLE001 - the record says eager failed
        _eager_failed(t, record, "build", exc)
        return False
    t.say(f"{m.name}: determinism, flops, blind spots")
    record["determinism"] = determinism.check(eager, t.seed)
    record["flops"] = flops.count(eager)
    record["bytes"] = flops.sizes(model, inputs, m.reference)
    record["blind_spots"] = blindspots.check(m.reference, inputs)
    record["blind_spot"] = blindspots.any_passes(record["blind_spots"])
    return True


def _build(t: _Task, model, inputs) -> dict[str, tuple]:
    """name -> (run, build_s, None) or (None, None, the exception that stopped its build)."""
    builds = {}
    for name in t.settings["baselines"]:
        t.say(f"baseline {name}: build")
        try:
            run, build_s = baselines.build(name, model, inputs, t.semantics, _sync(t.device))
        except Exception as exc:  # noqa: BLE001 - recorded, the survey goes on
            builds[name] = (None, None, exc)
            continue
        t.say(f"baseline {name}: built in {build_s:.2f} s")
        builds[name] = (run, build_s, None)
    return builds


def _check(t: _Task, m: _Mode, builds: dict[str, tuple]) -> None:
    """Each built baseline against eager in mode `m`; those that pass stay in `m.runs`."""
    entries = m.record["baselines"] = {}
    for name, (run, build_s, exc) in builds.items():
        entry = entries[name] = _baseline_entry()
        entry["build_s"] = build_s
        if run is None:
            _fail(entry, "build", exc, t.say)
            continue
        try:
            entry["correctness"] = correctness.compare(
                m.reference, determinism.seeded_call(run, t.seed)
            )
        except Exception as exc:  # noqa: BLE001
            _fail(entry, "correctness", exc, t.say)
            continue
        m.runs[name] = run


def _time(t: _Task, m: _Mode) -> None:
    """Time every baseline still ok in mode `m`: its ratios and protocol (with the calls per
    sample this task got) into its record; a baseline failing here is marked."""
    entries, runs = m.record["baselines"], m.runs
    protocol, sizing = survey_timing.sized_protocol(
        runs, t.protocol, t.device, t.settings["min_sample_ms"]
    )
    m.record["timing_protocol"].update(sizing)
    label = f"survey/{t.task}/{m.name}/{t.semantics}"
    t.say(f"{m.name}: timing {list(runs)}, {protocol['invocations_per_pair']} calls per sample")
    timing, ratios, failures = survey_timing.time_baselines(
        runs, protocol, t.device, t.settings["cold_l2"], label, t.say
    )
    for name, figures in timing.items():
        if name in failures:
            entries[name].update(status="failed", failure=failures[name])
            runs.pop(name)
        else:
            entries[name]["timing"] = figures
    m.record["ratios"] = ratios


def _profile(t: _Task, m: _Mode) -> None:
    for name, run in m.runs.items():
        t.say(f"{m.name}: profile {name}")
        try:
            m.record["baselines"][name]["kernels"] = profile.kernels(run, t.device)
        except Exception as exc:  # noqa: BLE001
            _fail(m.record["baselines"][name], "profile", exc, t.say)


def _new_record(t: _Task, mode: str, phases: Phases, job: dict) -> dict:
    record = t.header()
    record["numerics"] = set_numerics(mode)
    record["device"] = t.device
    record["environment"] = environment(t.device)
    record["timing_protocol"] = {
        **t.protocol,
        **survey_timing.unsized(t.protocol, t.settings["min_sample_ms"]),
        "methods": survey_timing.methods(t.device, t.settings["cold_l2"]),
    }
    record["job"] = job
    record["phases_s"] = phases.seconds
    return record


def survey_task(
    checkout, pin_path, settings: dict, modes: list[str], say=print, lock=None
) -> dict[str, dict]:
    """The `survey_task` records (not written) of the pinned task in `pin_path`, one per
    numerics mode in `modes`. `lock`: the GPU lock (kbfuse.workflow.gpulock), by default the
    one of the configured device."""
    if not modes:
        raise KbfuseError("a survey job needs at least one numerics mode")
    phase = Phases()
    with phase("load"):
        t = _Task(checkout, pin_path, settings, say)
        say(f"task {t.task} ({t.spec.name}), numerics {modes}, semantics {t.semantics}, {t.device}")
        lock = gpulock.for_device(t.device) if lock is None else lock
        job = {"modes": list(modes), "built_in": None, "rerun_alone": False}
        per_mode = [_Mode(mode, _new_record(t, mode, phase, job)) for mode in modes]
    with lock.shared():
        phase.seconds["wait_shared"] = lock.waited_s
        with phase("reference_and_builds"):
            try:
                _references_and_builds(t, per_mode, job)
                rerun = _out_of_memory(per_mode)
            except Exception as exc:
                if not _is_out_of_memory(exc):
                    raise
                rerun = True  # the model or its inputs did not fit on the device
    if rerun:
        # Beside other jobs, memory they hold can make a large task fail: once more, alone.
        say("out of memory beside other jobs: the whole task again, alone on the device")
        job.update(built_in=None, rerun_alone=True)
        per_mode = [_Mode(m.name, _new_record(t, m.name, phase, job)) for m in per_mode]
    _release_memory()  # what the allocator caches, for the jobs that run meanwhile
    if rerun or any(m.runs for m in per_mode):  # nothing to time: no wait for the device
        waited = lock.waited_s
        with lock.alone():
            phase.seconds["wait_alone"] = lock.waited_s - waited
            if rerun:
                with phase("reference_and_builds"):
                    _references_and_builds(t, per_mode, job)
            _time_and_profile(t, per_mode, phase)
    for m in per_mode:
        m.record.setdefault("ratios", {})
    return {m.name: m.record for m in per_mode}


# How running out of device memory shows: torch's allocator raises OutOfMemoryError; a library
# that allocates for itself raises a RuntimeError that names its failed allocation (seen on the
# H200 with another job holding the memory: eager's first GEMM failed in `cublasCreate`).
OUT_OF_MEMORY_ERROR = "OutOfMemoryError"
OUT_OF_MEMORY_MESSAGES = (
    "CUBLAS_STATUS_ALLOC_FAILED",
    "CUBLASLT_STATUS_ALLOC_FAILED",
    "CUDNN_STATUS_ALLOC_FAILED",
    "CUSOLVER_STATUS_ALLOC_FAILED",
    "CUFFT_ALLOC_FAILED",
    "CUDA error: out of memory",
)


def out_of_memory(error: str, message: str) -> bool:
    """Is a failure (its error's type name and message, as records hold them) the device
    running out of memory?"""
    return error == OUT_OF_MEMORY_ERROR or any(m in message for m in OUT_OF_MEMORY_MESSAGES)


def _is_out_of_memory(exc: BaseException) -> bool:
    return out_of_memory(type(exc).__name__, baselines.first_line(exc))


def _out_of_memory(per_mode: list[_Mode]) -> bool:
    """Did any baseline of any mode fail for want of device memory?"""
    return any(
        out_of_memory(entry["failure"]["error"], entry["failure"]["message"])
        for m in per_mode
        for entry in (m.record.get("baselines") or {}).values()
        if entry.get("failure")
    )


def _release_memory() -> None:
    """Free what this job no longer references, and the CUDA allocator's cache of it."""
    import gc

    import torch

    gc.collect()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()


def _time_and_profile(t: _Task, per_mode: list[_Mode], phase: Phases) -> None:
    for m in per_mode:
        if not m.runs:
            continue
        set_numerics(m.name)
        with phase("timing"):
            _time(t, m)
        if t.settings["profile"]:
            with phase("profile"):
                _profile(t, m)


def _references_and_builds(t: _Task, per_mode: list[_Mode], job: dict) -> None:
    model, inputs = tasks.instantiate(t.spec, t.seed, t.semantics, t.device)
    eager = baselines.make("eager", model, inputs, t.semantics)
    builds = None
    for m in per_mode:
        m.record["inputs"] = tasks.describe_inputs(inputs)
        set_numerics(m.name)
        if not _reference(t, m, eager, model, inputs):
            continue
        if builds is None:  # in the first mode whose eager forward ran
            builds = _build(t, model, inputs)
            job["built_in"] = m.name
        _check(t, m, builds)
        m.record["compile_cache"] = baselines.compile_cache_counts()


def run_survey_task(
    checkout, pin_path, settings: dict, outs: dict, say=print, lock=None
) -> dict[str, dict]:
    """Run the job for every mode of `outs` ({numerics mode: record path}) and write the
    records once all of them are valid."""
    start = time.perf_counter()
    made = survey_task(checkout, pin_path, settings, list(outs), say, lock)
    made = {mode: jsonable(record) for mode, record in made.items()}
    for mode, record in made.items():
        records.validate_record(record, KIND, str(outs[mode]))
    for mode, record in made.items():
        write_json(outs[mode], record)
    say(f"wrote {len(made)} records ({', '.join(map(str, outs.values()))}) in "
        f"{time.perf_counter() - start:.1f} s")  # fmt: skip
    return made
