"""One survey job: one task, every configured numerics mode, one `survey_task` record per mode.

`run_survey_task` loads the pinned task (its sha256 re-checked) and builds it, and draws its
timing inputs, as KernelBench's evaluator does (kbfuse.checks.official, with the pinned
`kernelbench_contract`). Then, sharing the GPU with other survey jobs (kbfuse.workflow.gpulock),
for each numerics mode in turn: the mode's TF32 switches, eager's reference output on the
timing inputs and its statistics, the determinism check, FLOPs and bytes; then KernelBench's
official trials (each trial's inputs under its own trial seed), in one pass (`_official`):
eager once per trial, then the blind spots (does a trivial output pass every trial?) and each
baseline's correctness against that output. The baselines are built once, under the first
mode whose eager forward ran (TF32 is a run-time switch of cuBLAS and cuDNN, read at each call
by eager and Inductor), except TorchScript,
whose trace records the cuDNN switches as constants and is traced again in each mode
(`baselines.MODE_BOUND`); each baseline's entry names the mode it was built in. Then,
alone on the GPU, for each mode: the builds and official checks of the baselines whose build
times kernels on the GPU (`baselines.AUTOTUNED`: Inductor's max-autotune benchmarks its
candidate kernels while it compiles, and those benchmarks must not share the GPU with another
job's timing), the timing of every baseline that passed those stages, their profiled
forwards, the ratios; the profiles are read into kernels and timelines once the job has left
the GPU (CPU work: `phases_s.profile_read`). A baseline failing at any stage is recorded with
that stage and the job goes on; if eager itself fails in a mode, that mode's record says so
and holds no measurement. Every record is validated against its schema before any is written
(each atomically), so a record on disk always follows the contract. Progress lines go to
`say`.

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
from typing import NamedTuple

from kbfuse.checks import official
from kbfuse.errors import KbfuseError
from kbfuse.io import jsonable, write_json
from kbfuse.results import records
from kbfuse.survey import baselines, correctness, determinism, flops, profile, tasks
from kbfuse.survey import timing as survey_timing
from kbfuse.survey.settings import set_numerics
from kbfuse.tasks.evaluator import read_contract_record
from kbfuse.tasks.kernelbench import load_task
from kbfuse.workflow import devices, gpulock
from kbfuse.workflow.outofmemory import is_out_of_memory, out_of_memory, release_memory

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
    found = {
        "device": device,
        "device_name": torch.cuda.get_device_name() if cuda else (platform.processor() or "cpu"),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
    }
    if cuda:  # which GPU of the machine: index, UUID, name (kbfuse.workflow.devices)
        found["gpu"] = devices.current(device)
    return found


def _sync(device: str) -> Callable[[], None]:
    import torch

    return torch.cuda.synchronize if device == "cuda" else (lambda: None)


def _baseline_entry() -> dict:
    return {
        "status": "ok",
        "failure": None,
        "built_in": None,
        "build_s": None,
        "correctness": None,
        "timing": None,
        "kernels": None,
        "timeline": None,
    }


def _fail(entry: dict, stage: str, exc: BaseException, say) -> None:
    entry["status"] = "failed"
    entry["failure"] = failure = baselines.failure(stage, exc)
    if is_out_of_memory(exc) and not out_of_memory(failure["error"], failure["message"]):
        # the device ran out of memory under a wrapper whose first line does not say so (a
        # TorchScript trace's TracingCheckError): the job must still know, to run again alone
        failure["out_of_memory"] = True
    say(f"  {stage} failed: {entry['failure']['error']}: {entry['failure']['message']}")


class _Task:
    """The loaded task and the settings of this job, with its progress log."""

    def __init__(self, checkout, pin_path, settings: dict, contract: dict, say):
        self.settings = settings
        self.contract = official.check_contract(contract, "the survey's kernelbench contract")
        self.device = settings["device"]
        self.seed = contract["seed"] if settings["seed"] is None else settings["seed"]
        self.trial_seeds = official.trial_seeds({**self.contract, "seed": self.seed})
        self.trial_draws: list[list] | None = None
        self.semantics = settings["semantics"]
        self.conv_backends = settings["max_autotune_conv_backends"]
        self.protocol = survey_timing.check_protocol(settings)
        self.pin, self.task = tasks.read_survey_pin(pin_path)
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
            "official": {
                **official.tolerance(self.contract),
                "argument_order": list(self.contract["argument_order"]),
                "trials": len(self.trial_seeds),
                "trial_seeds": self.trial_seeds,
                "contract_commit": self.contract.get("commit"),
            },
        }


class _Mode:
    """One numerics mode of the job: its record, the baselines still ok in it (their timing
    runs) and their forwards."""

    def __init__(self, name: str, record: dict):
        self.name = name
        self.record = record
        self.runs: dict[str, Callable[[], object]] = {}
        self.reference = None
        self.eager_ok = False  # eager's reference and the blind spots ran in this mode
        self.warm_build_s: dict[str, float] = {}  # baselines.warm's seconds, by baseline


class _Subject(NamedTuple):
    """What the baselines of the job are built from: the model, its timing inputs, eager."""

    model: object
    inputs: list
    eager: Callable


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
    """Eager's output in mode `m` on the timing inputs and what is learnt from it; False when
    eager failed. (The blind spots are found with the baselines' checks, in one pass over the
    official trials: `_official`.)"""
    record = m.record
    run = baselines.bind(eager, inputs)
    try:
        m.reference = determinism.seeded_call(run, t.seed)
        record["output"] = correctness.output_stats(m.reference)
    except Exception as exc:  # noqa: BLE001 - the record says eager failed
        _eager_failed(t, record, "build", exc)
        return False
    t.say(f"{m.name}: determinism, flops")
    record["determinism"] = determinism.check(run, t.seed)
    record["flops"] = flops.count(run)
    record["bytes"] = flops.sizes(model, inputs, m.reference)
    return True


def _trial_inputs(t: _Task):
    """(trial seed, inputs on the device) of each official trial, one set on the device at a
    time. Drawn once per job on the CPU, as the evaluator draws them, and kept there."""
    if t.trial_draws is None:
        t.trial_draws = [official.inputs(t.spec.module, s, "cpu") for s in t.trial_seeds]
    for seed, values in zip(t.trial_seeds, t.trial_draws, strict=True):
        yield seed, official.to_device(values, t.device)


class _EagerFailed(Exception):
    """Eager failed on an official trial (or its blind spots could not be found)."""


def _rng_state(device: str) -> tuple:
    """The generators a forward may draw from: the CPU's and, on a GPU, the device's."""
    import torch

    gpu = torch.cuda.get_rng_state(device) if device.startswith("cuda") else None
    return torch.get_rng_state(), gpu


def _set_rng_state(state: tuple, device: str) -> None:
    import torch

    cpu, gpu = state
    torch.set_rng_state(cpu)
    if gpu is not None:
        torch.cuda.set_rng_state(gpu, device)


def _build(t: _Task, model, inputs, names, mode: str) -> dict[str, tuple]:
    """name -> (forward, build_s, mode, None) or (None, None, mode, the exception that
    stopped its build)."""
    builds = {}
    for name in names:
        t.say(f"baseline {name}: build ({mode})")
        try:
            forward, build_s = baselines.build(
                name, model, inputs, t.semantics, _sync(t.device), t.conv_backends
            )
        except Exception as exc:  # noqa: BLE001 - recorded, the survey goes on
            builds[name] = (None, None, mode, exc)
            continue
        t.say(f"baseline {name}: built in {build_s:.2f} s")
        builds[name] = (forward, build_s, mode, None)
    return builds


def _official(
    t: _Task, m: _Mode, eager, inputs, builds: dict[str, tuple], blind_spots: bool
) -> None:
    """One pass over KernelBench's official trials in mode `m`: each trial's inputs moved to the
    device once and eager called once on them, after set_seed(trial seed), as the evaluator
    calls the reference; then the blind spots (with `blind_spots`: does a trivial output pass
    every trial?) and each built baseline against that output, each called as the evaluator
    calls a candidate, right after the reference: with the generators as eager left them
    (restored before each baseline). One trial's outputs at a time are on the device.

    Every baseline stays in `m.runs` to be timed (a failed official check is recorded, not
    hidden: the summary keeps such a baseline out of "best compiled"); one whose build or call
    failed is recorded with that stage. Entries are added to the mode's record in the
    configured order of the baselines. Raises _EagerFailed when eager fails on a trial."""
    entries = m.record.setdefault("baselines", {})
    checks = {}
    for name, (forward, build_s, built_in, exc) in builds.items():
        entry = entries[name] = _baseline_entry()
        entry.update(build_s=build_s, built_in=built_in)
        if forward is None:
            _fail(entry, "build", exc, t.say)
        else:
            checks[name] = (forward, correctness.Comparison(t.contract))
    spots = official.TrivialStatus(t.contract) if blind_spots else None
    failed: dict[str, BaseException] = {}
    for seed, values in _trial_inputs(t):
        try:
            reference = official.reference_call(eager, values, seed)
            if spots is not None:
                spots.add(reference, values)
        except Exception as exc:
            raise _EagerFailed(exc) from exc
        after_eager = _rng_state(t.device)
        for name, (forward, comparison) in checks.items():
            if name in failed:
                continue
            _set_rng_state(after_eager, t.device)
            try:
                comparison.add(reference, forward(*values))
            except Exception as exc:  # noqa: BLE001 - recorded, the survey goes on
                failed[name] = exc
        del reference
    if spots is not None:
        try:
            status = spots.result()
        except Exception as exc:
            raise _EagerFailed(exc) from exc
        m.record["blind_spot"] = status.pop("blind_spot")
        m.record["blind_spots"] = status
    for name, (forward, comparison) in checks.items():
        if name in failed:
            _fail(entries[name], "correctness", failed[name], t.say)
            continue
        entries[name]["correctness"] = comparison.result()
        m.runs[name] = baselines.bind(forward, inputs)
    order = t.settings["baselines"]
    m.record["baselines"] = {n: entries[n] for n in order if n in entries}
    m.runs = {n: m.runs[n] for n in order if n in m.runs}


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


def _profile(t: _Task, m: _Mode) -> list[tuple[dict, profile.Capture]]:
    """Each timed baseline's profiled forwards (the job alone on the GPU), with the record
    entry each is read into (`_read_profiles`, once the job has left the GPU)."""
    captured = []
    for name, run in m.runs.items():
        t.say(f"{m.name}: profile {name}")
        entry = m.record["baselines"][name]
        try:
            captured.append((entry, profile.capture(run, t.device)))
        except Exception as exc:  # noqa: BLE001
            _fail(entry, "profile", exc, t.say)
    return captured


def _read_profiles(t: _Task, captured: list[tuple[dict, profile.Capture]]) -> None:
    for entry, capture in captured:
        try:
            entry["kernels"], entry["timeline"] = profile.read(capture)
        except Exception as exc:  # noqa: BLE001
            _fail(entry, "profile", exc, t.say)


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
    checkout, pin_path, settings: dict, contract: dict, modes: list[str], say=print, lock=None
) -> dict[str, dict]:
    """The `survey_task` records (not written) of the pinned task in `pin_path`, one per
    numerics mode in `modes`, judged by `contract` (a kernelbench_contract record). `lock`:
    the GPU lock (kbfuse.workflow.gpulock), by default the one of the configured device."""
    if not modes:
        raise KbfuseError("a survey job needs at least one numerics mode")
    phase = Phases()
    with phase("load"):
        t = _Task(checkout, pin_path, settings, contract, say)
        say(f"task {t.task} ({t.spec.name}), numerics {modes}, semantics {t.semantics}, {t.device}")
        lock = gpulock.for_device(t.device) if lock is None else lock
        job = {"modes": list(modes), "built_in": None, "rerun_alone": False}
        per_mode = [_Mode(mode, _new_record(t, mode, phase, job)) for mode in modes]
    subject = None
    with lock.shared():
        phase.seconds["wait_shared"] = lock.waited_s
        with phase("reference_and_builds"):
            try:
                subject = _references_and_builds(t, per_mode, job, phase)
                rerun = _out_of_memory(per_mode)
            except Exception as exc:
                if not is_out_of_memory(exc):
                    raise
                rerun = True  # the model or its inputs did not fit on the device
    if not rerun and _autotuned(t):
        _warm_ups(t, per_mode, subject, lock, phase)
        phase.seconds["wait_shared"] = lock.waited_s
    if rerun:
        # Beside other jobs, memory they hold can make a large task fail: once more, alone.
        say("out of memory beside other jobs: the whole task again, alone on the device")
        job.update(built_in=None, rerun_alone=True)
        per_mode = [_Mode(m.name, _new_record(t, m.name, phase, job)) for m in per_mode]
    release_memory()  # what the allocator caches, for the jobs that run meanwhile
    captured = []
    if rerun or any(m.runs for m in per_mode):  # nothing to time: no wait for the device
        waited = lock.waited_s
        with lock.alone():
            phase.seconds["wait_alone"] = lock.waited_s - waited
            if rerun:
                with phase("reference_and_builds"):
                    subject = _references_and_builds(t, per_mode, job, phase)
            captured = _time_and_profile(t, per_mode, phase, subject)
    if captured:
        with phase("profile_read"):  # CPU work: the GPU is the other jobs' meanwhile
            _read_profiles(t, captured)
    for m in per_mode:
        m.record.setdefault("ratios", {})
    return {m.name: m.record for m in per_mode}


def _out_of_memory(per_mode: list[_Mode]) -> bool:
    """Did any baseline of any mode fail for want of device memory?"""
    return any(
        entry["failure"].get("out_of_memory")
        or out_of_memory(entry["failure"]["error"], entry["failure"]["message"])
        for m in per_mode
        for entry in (m.record.get("baselines") or {}).values()
        if entry.get("failure")
    )


def _autotuned(t: _Task) -> list[str]:
    return [n for n in t.settings["baselines"] if n in baselines.AUTOTUNED]


def _alone_builds(t: _Task, m: _Mode, subject: _Subject, phase: Phases) -> None:
    """Build (in mode `m`, the job alone on the GPU) and check the baselines whose build
    benchmarks kernels on the GPU (baselines.AUTOTUNED), beside the mode's other baselines."""
    names = _autotuned(t)
    if not m.eager_ok:
        return
    with baselines.precompile_threads(os.cpu_count() or 1):
        builds = _build(t, subject.model, subject.inputs, names, m.name)
    try:
        with phase("official_trials"):
            _official(t, m, subject.eager, subject.inputs, builds, blind_spots=False)
    except _EagerFailed as failure:  # it ran on these trials before: the baselines' failure
        for name in builds:
            if m.record["baselines"][name]["status"] != "failed":
                _fail(m.record["baselines"][name], "correctness", failure.__cause__, t.say)
    for name in builds:
        m.record["baselines"][name]["warm_build_s"] = m.warm_build_s.get(name)
        m.record["baselines"][name]["conv_backends"] = baselines.conv_backends(t.conv_backends)
    m.record["compile_cache"] = baselines.compile_cache_counts()


def _time_and_profile(
    t: _Task, per_mode: list[_Mode], phase: Phases, subject: _Subject | None
) -> list[tuple[dict, profile.Capture]]:
    """Alone on the GPU: each mode's autotuned builds, timing and profiled forwards; returns
    the profiles captured, to be read after the hold."""
    captured = []
    for m in per_mode:
        set_numerics(m.name)
        if subject is not None and _autotuned(t):
            with phase("alone_builds"):
                _alone_builds(t, m, subject, phase)
        if not m.runs:
            continue
        with phase("timing"):
            _time(t, m)
        if t.settings["profile"]:
            with phase("profile"):
                captured += _profile(t, m)
    return captured


def _references_and_builds(t: _Task, per_mode: list[_Mode], job: dict, phase: Phases) -> _Subject:
    """Sharing the GPU: each mode's eager reference, blind spots, builds and official checks,
    except the baselines built alone (baselines.AUTOTUNED); returns what those are built from."""
    model = official.instance(t.spec.module, t.seed, t.device)
    model = model.train() if t.semantics == "kernelbench" else model.eval()
    inputs = official.inputs(t.spec.module, t.seed, t.device)
    eager = baselines.make("eager", model, inputs, t.semantics)
    here = [n for n in t.settings["baselines"] if n not in baselines.AUTOTUNED]
    shared = [n for n in here if n not in baselines.MODE_BOUND]
    bound = [n for n in here if n in baselines.MODE_BOUND]
    builds = None
    for m in per_mode:
        m.record["inputs"] = tasks.describe_inputs(inputs)
        set_numerics(m.name)
        if not _reference(t, m, eager, model, inputs):
            continue
        if builds is None:  # in the first mode whose eager forward ran
            builds = _build(t, model, inputs, shared, m.name)
            job["built_in"] = m.name
        mode_builds = {**builds, **_build(t, model, inputs, bound, m.name)}
        t.say(f"{m.name}: official trials (blind spots, baselines' correctness)")
        try:
            with phase("official_trials"):
                checked = {n: mode_builds[n] for n in here if n in mode_builds}
                _official(t, m, eager, inputs, checked, blind_spots=True)
        except _EagerFailed as failure:
            _eager_failed(t, m.record, "official trials", failure.__cause__)
            m.runs = {}
            continue
        m.eager_ok = True
        m.record["compile_cache"] = baselines.compile_cache_counts()
    return _Subject(model, inputs, eager)


def _warm_ups(t: _Task, per_mode: list[_Mode], subject: _Subject, lock, phase: Phases) -> None:
    """Each mode's warm-ups (`_warm`) in a shared hold of their own: a job waiting to be alone
    on the GPU waits for the warm-up in progress, not for a whole shared phase with it. Before
    each wait the job returns the allocator's cache: a job alone on the GPU meanwhile may need
    the memory (session 18's task 90 ran out of it there, beside 27 GB one waiting job kept)."""
    for m in per_mode:
        if not m.eager_ok:
            continue
        release_memory()
        with lock.shared():
            set_numerics(m.name)
            with phase("reference_and_builds"), phase("warm_builds"):
                _warm(t, m, subject.model, subject.inputs)


def _warm(t: _Task, m: _Mode, model, inputs) -> None:
    """Warm up (baselines.warm), sharing the GPU, each baseline built alone in mode `m`; a
    warm-up that fails is only said: the build alone records the baseline's failure."""
    for name in _autotuned(t):
        t.say(f"baseline {name}: warm-up build ({m.name})")
        try:
            m.warm_build_s[name] = baselines.warm(
                name, model, inputs, t.semantics, _sync(t.device), t.conv_backends
            )
        except Exception as exc:  # noqa: BLE001 - the build alone meets it again
            t.say(f"baseline {name}: warm-up failed ({type(exc).__name__}: {exc})")
            release_memory()


def run_survey_task(
    checkout, pin_path, settings: dict, contract_path, outs: dict, say=print, lock=None
) -> dict[str, dict]:
    """Run the job for every mode of `outs` ({numerics mode: record path}), judged by the
    kernelbench_contract record at `contract_path`, and write the records once all of them
    are valid."""
    start = time.perf_counter()
    contract = read_contract_record(contract_path)
    made = survey_task(checkout, pin_path, settings, contract, list(outs), say, lock)
    made = {mode: jsonable(record) for mode, record in made.items()}
    for mode, record in made.items():
        records.validate_record(record, KIND, str(outs[mode]))
    for mode, record in made.items():
        write_json(outs[mode], record)
    say(f"wrote {len(made)} records ({', '.join(map(str, outs.values()))}) in "
        f"{time.perf_counter() - start:.1f} s")  # fmt: skip
    return made
