"""One survey job: one task, one numerics mode, one `survey_task` record.

`run_survey_task` loads the pinned task (its sha256 re-checked), seeds and instantiates it as
KernelBench does, puts the numerics mode in force, then, in order: eager's reference output
and its statistics, the determinism check, FLOPs and bytes, the blind spots, each configured
baseline (build, correctness against eager), the timing of every baseline that passed those
stages, their kernel profiles, the ratios. A baseline failing at any stage is recorded with
that stage and the job goes on; if eager itself fails, the record says so and holds no
measurement. The record is validated against its schema before it is written (atomically),
so a record on disk always follows the contract. Progress lines go to `log` (the job log).
"""

from __future__ import annotations

import contextlib
import os
import platform
import time
from collections.abc import Callable
from pathlib import Path

from kbfuse.errors import KbfuseError
from kbfuse.io import jsonable, read_json, write_json
from kbfuse.results import records
from kbfuse.survey import baselines, blindspots, correctness, determinism, flops, profile, tasks
from kbfuse.survey import timing as survey_timing
from kbfuse.survey.settings import set_numerics
from kbfuse.tasks.kernelbench import load_task, read_pin

KIND = "survey_task"
SCHEMA_VERSION = 1


def share_compile_caches(root) -> dict:
    """Point Inductor's and Triton's on-disk caches at one folder under `root`, shared by every
    survey job (an FX graph or Triton kernel compiled once serves all later jobs and reruns).
    Call before torch is imported; variables already set are left alone."""
    root = Path(root).resolve()
    paths = {"TORCHINDUCTOR_CACHE_DIR": root / "inductor", "TRITON_CACHE_DIR": root / "triton"}
    for key, path in paths.items():
        path.mkdir(parents=True, exist_ok=True)
        os.environ.setdefault(key, str(path))
    return {key: os.environ[key] for key in paths}


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

    def __init__(self, checkout, pin_path, settings: dict, mode: str, say):
        self.settings = settings
        self.mode = mode
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


def _measure_baselines(t: _Task, model, inputs, reference) -> tuple[dict, dict]:
    """(entries per baseline, runs of those still ok)."""
    entries, runs = {}, {}
    for name in t.settings["baselines"]:
        entry = entries[name] = _baseline_entry()
        t.say(f"baseline {name}: build")
        try:
            run, entry["build_s"] = baselines.build(
                name, model, inputs, t.semantics, _sync(t.device)
            )
        except Exception as exc:  # noqa: BLE001 - recorded, the survey goes on
            _fail(entry, "build", exc, t.say)
            continue
        t.say(f"baseline {name}: built in {entry['build_s']:.2f} s; correctness")
        try:
            entry["correctness"] = correctness.compare(
                reference, determinism.seeded_call(run, t.seed)
            )
        except Exception as exc:  # noqa: BLE001
            _fail(entry, "correctness", exc, t.say)
            continue
        runs[name] = run
    return entries, runs


def _time(t: _Task, entries: dict, runs: dict) -> dict:
    """Time every baseline still ok; returns the ratios. A baseline failing here is marked."""
    label = f"survey/{t.task}/{t.mode}/{t.semantics}"
    t.say(f"timing {list(runs)} ({survey_timing.methods(t.device, t.settings['cold_l2'])})")
    timing, ratios, failures = survey_timing.time_baselines(
        runs, t.protocol, t.device, t.settings["cold_l2"], label, t.say
    )
    for name, figures in timing.items():
        if name in failures:
            entries[name].update(status="failed", failure=failures[name])
            runs.pop(name)
        else:
            entries[name]["timing"] = figures
    return ratios


def _profile(t: _Task, entries: dict, runs: dict) -> None:
    for name, run in runs.items():
        t.say(f"profile {name}")
        try:
            entries[name]["kernels"] = profile.kernels(run, t.device)
        except Exception as exc:  # noqa: BLE001
            _fail(entries[name], "profile", exc, t.say)


class Phases:
    """Seconds spent in each phase of the job (the record's `phases_s`)."""

    def __init__(self):
        self.seconds: dict[str, float] = {}

    @contextlib.contextmanager
    def __call__(self, name: str):
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start


def _eager_failed(t: _Task, record: dict, stage: str, exc: BaseException) -> dict:
    entries = {name: _baseline_entry() for name in t.settings["baselines"]}
    for entry in entries.values():
        _fail(entry, stage, exc, t.say)
    record.update(
        output=None, determinism=None, flops=None, bytes=None, blind_spots=None,
        blind_spot=False, baselines=entries, ratios={},
    )  # fmt: skip
    return record


def survey_task(checkout, pin_path, settings: dict, mode: str, say=print, precompiled=None):
    """The `survey_task` record of the pinned task in `pin_path` (not written).

    `precompiled`: the survey_compile record of this task and mode, when a separate job
    compiled its Inductor baselines first (its cold build times are kept in the record)."""
    phase = Phases()
    with phase("load"):
        t = _Task(checkout, pin_path, settings, mode, say)
        say(f"task {t.task} ({t.spec.name}), numerics {mode}, semantics {t.semantics}, {t.device}")
        record = t.header()
        record["numerics"] = set_numerics(mode)
        record["device"] = t.device
        record["environment"] = environment(t.device)
        record["timing_protocol"] = {
            **t.protocol,
            "methods": survey_timing.methods(t.device, settings["cold_l2"]),
        }
        record["precompiled"] = precompiled_builds(precompiled)
        record["phases_s"] = phase.seconds
        model, inputs = tasks.instantiate(t.spec, t.seed, t.semantics, t.device)
        record["inputs"] = tasks.describe_inputs(inputs)
    with phase("reference"):
        eager = baselines.make("eager", model, inputs, t.semantics)
        try:
            reference = determinism.seeded_call(eager, t.seed)
            record["output"] = correctness.output_stats(reference)
        except Exception as exc:  # noqa: BLE001 - the record says eager failed
            return _eager_failed(t, record, "build", exc)
        say("determinism, flops, blind spots")
        record["determinism"] = determinism.check(eager, t.seed)
        record["flops"] = flops.count(eager)
        record["bytes"] = flops.sizes(model, inputs, reference)
        record["blind_spots"] = blindspots.check(reference, inputs)
        record["blind_spot"] = blindspots.any_passes(record["blind_spots"])
    with phase("baselines"):
        entries, runs = _measure_baselines(t, model, inputs, reference)
    record["baselines"] = entries
    record["compile_cache"] = baselines.compile_cache_counts()
    with phase("timing"):
        record["ratios"] = _time(t, entries, runs) if runs else {}
    if settings["profile"]:
        with phase("profile"):
            _profile(t, entries, runs)
    return record


def precompiled_builds(precompiled: dict | None) -> dict | None:
    """baseline -> {status, build_s} of the compile job, or None when none ran first."""
    if precompiled is None:
        return None
    return {
        name: {"status": entry["status"], "build_s": entry["build_s"]}
        for name, entry in precompiled["baselines"].items()
    }


def run_survey_task(
    checkout, pin_path, settings: dict, mode: str, out, say=print, precompiled=None
) -> dict:
    """Run the job and write its validated record to `out`; `precompiled`: the path of the
    survey_compile record of this task and mode, if a compile job ran first."""
    start = time.perf_counter()
    compiled = read_json(precompiled) if precompiled is not None else None
    record = jsonable(survey_task(checkout, pin_path, settings, mode, say, compiled))
    records.validate_record(record, KIND, str(out))
    write_json(out, record)
    say(f"wrote {out} in {time.perf_counter() - start:.1f} s")
    return record
