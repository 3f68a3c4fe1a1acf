"""The result files of one run, read, validated and checked against each other.

`load_results` reads every record the config implies (`kbfuse.layout.result_paths`), each
validated against the JSON Schema of its kind, into a `StudyResults`. Before any table is
built the inputs are checked against each other: every artifact sha256 recorded by verify,
correctness, timing and controls must be the one in the current compile metadata, and every
pin commit and task sha256 the one in the current KernelBench pin record; the official
contract (kernelbench_contract) must be read at the pinned commit, and every record that
judged with a tolerance (correctness, the baselines' correctness, controls, the direction
witness) must name the contract's. A mismatch means a result was produced from something that
no longer exists (stale) or was edited (tampered), and is refused.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kbfuse.errors import KbfuseError
from kbfuse.layout import result_paths
from kbfuse.results.records import inside, parse_json, read_limited, validate_record
from kbfuse.tasks.registry import BASELINES, WITNESS_TASK

SCHEMA_VERSION = 1
# The baselines a timing record may name beside the variants (kbfuse.tasks.baselines, no torch).
BASELINE_IMPLS = BASELINES


@dataclass
class StudyResults:
    """The parsed result files of one run, plus where each came from (for messages)."""

    config: Mapping[str, Any]
    root: Path
    pin: dict
    fingerprint: dict
    contract: dict
    compile_meta: dict[str, dict] = field(default_factory=dict)
    verify: dict[str, dict] = field(default_factory=dict)
    correctness: dict[tuple[int, str], dict] = field(default_factory=dict)
    baselines: dict[int, dict] = field(default_factory=dict)
    timing: dict[int, dict] = field(default_factory=dict)
    controls: dict[int, dict] = field(default_factory=dict)
    witness81: dict | None = None
    margin_audit: dict = field(default_factory=dict)
    direction_witness: dict = field(default_factory=dict)
    paths: dict[tuple, Path] = field(default_factory=dict)
    # The survey's rows of the study's tasks in its numerics mode (the second study only:
    # config `survey_summary`; kbfuse.results.prediction).
    survey: dict[int, dict] = field(default_factory=dict)

    @property
    def tasks(self) -> list[int]:
        return list(self.config["tasks"])

    @property
    def variants(self) -> list[str]:
        return list(self.config["variants"])


def read_result(path: Path, kind: str) -> dict:
    if not path.is_file():
        raise KbfuseError(f"summary input {path} is missing")
    data = parse_json(read_limited(path), f"summary input {path}")
    if not isinstance(data, dict):
        raise KbfuseError(f"summary input {path}: expected a JSON object")
    if data.get("kind") != kind:
        raise KbfuseError(f"{path}: field kind is {data.get('kind')!r}, expected {kind!r}")
    if data.get("schema_version") != SCHEMA_VERSION:
        raise KbfuseError(
            f"{path}: field schema_version is {data.get('schema_version')!r}, "
            f"expected {SCHEMA_VERSION}"
        )
    validate_record(data, kind, str(path))  # strict types, finite times, counts
    return data


# Record kind -> the StudyResults field holding its records by variant, task or (task, variant).
_BY_TASK_OR_VARIANT = {
    "compile": "compile_meta",
    "verify": "verify",
    "correctness": "correctness",
    "correctness_baselines": "baselines",
    "timing": "timing",
    "controls": "controls",
}


def load_results(results_dir: str | Path, config: Mapping[str, Any]) -> StudyResults:
    """Read every result file the config implies and check their provenance."""
    root = Path(results_dir)
    loaded: dict[tuple, dict] = {}
    paths: dict[tuple, Path] = {}
    for key, rel in result_paths(config).items():
        paths[key] = inside(root, rel)
        loaded[key] = read_result(paths[key], key[0])
    res = StudyResults(
        config=config,
        root=root,
        pin=loaded[("kernelbench_pin",)],
        fingerprint=loaded[("env",)],
        contract=loaded[("kernelbench_contract",)],
        witness81=loaded.get(("witness81",)),
        margin_audit=loaded[("margin_audit",)],
        direction_witness=loaded[("direction_witness",)],
        paths=paths,
    )
    for (kind, *where), data in loaded.items():
        if kind in _BY_TASK_OR_VARIANT:
            key = tuple(where) if len(where) > 1 else where[0]
            getattr(res, _BY_TASK_OR_VARIANT[kind])[key] = data
    check_provenance(res)
    if ("survey_rows",) in loaded:
        res.survey = survey_rows_of(res, loaded[("survey_rows",)])
    return res


def survey_rows_of(res: StudyResults, record: Mapping[str, Any]) -> dict[int, dict]:
    """The survey rows of a study's `survey_rows` record, checked against its config: a row
    for every task, in the mode the config runs it in (else stale)."""
    from kbfuse.workflow.studies import numerics_for

    path = res.paths[("survey_rows",)]
    rows = record_field(record, "rows", path)
    found = {}
    for task in res.tasks:
        row = record_field(record, f"rows.{task}", path)
        mode = numerics_for(res.config, task) or "strict"
        _expect(path, f"rows.{task}.numerics", row.get("numerics"), mode, "the config")
        found[int(task)] = row
    extra = sorted(set(rows) - {str(t) for t in res.tasks})
    if extra:
        raise KbfuseError(f"{path}: field rows names tasks {extra} the config does not run")
    return found


# ---------------------------------------------------------------- provenance


def record_field(data: Mapping, dotted: str, path: Path) -> Any:
    node: Any = data
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            raise KbfuseError(f"{path}: field {dotted} is missing")
        node = node[part]
    return node


def _expect(path: Path, dotted: str, recorded: Any, current: Any, source: str) -> None:
    if recorded != current:
        raise KbfuseError(
            f"{path}: field {dotted} is {recorded!r} but {source} says {current!r} "
            "(stale or tampered input)"
        )


def check_provenance(res: StudyResults) -> None:
    """Every recorded artifact sha256 / pin commit / task sha256 must match the current ones."""
    pin_path = res.paths[("kernelbench_pin",)]
    pin_commit = record_field(res.pin, "commit", pin_path)
    _expect(pin_path, "commit", pin_commit, res.config["kernelbench"]["commit"], "the config")
    pin_tasks = record_field(res.pin, "tasks", pin_path)

    def task_sha(task: int) -> str:
        if str(task) not in pin_tasks:
            raise KbfuseError(f"{pin_path}: field tasks.{task} is missing")
        return pin_tasks[str(task)]["sha256"]

    check_tolerances(res, pin_commit)
    artifacts: dict[str, str] = {}
    for v, meta in res.compile_meta.items():
        path = res.paths[("compile", v)]
        _expect(path, "variant", record_field(meta, "variant", path), v, "its path")
        artifacts[v] = record_field(meta, "artifact_sha256", path)

    def artifact(path: Path, dotted: str, variant: str, recorded: str) -> None:
        if variant not in artifacts:
            raise KbfuseError(f"{path}: field {dotted} names variant {variant!r}, not in config")
        meta_path = res.paths[("compile", variant)]
        _expect(path, dotted, recorded, artifacts[variant], str(meta_path))

    for v, ver in res.verify.items():
        path = res.paths[("verify", v)]
        _expect(path, "variant", record_field(ver, "variant", path), v, "its path")
        artifact(path, "artifact_sha256", v, record_field(ver, "artifact_sha256", path))

    def pin_fields(data: dict, path: Path, task: int) -> None:
        recorded = record_field(data, "provenance.pin_commit", path)
        _expect(path, "provenance.pin_commit", recorded, pin_commit, str(pin_path))
        recorded = record_field(data, "provenance.task_sha256", path)
        _expect(
            path, "provenance.task_sha256", recorded, task_sha(task), f"{pin_path} tasks.{task}"
        )

    def artifact_map(data: dict, path: Path, required: Iterable[str]) -> None:
        recorded = record_field(data, "provenance.artifacts", path)
        for v in required:
            if v not in recorded:
                raise KbfuseError(f"{path}: field provenance.artifacts.{v} is missing")
        for v, sha in recorded.items():
            artifact(path, f"provenance.artifacts.{v}", v, sha)

    for (task, v), corr in res.correctness.items():
        path = res.paths[("correctness", task, v)]
        _expect(path, "task", record_field(corr, "task", path), task, "its path")
        _expect(path, "implementation", record_field(corr, "implementation", path), v, "its path")
        artifact(
            path,
            "provenance.artifact_sha256",
            v,
            record_field(corr, "provenance.artifact_sha256", path),
        )
        pin_fields(corr, path, task)
    for task, base in res.baselines.items():
        path = res.paths[("correctness_baselines", task)]
        _expect(path, "task", record_field(base, "task", path), task, "its path")
        pin_fields(base, path, task)
    for task, tim in res.timing.items():
        path = res.paths[("timing", task)]
        _expect(path, "task", record_field(tim, "task", path), task, "its path")
        pin_fields(tim, path, task)
        timed_variants = [i for i in record_field(tim, "timed", path) if i not in BASELINE_IMPLS]
        artifact_map(tim, path, timed_variants)
        # A baseline that failed correctness is skipped too (gated out of the timing).
        skipped = [i for i in record_field(tim, "skipped", path) if i not in BASELINE_IMPLS]
        accounted = set(timed_variants) | set(skipped)
        if accounted != set(res.variants):
            raise KbfuseError(
                f"{path}: fields timed + skipped cover variants {sorted(accounted)}, "
                f"the config has {sorted(res.variants)} (stale input)"
            )
    for task, ctl in res.controls.items():
        path = res.paths[("controls", task)]
        _expect(path, "task", record_field(ctl, "task", path), task, "its path")
        pin_fields(ctl, path, task)
        artifact_map(ctl, path, control_variants(ctl))
    if res.witness81 is not None:
        path = res.paths[("witness81",)]
        pin_fields(res.witness81, path, WITNESS_TASK)
        artifact_map(res.witness81, path, record_field(res.witness81, "variants", path))


def check_tolerances(res: StudyResults, pin_commit: str) -> None:
    """The contract is the pinned evaluator's, and every record judged with its tolerance."""
    path = res.paths[("kernelbench_contract",)]
    _expect(path, "commit", record_field(res.contract, "commit", path), pin_commit, "the pin")
    official = {"atol": res.contract["atol"], "rtol": res.contract["rtol"]}
    judged = [
        *((res.paths[("correctness", *key)], rec) for key, rec in res.correctness.items()),
        *((res.paths[("correctness_baselines", t)], rec) for t, rec in res.baselines.items()),
        *((res.paths[("controls", t)], rec) for t, rec in res.controls.items()),
    ]
    for where, rec in judged:
        _expect(where, "tolerance", record_field(rec, "tolerance", where), official, str(path))
    witness = res.paths[("direction_witness",)]
    recorded = {k: record_field(res.direction_witness, k, witness) for k in ("atol", "rtol")}
    _expect(witness, "atol, rtol", recorded, official, str(path))


def control_variants(ctl: Mapping) -> list[str]:
    used = list(ctl.get("tiny_values", {}))
    for pair in ctl.get("ftz_cost", {}).values():
        used += [pair["ftz_on"], pair["ftz_off"]]
    for per_impl in ctl.get("small_shape", {}).get("measurements", {}).values():
        used += [i for i in per_impl if i not in BASELINE_IMPLS]
    return sorted(set(used))
