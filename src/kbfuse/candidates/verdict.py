"""The verdict record of one candidate: every check named, the contract, the speedups.

`checks` maps each check to {status, detail}; status is "pass", "fail", "not_applicable"
(nothing to check: no GPU for the stream guards, a candidate whose parameters are named
differently for the in-place weight change) or "not_run" (an earlier stage failed). The
verdict is "pass" when no check failed and every check ran; `failed_checks` lists the failures
by name. `findings` are named facts that do not fail a candidate but limit what a
pass means:

  blind_spot        a trivial output (zeros, the mean) passes the official check on this task:
                    a pass proves little;
  not_bit_identical some case differs from eager in at least one bit;
  fast_math, ftz    the build flags imply fast math / flush-to-zero, or the witness built with
                    those flags flushes on the device (`ftz_effective`);
  unsandboxed       the children ran without the sandbox (`--unsandboxed`): nothing kept the
                    candidate from the reference's data, the verdict folder or the network;
  switches_changed  the candidate changed one of torch's process-wide numerics switches;
  side_stream_first_call
                    the instance's first call ran GPU work on another stream, its later calls
                    did not (one-off setup such as a CUDA graph's capture; no timed call is a
                    first call).

The record follows src/kbfuse/schemas/check_candidate.json (validated before it is written).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from importlib import resources
from typing import Any

from kbfuse.errors import KbfuseError
from kbfuse.timing.measure import paired_ratios

KIND = "check_candidate"
SCHEMA_VERSION = 2
CORRECTNESS_CHECKS = (
    "official",
    "changed_weights",
    "distributions",
    "input_independent",
    "output_after_timing",
)
# the check's phases (kbfuse.candidates.check.gather: the verdict's phases_s) and the candidate
# process's stages, the guards stage in its parts (kbfuse.candidates.runner: stage_s)
PHASE_NAMES = ("scratch_wait", "reference", "candidate", "witness", "compare")
STAGE_NAMES = ("build", "correctness", "baselines", "alone_wait", "guards", "timing")
GUARD_CHECKS = ("timer_patched", "lazy_result", "side_stream", "unfinished_on_caller_stream")
PROCESS_CHECKS = ("build", "runtime_error", "time_limit", "memory_limit")
CHECKS = (*PROCESS_CHECKS, *CORRECTNESS_CHECKS, *GUARD_CHECKS)
COMPILED = ("torchscript", "inductor")


def _check(status: str, detail: str = "") -> dict:
    return {"status": status, "detail": detail}


def _cases_check(
    cases: Mapping[str, dict], names: list[str], what: str, inputs_differ: list[str]
) -> dict:
    if not names:
        return _check("not_run", f"no {what} case ran")
    bad = [n for n in names if not cases[n]["official_pass"]]
    if bad:
        shown = ", ".join(bad[:4]) + (" ..." if len(bad) > 4 else "")
        why = cases[bad[0]].get("problem") or f"max error {cases[bad[0]].get('max_abs')}"
        drawn = [n for n in bad if n in inputs_differ]
        if drawn:
            why += (
                f"; the candidate's process reports other inputs for {', '.join(drawn[:4])}: "
                "its import changed how the task draws them (self-reported)"
            )
        return _check("fail", f"{len(bad)}/{len(names)} {what} case(s) fail: {shown} ({why})")
    return _check("pass", f"{len(names)} {what} case(s) pass the official predicate")


def correctness_checks(correctness: Mapping, planned: list[dict]) -> dict[str, dict]:
    cases = correctness["cases"]
    ran = [c for c in planned if c["name"] in cases]
    groups = {
        g: [c["name"] for c in ran if c["group"] == g]
        for g in ("official", "weights", "distribution")
    }
    differ = correctness.get("inputs_differ") or []
    checks = {
        "official": _cases_check(cases, groups["official"], "official", differ),
        "distributions": _cases_check(cases, groups["distribution"], "distribution", differ),
    }
    skipped = correctness.get("skipped_cases", {})
    if "weights" in skipped:
        checks["changed_weights"] = _check("not_applicable", skipped["weights"])
    else:
        checks["changed_weights"] = _cases_check(
            cases, groups["weights"], "changed-weights", differ
        )
    pairs = correctness["cached_pairs"]
    if pairs:
        shown = "; ".join(" and ".join(p) for p in pairs[:3])
        checks["input_independent"] = _check(
            "fail",
            f"bit-identical outputs for different inputs or weights (cached or constant): {shown}",
        )
    elif len(ran) < 2:
        checks["input_independent"] = _check("not_run", "fewer than two calls ran")
    else:
        checks["input_independent"] = _check("pass", "outputs follow inputs and weights")
    after = cases.get("after_timing")
    if after is None:
        checks["output_after_timing"] = _check("not_run", "timing did not finish")
    elif after["official_pass"]:
        checks["output_after_timing"] = _check("pass", "output after the timed region is right")
    else:
        why = f"output after the timed region: {after.get('problem') or after['max_abs']}"
        if "after_timing" in differ:
            why += "; the candidate's process reports other inputs for it (self-reported)"
        checks["output_after_timing"] = _check("fail", why)
    return checks


def _off_stream_names(profile: Mapping) -> str:
    """The first three names, in order, of the work a profile saw off the caller's streams."""
    return ", ".join(sorted({k["name"][:60] for k in profile["off_stream"]})[:3])


def guard_checks(guards: Mapping | None, device: str) -> dict[str, dict]:
    if guards is None:
        return {
            name: _check("not_run", "the candidate did not get that far") for name in GUARD_CHECKS
        }
    patched = guards["patched"]["after_import"] + guards["patched"]["after_calls"]
    checks = {
        "timer_patched": _check("fail", "replaced: " + ", ".join(sorted(set(patched))))
        if patched
        else _check("pass", "every watched clock and sync function unchanged"),
        "lazy_result": _check("fail", guards["lazy"][0]["why"])
        if guards["lazy"]
        else _check("pass", "every output is a plain torch.Tensor"),
    }
    side = guards.get("side_stream")
    if device != "cuda":
        checks["side_stream"] = _check("not_applicable", "no GPU: no streams")
        checks["unfinished_on_caller_stream"] = _check("not_applicable", "no GPU: no streams")
        return checks
    if side is None:
        checks["side_stream"] = _check("not_run", "the guard stage did not run")
    elif side["detected"]:
        checks["side_stream"] = _check(
            "fail",
            f"GPU work on stream(s) {side['candidate_streams']}, caller's {side['caller_streams']}:"
            f" {_off_stream_names(side)}",
        )
    else:
        detail = f"all GPU work on {side['caller_streams']}"
        first = side.get("first_call") or {}
        if first.get("detected"):
            detail += (
                f" after the first call (the first also on {first['candidate_streams']}:"
                f" {_off_stream_names(first)})"
            )
        checks["side_stream"] = _check("pass", detail)
    unfinished = guards.get("unfinished_on_caller_stream")
    if unfinished is None:
        checks["unfinished_on_caller_stream"] = _check("not_run", "the guard stage did not run")
    elif unfinished:
        checks["unfinished_on_caller_stream"] = _check(
            "fail", "the output changed after the caller's stream was done"
        )
    else:
        checks["unfinished_on_caller_stream"] = _check(
            "pass", "output complete when the caller's stream is done"
        )
    return checks


def process_checks(
    outcome: Mapping,
    failure: Mapping | None,
    stages_done: list[str],
    report_problem: str | None = None,
) -> dict[str, dict]:
    """The process checks from the candidate process's outcome (the parent's) and its report
    (self-reported: `failure`, `stages_done`; `report_problem` says why there is none)."""
    status = outcome["status"]
    checks = {
        "time_limit": _check("fail", f"killed after {outcome['wall_s']} s")
        if status == "time_limit"
        else _check("pass"),
        "memory_limit": _check("fail", f"killed at {outcome['peak_rss_mb']} MB resident")
        if status == "memory_limit"
        else _check("pass"),
    }
    if failure is not None and failure["stage"] != "build":
        checks["runtime_error"] = _check(
            "fail", f"{failure['stage']} stage: {failure['error']}: {failure['message']}"
        )
    else:
        checks["runtime_error"] = _check("pass", "no exception after the build")
    if failure is not None and failure["stage"] == "build":
        checks["build"] = _check("fail", f"{failure['error']}: {failure['message']}")
    elif report_problem is not None and status == "exited":
        checks["build"] = _check("fail", f"no usable report from its process: {report_problem}")
    elif "build" in stages_done:
        checks["build"] = _check("pass", "imported and constructed")
    elif status != "exited":
        checks["build"] = _check("not_run", f"the process was killed ({status}) before")
    else:
        checks["build"] = _check(
            "fail", f"the candidate process exited with status {outcome['returncode']}"
        )
    return checks


def speedups(timing: Mapping | None) -> dict | None:
    """Per method: eager / candidate and best compiled / candidate, paired per round."""
    if not timing:
        return None
    result = {}
    for method, block in timing.items():
        if method == "graph_missing" or "candidate" not in block:
            continue
        cycle = len(block)
        entry: dict[str, Any] = {
            "over_eager": paired_ratios(
                block["eager"]["samples_ms"], block["candidate"]["samples_ms"], cycle
            )
            if "eager" in block
            else None
        }
        compiled = [n for n in COMPILED if n in block]
        best = min(compiled, key=lambda n: block[n]["median_ms"]) if compiled else None
        entry["best_compiled"] = best
        entry["over_best_compiled"] = (
            paired_ratios(block[best]["samples_ms"], block["candidate"]["samples_ms"], cycle)
            if best
            else None
        )
        result[method] = entry
    return result


def findings(record: Mapping) -> list[str]:
    found = []
    if record["trivial"] and record["trivial"].get("blind_spot"):
        found.append("blind_spot")
    cases = record["correctness"]["cases"]
    if any(c.get("problem") is None and not c.get("bit_identical") for c in cases.values()):
        found.append("not_bit_identical")
    if record["sandbox"]["used"] == "none":
        found.append("unsandboxed")
    contract = record["contract"]
    if contract["implies"]["use_fast_math"]:
        found.append("fast_math")
    if contract["implies"]["ftz"]:
        found.append("ftz")
    if contract["effective_ftz"]:
        found.append("ftz_effective")
    if (record["guards"] or {}).get("switches_changed"):
        found.append("switches_changed")
    side = (record["guards"] or {}).get("side_stream") or {}
    if not side.get("detected") and (side.get("first_call") or {}).get("detected"):
        found.append("side_stream_first_call")
    return found


def decide(checks: Mapping[str, Mapping]) -> tuple[str, list[str]]:
    """("pass", []) when no check failed, every check ran (a check is `not_run` only when
    something before it failed or was never reported) and both value checks passed; else
    "fail" and the failed checks in CHECKS order."""
    failed = [name for name in CHECKS if checks[name]["status"] == "fail"]
    unrun = [name for name in CHECKS if checks[name]["status"] == "not_run"]
    missing = [n for n in ("official", "distributions") if checks[n]["status"] != "pass"]
    return ("fail" if failed or unrun or missing else "pass"), failed


def schema(name: str = "check_candidate.json") -> dict:
    text = resources.files("kbfuse").joinpath("schemas", name).read_text()
    return json.loads(text)


def _first_error(validator, data) -> str | None:
    errors = sorted(validator.iter_errors(data), key=lambda e: list(map(str, e.path)))
    if not errors:
        return None
    first = errors[0]
    where = ".".join(map(str, first.absolute_path)) or "<top level>"
    return f"field {where}: {first.message[:300]}"


def validate(record: Mapping, label: str, name: str = "check_candidate.json") -> None:
    import jsonschema

    problem = _first_error(jsonschema.Draft202012Validator(schema(name)), record)
    if problem is not None:
        raise KbfuseError(f"{label}: {problem}")


def validate_refusal(record: Mapping, label: str) -> None:
    """A check_refused record (kbfuse.candidates.check.refusal_record) against its schema."""
    validate(record, label, "check_refused.json")


def runner_problem(report: Any) -> str | None:
    """What is wrong with a candidate process's report (runner.json) against its schema
    (check_candidate.json's $defs/runner), or None."""
    import jsonschema

    validator = jsonschema.Draft202012Validator(
        {"$ref": "#/$defs/runner", "$defs": schema()["$defs"]}
    )
    return _first_error(validator, report)
