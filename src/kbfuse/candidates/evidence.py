"""What a check's children left, read and compared by the parent, and the verdict record.

Who says what (docs/check.md):

- the parent decides what is compared. It planned the cases (kbfuse.candidates.reference.
  build_cases on the settings) and compares every one of them, and the output after the
  timed region, with the reference: an output the candidate's process did not leave is a
  failing case ("no output") once that process ended without a failure, whatever its report
  says it ran. Only the changed-weights case may be skipped, when the candidate's report says
  its parameters are named differently from the task Model's (it is then `not_applicable`);
- the candidate's process reports, in runner.json, its builds and their flags, its guards'
  findings, its baselines and the timing. That report is *self-reported*: the record names
  those fields and checks (`self_reported`). It is read within bounds and checked against its
  schema (`check_candidate.json#/$defs/runner`); a report that is missing, unreadable or
  malformed fails the candidate's `build` check (it is not used at all);
- every tensor is read back within bounds (kbfuse.candidates.readback): the parent holds one
  case's tensors at a time and keeps fingerprints for the caching check.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from kbfuse import untrusted
from kbfuse.candidates import compare, flags, readback, switches, verdict
from kbfuse.candidates.reference import AFTER_TIMING, TIMING_CASE
from kbfuse.candidates.sandbox import Outcome
from kbfuse.errors import KbfuseError
from kbfuse.io import sha256_file

NO_OUTPUT = "no output"
MAX_WITNESS_BUILDS = 8  # distinct flag sets measured by the witness
OUTPUT_SLACK_BYTES = 1 << 20  # an output file may exceed twice its reference by this much
# The fields of the record and the checks that come from the candidate's own report.
SELF_REPORTED = {
    "fields": [
        "failure",
        "guards",
        "baselines",
        "timing",
        "speedup",
        "stage_s",
        "contract.builds",
        "contract.ninja",
        "contract.witness",
        "correctness.skipped_cases",
        "correctness.inputs_differ",
    ],
    "checks": ["build", "runtime_error", *verdict.GUARD_CHECKS],
}


@dataclass
class Evidence:
    """What the three children left behind, read back by the parent."""

    info: dict  # reference.json: output shape, trivial-candidate status
    cases: list[dict]  # the planned cases (with the reference's changed parameter names)
    outcome: Outcome  # the candidate process
    runner: dict  # its usable report ({} when there is none)
    report_problem: str | None  # why there is no usable report
    witness: list[dict] | None
    witness_outcome: Outcome | None
    correctness: dict
    # wall seconds of each step of the parent: reference, candidate, witness, compare
    phases_s: dict = field(default_factory=dict)
    # of those, the seconds waited for the GPU lock ({} without a lock that counts them)
    lock_wait_s: dict = field(default_factory=dict)


def read_report(path: Path, folder: Path) -> tuple[dict, str | None]:
    """The candidate's report (runner.json in its `folder`) and None, or {} and why it is
    unusable: missing, unreadable, against its schema, or with timing samples that do not
    pair per round."""
    data, problem = readback.read_json_or_none(path, folder)
    if problem is not None:
        return {}, problem
    problem = verdict.runner_problem(data)
    if problem is None:
        try:
            verdict.speedups(data.get("timing"))
        except KbfuseError as exc:
            problem = f"its timing does not pair: {exc}"
    return ({}, problem) if problem is not None else (data, None)


def witness_builds(runner: dict) -> list[dict]:
    """Distinct flag sets to measure: torch builds by their extra_cuda_cflags, CuPy by
    options (whatever the candidate compiled; each set once; at most MAX_WITNESS_BUILDS)."""
    seen, builds = set(), []
    for build in runner.get("builds") or []:
        if build["route"].startswith("cupy"):
            item = {"route": "cupy", "options": build.get("options", [])}
        else:
            item = {"route": "load_inline", "flags": build.get("extra_cuda_cflags", [])}
        key = json.dumps(item, sort_keys=True)
        if key not in seen and len(builds) < MAX_WITNESS_BUILDS:
            seen.add(key)
            builds.append(item)
    return builds


def contract(runner: dict, witness: list[dict] | None) -> dict:
    builds = runner.get("builds") or []
    ninja = runner.get("ninja") or []
    device_flags: list[str] = []
    host_flags: list[str] = []
    for build in ninja:
        device_flags += build["cuda_flags"]
        host_flags += build["host_flags"]
    for build in builds:
        if build["route"].startswith("cupy"):
            device_flags += build["options"] + build["implicit_options"]
        elif not ninja:
            device_flags += build["extra_cuda_cflags"]
            host_flags += build["extra_cflags"]
    routes = sorted({b["route"] for b in builds} | ({"triton"} if runner.get("triton") else set()))
    measured = [w["effective_ftz"] for w in witness or [] if w["effective_ftz"] is not None]
    return {
        "routes": routes,
        "builds": builds,
        "ninja": ninja,
        "implies": flags.implications(device_flags, host_flags),
        "witness": witness,
        "effective_ftz": any(measured) if measured else None,
    }


def output_limit(ref_out: Path, cases: list[dict]) -> int:
    """Bytes an output file of the candidate may have: twice the largest reference output
    file, and OUTPUT_SLACK_BYTES (a wrong shape is a failing case, not a refusal to read)."""
    sizes = [(ref_out / "reference" / f"{c['name']}.pt").stat().st_size for c in cases]
    return 2 * max(sizes, default=0) + OUTPUT_SLACK_BYTES


def _compare_one(
    reference, path: Path, folder: Path, contract: Mapping, limit: int, device: str = "cpu",
    hold=contextlib.nullcontext,
):  # fmt: skip
    """A case record and the output's fingerprint; a missing or unreadable output is a
    failing case naming why. The output is read and fingerprinted outside `hold`."""
    numel = int(reference.numel())
    if not os.path.lexists(path):
        return {"numel": numel, "problem": NO_OUTPUT, "official_pass": False}, None
    try:
        output = readback.load_tensors(path, folder, limit)
    except KbfuseError as exc:
        return {"numel": numel, "problem": f"output not read: {exc}", "official_pass": False}, None
    return compare_on(device, reference, output, contract, hold), compare.fingerprint(output)


def compare_on(device: str, reference, output, contract: Mapping, hold=contextlib.nullcontext):
    """compare.compare_case on `device`, holding `hold()` (the GPU lock, shared) while it uses
    the device; on the CPU, outside the hold, where the device has no memory left for the
    case (other jobs hold it): the same figures, only slower."""
    import torch

    with hold():
        try:
            return compare.compare_case(reference, output, contract, device)
        except torch.OutOfMemoryError:
            if device == "cpu":
                raise
        finally:
            if device == "cuda":  # the parent keeps no device memory between its cases
                torch.cuda.empty_cache()
    return compare.compare_case(reference, output, contract, "cpu")


def compare_all(
    cases: list[dict],
    reference_folder: Path,
    candidate_folder: Path,
    contract: Mapping,
    reference_limit: int,
    expected: bool,
    skipped: dict[str, str] | None = None,
    device: str = "cpu",
    hold=contextlib.nullcontext,
) -> dict:
    """Every planned case (and the output after timing, on official_0's reference) compared
    with the reference under the official check of `contract` (kbfuse.checks.official: the
    pinned tolerance and argument order), one case at a time; the
    tensors are under out/reference/ and out/outputs/ of the two children's folders.
    `expected`: the candidate's process ended without a failure, so a missing output is a
    failing case; otherwise a case without an output is left out (its check is `not_run`; the
    failure already fails the verdict). `skipped`: the cases its report says it skipped
    (only `weights` may be). `device`: where the tensors are compared
    (kbfuse.candidates.compare). `hold`: what is held while a case is compared there (the
    GPU lock, shared), case by case: reading and fingerprinting the files is done outside
    it, so that a job waiting to have the device alone waits for one case's comparison."""
    import torch

    from kbfuse.checks import official

    skipped = {k: v for k, v in (skipped or {}).items() if k == "weights"}
    ref_out, cand_out = reference_folder / "out", candidate_folder / "out"
    limit = output_limit(ref_out, cases)
    names = [c["name"] for c in cases if c["name"] not in skipped] + [AFTER_TIMING]
    records: dict[str, dict] = {}
    outputs: dict[str, str | None] = {}
    references: dict[str, str | None] = {}
    for name in names:
        source = TIMING_CASE if name == AFTER_TIMING else name
        ref_path = ref_out / "reference" / f"{source}.pt"
        reference = readback.load_tensors(ref_path, reference_folder, reference_limit)
        if not isinstance(reference, torch.Tensor):
            raise KbfuseError(f"reference output {ref_path} is not a tensor")
        path = cand_out / "outputs" / f"{name}.pt"
        record, printed = _compare_one(
            reference, path, candidate_folder, contract, limit, device, hold
        )
        if record["problem"] == NO_OUTPUT and not expected:
            continue
        records[name] = record
        if name != AFTER_TIMING:
            outputs[name] = printed
            references[name] = compare.fingerprint(reference)
    return {
        **official.tolerance(contract),
        "cases": records,
        "cached_pairs": compare.cached_calls(cases, references, outputs),
        "skipped_cases": skipped,
    }


def inputs_differ(info: Mapping, runner: Mapping, correctness: Mapping) -> list[str]:
    """The compared cases whose inputs, by the candidate's own report (runner.json's
    `inputs_sha256`), were not the reference's (reference.json's): its process drew them
    otherwise, after the candidate's import changed how the task draws them. Self-reported,
    so it only tells a case's wrong values apart from different inputs; a case passes or fails
    on its outputs alone."""
    drawn = runner.get("inputs_sha256") or {}
    reference = info.get("inputs_sha256") or {}
    differ = []
    for name in correctness["cases"]:
        source = TIMING_CASE if name == AFTER_TIMING else name
        if name in drawn and source in reference and drawn[name] != reference[source]:
            differ.append(name)
    return differ


def trivial_status(info: dict, survey: str | Path | None) -> tuple[dict | None, str]:
    """The survey's blind spots for the task when a survey record is given, else the
    reference process's own computation (the same predicate on the same inputs)."""
    if survey is not None and Path(survey).is_file():
        try:
            data = untrusted.read_json(survey, readback.JSON_BYTES, follow=True)
        except KbfuseError:
            data = None
        if isinstance(data, dict) and isinstance(data.get("blind_spots"), dict):
            spots = dict(data["blind_spots"])
            spots["blind_spot"] = bool(data.get("blind_spot"))
            return spots, f"survey record {Path(survey).name}"
    return info.get("trivial"), "computed by the reference process"


def _environment(device: str) -> dict:
    import torch

    from kbfuse.workflow import devices

    env = {"torch": torch.__version__, "device": device}
    if device == "cuda":
        env["device_name"] = torch.cuda.get_device_name(0)
        env["cuda"] = torch.version.cuda
        env["gpu"] = devices.current(device)  # index, UUID, name (kbfuse.workflow.devices)
    return env


def official_block(contract: Mapping) -> dict:
    """What the verdict says about the judge: the pinned tolerance and where it was read, the
    argument order, the seed and trial count used, the contract's commit."""
    from kbfuse.checks import official

    return {
        **official.tolerance(contract),
        "argument_order": list(contract["argument_order"]),
        "seed": contract["seed"],
        "trials": contract["trials"],
        "contract_commit": contract.get("commit"),
    }


def _stage_seconds(reported) -> dict | None:
    """The candidate's stage walls (runner.json's stage_s) where they are what the runner
    writes (names and non-negative numbers), else None."""
    if not isinstance(reported, dict):
        return None
    if not all(
        name in verdict.STAGE_NAMES
        and isinstance(value, (int, float))
        and not isinstance(value, bool)
        and 0 <= value < 1e9
        for name, value in reported.items()
    ):
        return None
    return dict(reported)


def assemble(
    candidate: Path,
    task: dict,
    device: str,
    settings: dict,
    survey,
    evidence: Evidence,
    sandbox: dict,
    judged_by: Mapping,
) -> dict:
    """The verdict record (kbfuse.candidates.verdict names the checks and decides).
    `sandbox`: how the children were isolated ({"used": "bwrap", "version": ...} or
    {"used": "none", "version": None}); `judged_by`: the check's kernelbench contract."""
    runner, outcome, correctness = evidence.runner, evidence.outcome, evidence.correctness
    failure = runner.get("failure")
    trivial, trivial_source = trivial_status(evidence.info, survey)
    guards = None
    if runner.get("patched"):
        guards = {
            "patched": runner["patched"],
            "lazy": runner.get("lazy", []),
            "side_stream": runner.get("side_stream"),
            "unfinished_on_caller_stream": runner.get("unfinished_on_caller_stream"),
            "switches": runner.get("switches") or {},
            "switches_changed": switches.changes(runner.get("switches")),
        }
    checks: dict[str, dict] = {}
    checks.update(
        verdict.process_checks(
            outcome.as_dict(), failure, runner.get("stages_done") or [], evidence.report_problem
        )
    )
    checks.update(verdict.correctness_checks(correctness, evidence.cases))
    checks.update(verdict.guard_checks(guards, device))
    timing = runner.get("timing")
    record = {
        "kind": verdict.KIND,
        "schema_version": verdict.SCHEMA_VERSION,
        "candidate": {"file": candidate.name, "sha256": sha256_file(candidate)},
        "task": task,
        "environment": _environment(device),
        "settings": settings,
        "official": official_block(judged_by),
        "sandbox": sandbox,
        "self_reported": SELF_REPORTED,
        "checks": checks,
        "processes": {
            "candidate": outcome.as_dict(),
            "witness": evidence.witness_outcome.as_dict() if evidence.witness_outcome else None,
        },
        "failure": failure and {k: failure[k] for k in ("stage", "error", "message")},
        "report_problem": evidence.report_problem,
        "trivial": trivial,
        "trivial_source": trivial_source,
        "correctness": correctness,
        "contract": contract(runner, evidence.witness),
        "guards": guards,
        "baselines": runner.get("baselines"),
        "timing": timing,
        "speedup": verdict.speedups(timing),
        "stage_s": _stage_seconds(runner.get("stage_s")),
    }
    record["verdict"], record["failed_checks"] = verdict.decide(checks)
    record["findings"] = verdict.findings(record)
    return record
