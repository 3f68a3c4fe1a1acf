"""The correctness gate of the timing stages: only what passed correctness is timed.

Every implementation a timing stage (timing, controls) would time is gated on its own
correctness record, read and checked before any GPU work: a variant on
results/correctness/{task}/{variant}.json (`gate`: a record of kind "correctness" for that
variant, task and artifact sha256, with `passed` true and no failing checks), TorchScript and
Inductor on the task's baselines.json (`gate_baselines`); eager is the reference every check
compares with, so it is always timed. What fails gets a `skipped` entry naming the reason and
the failing checks, and is never loaded. Records are untrusted: a missing, unreadable or
malformed one is a reason to skip, never an error.

`TimedTask` is what a timing stage reads for one task: the task at the pin and the gate's
inputs.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kbfuse.errors import KbfuseError
from kbfuse.io import read_json
from kbfuse.stage import read_compile_metas
from kbfuse.tasks import baselines as baseline_builders

BASELINES = baseline_builders.IMPLEMENTATIONS  # eager, TorchScript, Inductor (and max-autotune)


def gate(
    correctness_records: Mapping[str, Any],
    task: int | None = None,
    artifact_sha256: Mapping[str, str] | None = None,
) -> tuple[list[str], dict[str, dict]]:
    """Split variants into (eligible, skipped) by their correctness records.

    A record value is the parsed JSON dict, None when the file is missing, or the exception
    raised while reading it. Eligible: a well-formed correctness record for that variant (and
    task and artifact, when given) with `passed` true and no failing checks. Everything else
    is skipped with {reason, failing_checks}; eligible keeps the input order.
    """
    eligible: list[str] = []
    skipped: dict[str, dict] = {}
    for variant, record in correctness_records.items():
        reason, failing = _gate_one(variant, record, task, (artifact_sha256 or {}).get(variant))
        if reason is None:
            eligible.append(variant)
        else:
            skipped[variant] = {"reason": reason, "failing_checks": failing}
    return eligible, skipped


def _malformed_result(result: Mapping) -> str | None:
    """Why a correctness result's passed/failing_checks cannot be trusted, or None."""
    passed = result.get("passed")
    failing = result.get("failing_checks")
    if not isinstance(passed, bool):
        return f"corrupt correctness record: passed is {passed!r}, not a boolean"
    if not isinstance(failing, list) or not all(isinstance(c, str) for c in failing):
        return f"corrupt correctness record: failing_checks is {failing!r}"
    return None


def _verdict(result: Mapping) -> tuple[str | None, list[str]]:
    """(None, []) for a passing well-formed result; (reason, failing checks) otherwise."""
    malformed = _malformed_result(result)
    if malformed:
        return malformed, []
    failing = list(result["failing_checks"])
    if not result["passed"]:
        return f"failed correctness (official predicate): {len(failing)} failing check(s)", failing
    if failing:
        return "corrupt correctness record: passed is true but failing_checks is not empty", failing
    return None, []


def _record_problem(record: Any, kind: str, task: int | None) -> str | None:
    """Why a correctness record file cannot be used at all, or None."""
    if record is None:
        return "no correctness record"
    if isinstance(record, BaseException):
        return f"unreadable correctness record: {record}"
    if not isinstance(record, Mapping):
        return f"corrupt correctness record: not a JSON object ({type(record).__name__})"
    if record.get("kind") != kind:
        return f"corrupt correctness record: kind is {record.get('kind')!r}"
    return _task_problem(record, task)


def _task_problem(record: Mapping, task: int | None) -> str | None:
    if task is not None and record.get("task") != task:
        return f"correctness record is for task {record.get('task')!r}, not {task}"
    return None


def _gate_one(
    variant: str, record: Any, task: int | None, artifact: str | None
) -> tuple[str | None, list[str]]:
    problem = _record_problem(record, "correctness", None)
    if problem is None:
        problem = _malformed_result(record)
    if problem:
        return problem, []
    if record.get("implementation") != variant:
        return (
            f"correctness record is for implementation {record.get('implementation')!r}, "
            f"not {variant!r}",
            [],
        )
    problem = _task_problem(record, task)
    if problem:
        return problem, []
    checked = (record.get("provenance") or {}).get("artifact_sha256")
    if artifact is not None and checked != artifact:
        return (
            f"correctness was checked on artifact {checked!r}, but the artifact to time "
            f"has sha256 {artifact}",
            [],
        )
    return _verdict(record)


def gate_baselines(
    record: Any, baseline_names: Sequence[str], task: int | None = None
) -> tuple[list[str], dict[str, dict]]:
    """Split baselines into (eligible, skipped) by the task's baselines correctness record
    (results/correctness/{task}/baselines.json, `run_baselines`). Eager is the reference every
    check compares with, so it is always eligible; every compiled baseline needs a passing
    result in the record, like a variant."""
    eligible: list[str] = []
    skipped: dict[str, dict] = {}
    problem = _record_problem(record, "correctness_baselines", task)
    results = {} if problem else record.get("implementations")
    if not problem and not isinstance(results, Mapping):
        problem = f"corrupt correctness record: implementations is {results!r}"
    for name in baseline_names:
        if name == "eager":
            eligible.append(name)
            continue
        reason, failing = problem, []
        if reason is None:
            result = results.get(name)
            if not isinstance(result, Mapping):
                reason = f"no correctness result for baseline {name!r}"
            else:
                reason, failing = _verdict(result)
        if reason is None:
            eligible.append(name)
        else:
            skipped[name] = {"reason": reason, "failing_checks": failing}
    return eligible, skipped


def read_record(path: str | os.PathLike | None) -> Any:
    """The parsed JSON of a record file, None when missing, or the exception reading it."""
    if path is None or not Path(path).is_file():
        return None
    try:
        return read_json(path)
    except (OSError, ValueError) as exc:
        return KbfuseError(f"{path}: {exc}")


def read_correctness_records(paths: Mapping[str, str | os.PathLike | None]) -> dict[str, Any]:
    """Variant -> parsed record, None (missing file) or the exception raised reading it."""
    return {variant: read_record(path) for variant, path in paths.items()}


def check_names(baseline_names: Sequence[str], variant_names: Sequence[str]) -> list[str]:
    """Baselines known and unrepeated, no variant named like a baseline; returns the baselines."""
    baseline_names = list(baseline_names)
    unknown = [name for name in baseline_names if name not in BASELINES]
    if unknown:
        raise KbfuseError(f"baselines {unknown} are unknown; known baselines: {list(BASELINES)}")
    if len(set(baseline_names)) != len(baseline_names):
        raise KbfuseError(f"baselines {baseline_names} name a baseline more than once")
    clashes = sorted(set(baseline_names) & set(variant_names))
    if clashes:
        raise KbfuseError(f"variant name(s) {clashes} clash with baseline names")
    return baseline_names


def gate_variants(
    task: int,
    variants: Mapping[str, tuple],
    correctness: Mapping[str, str | os.PathLike],
    metas: Mapping[str, dict],
) -> tuple[list[str], dict[str, dict]]:
    """Gate every variant on its correctness record for `task` and its artifact hash."""
    records = read_correctness_records({v: correctness.get(v) for v in variants})
    artifacts = {v: metas[v]["artifact_sha256"] for v in variants}
    return gate(records, task=task, artifact_sha256=artifacts)


def gate_implementations(
    task: int,
    variants: Mapping[str, tuple],
    correctness: Mapping[str, str | os.PathLike],
    baselines_record: str | os.PathLike,
    baselines: Sequence[str],
    say: Callable[[str], None],
) -> dict:
    """Everything the timing stages gate on, read and checked before any GPU work:
    {baselines, variants (the eligible ones, config order), skipped, metas}."""
    baseline_names = check_names(baselines, list(variants))
    metas = read_compile_metas(variants)
    timed_baselines, skipped = gate_baselines(read_record(baselines_record), baseline_names, task)
    eligible, skipped_variants = gate_variants(task, variants, correctness, metas)
    skipped.update(skipped_variants)
    for name, entry in skipped.items():
        say(f"task {task}: {name} not timed: {entry['reason']} {entry['failing_checks']}")
    return {
        "baselines": timed_baselines,
        "variants": eligible,
        "skipped": skipped,
        "metas": metas,
    }


@dataclass(frozen=True)
class TimedTask:
    """What a timed stage (timing, controls) reads for one task: the task at the pin (`task`,
    the KernelBench `checkout`, the pin record at `pin_path`) and what decides which
    implementations it may time (kbfuse.timing.gate): the compiled `variants` (name ->
    (artifact, meta path), in config order), their `correctness` records (name -> path), the
    task's `baselines_record` (results/correctness/{task}/baselines.json) and the configured
    `baselines`."""

    task: int
    variants: Mapping[str, tuple]
    correctness: Mapping[str, str | os.PathLike]
    baselines_record: str | os.PathLike
    checkout: str | os.PathLike
    pin_path: str | os.PathLike
    baselines: Sequence[str]
    # The study's numerics mode (kbfuse.tasks.baselines.set_numerics; None: strict FP32 as the
    # first study records it).
    numerics: str | None = None

    @classmethod
    def of_job(cls, job: Any) -> TimedTask:
        """The TimedTask of a `timing` or `controls` Snakemake job (the `snakemake` object of
        its script), whose rules share these params and inputs (workflow/rules/timing.smk,
        controls.smk)."""
        return cls(
            task=int(job.wildcards.task),
            variants=job.params.artifacts,
            correctness=job.params.correctness,
            baselines_record=job.input.baselines,
            checkout=job.input.checkout,
            pin_path=job.input.pin,
            baselines=job.params.baselines,
            numerics=getattr(job.params, "numerics", None),
        )

    def gate(self, say: Callable[[str], None]) -> dict:
        """`gate_implementations` for this task (nothing loaded yet)."""
        return gate_implementations(
            self.task, self.variants, self.correctness, self.baselines_record, self.baselines, say
        )

    def load(self) -> tuple[Any, Any, dict]:
        """(spec, tail, numerics): the pinned task file loaded, its fused tail, and the
        numerics settings in force for timing (kbfuse.tasks.baselines.set_numerics)."""
        from kbfuse.tasks import kernelbench, tails

        spec = kernelbench.load_task(self.checkout, kernelbench.read_pin(self.pin_path), self.task)
        numerics = baseline_builders.set_numerics(self.numerics)
        return spec, tails.tail_for(self.task), numerics
