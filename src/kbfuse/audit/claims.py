"""Claims beside measured speedups, one row per entry, and the tallies by kind.

Measured figures come from the entry's verdict (kbfuse.candidates.verdict): the method is
`events` (CUDA events, warm L2: how KernelBench and the corpora time) where the check ran on
a GPU, else `wall`; speedups are per-round paired ratios, baseline time over the candidate's
(> 1: the candidate is faster), median and quartiles, over eager and over the best compiled
baseline (the faster of TorchScript and Inductor, as the check timed them); over one compiled
baseline by name the same paired ratio from the verdict's samples.

Each claim with an `against` gets a status (CLAIM_STATUSES): `reproduces` when the claim is at
most the measured upper quartile, `does not reproduce` otherwise, `fails check` when the
candidate fails a check (its speed is not that of a correct kernel), `not measured` (no timing
of that baseline), `no verdict` (an audit not finished), `not checked` (the entry cannot be
checked: no code, another level; or its check did not start on this machine, whose scratch
disk cannot hold its cases: a check_refused record where its verdict would be), `no claim`.
Each entry gets one outcome (`outcome`), the first that applies: the failure kinds in
FAIL_KINDS order, then for a pass `passes only where a trivial output passes` (the
`blind_spot` finding), then how it compares with the best compiled baseline (quartiles above
1, below 1, or spanning it).

The claims stand beside the measurement in the mode they were made in (the index's
`corpus.numerics`). Each other mode measured (`corpus.measured`, e.g. strict FP32) adds its
verdict, outcome, failed checks, measured speedups and claim statuses, in columns prefixed by
the mode (`strict_...`, MODE_PREFIX), so a gap the mode explains shows beside the claim.
"""

from __future__ import annotations

from collections import Counter

import pandas as pd

from kbfuse.audit.references import reference_status
from kbfuse.timing.measure import paired_ratios

# failed check -> the kind it is tallied under, in the order a candidate's outcome is chosen
FAIL_KINDS = (
    ("timer_patched", "timer patched"),
    ("lazy_result", "lazy result"),
    ("side_stream", "side stream"),
    ("unfinished_on_caller_stream", "unfinished on the caller's stream"),
    ("input_independent", "caching"),
    ("official", "wrong values"),
    ("distributions", "wrong values"),
    ("changed_weights", "ignores changed weights"),
    ("output_after_timing", "wrong values after timing"),
    ("build", "does not build"),
    ("runtime_error", "runtime error"),
    ("time_limit", "time limit"),
    ("memory_limit", "memory limit"),
)
PASSES_BLIND = "passes only where a trivial output passes"
PASSES_FASTER = "passes and is faster than the best compiled"
PASSES_SLOWER = "passes and is slower than the best compiled"
PASSES_EVEN = "passes, within the spread of the best compiled"
PASSES_UNTIMED = "passes, not timed against a compiled baseline"
NOT_CHECKED = "not checked"  # skipped: the corpus entry cannot be checked
NO_VERDICT = "no verdict"  # checkable, but its verdict was not given (an unfinished audit)
REPRODUCES, NOT_REPRODUCED = "reproduces", "does not reproduce"
FAILS_CHECK, NOT_MEASURED, NO_CLAIM = "fails check", "not measured", "no claim"
CLAIM_STATUSES = (
    REPRODUCES,
    NOT_REPRODUCED,
    FAILS_CHECK,
    NOT_MEASURED,
    NO_VERDICT,
    NOT_CHECKED,
    NO_CLAIM,
)
METHODS = ("events", "wall")
Ratio = tuple[float | None, float | None, float | None]
NO_RATIO: Ratio = (None, None, None)


def is_refusal(record: dict | None) -> bool:
    """Whether a verdict's file holds a check_refused record (a check that did not start:
    kbfuse.candidates.check.refusal_record)."""
    return record is not None and record.get("kind") == "check_refused"


def method_of(verdict: dict) -> str | None:
    """The timing method the audit reads: events on a GPU, wall on a CPU, None untimed."""
    speedup = verdict.get("speedup") or {}
    return next((m for m in METHODS if m in speedup), None)


def _triple(ratios: dict | None) -> Ratio:
    return NO_RATIO if not ratios else (ratios["median"], ratios["q1"], ratios["q3"])


def measured(verdict: dict, against: str, method: str | None) -> Ratio:
    """(median, q1, q3) of the speedup over `against` (eager, best_compiled or one compiled
    baseline), by `method`; NO_RATIO where it was not timed."""
    if method is None:
        return NO_RATIO
    entry = verdict["speedup"][method]
    if against == "eager":
        return _triple(entry["over_eager"])
    if against == "best_compiled":
        return _triple(entry["over_best_compiled"])
    block = verdict["timing"][method]
    if against not in block or "candidate" not in block:
        return NO_RATIO
    samples = block[against]["samples_ms"], block["candidate"]["samples_ms"]
    return _triple(paired_ratios(*samples, len(block)))


def outcome(verdict: dict | None, best: Ratio) -> str:
    """The one kind an entry is tallied under (see the module docstring)."""
    if verdict is None:
        return NO_VERDICT
    failed = set(verdict["failed_checks"])
    for check, kind in FAIL_KINDS:
        if check in failed:
            return f"fails: {kind}"
    if verdict["verdict"] != "pass":
        return "fails: checks not run"
    if "blind_spot" in verdict["findings"]:
        return PASSES_BLIND
    _, q1, q3 = best
    if q1 is None:
        return PASSES_UNTIMED
    if q1 > 1:
        return PASSES_FASTER
    if q3 < 1:
        return PASSES_SLOWER
    return PASSES_EVEN


def claim_status(claim: float | None, verdict: dict | None, ratio: Ratio) -> str:
    if claim is None:
        return NO_CLAIM
    if verdict is None:
        return NO_VERDICT
    if verdict["verdict"] != "pass":
        return FAILS_CHECK
    if ratio[2] is None:
        return NOT_MEASURED
    return REPRODUCES if claim <= ratio[2] else NOT_REPRODUCED


def _columns(prefix: str, ratio: Ratio) -> dict:
    return {prefix: ratio[0], f"{prefix}_q1": ratio[1], f"{prefix}_q3": ratio[2]}


def mode_prefix(mode: str) -> str:
    """The column prefix of a mode measured besides the claims' ("strict" -> "strict_")."""
    return mode.replace("-", "_") + "_"


def measured_columns(entry: dict, claims: list[dict], verdict: dict | None, prefix: str = ""):
    """The columns of one measurement of an entry: verdict, outcome, failed checks, findings,
    speedups over eager and the best compiled baseline, each compared claim's figure and
    status; every name after `prefix`."""
    if is_refusal(verdict):  # the check did not start on this machine
        columns = measured_columns(entry, claims, None, prefix)
        why = f"{NOT_CHECKED}: {verdict['why']}"
        return {
            key: why if key == f"{prefix}outcome" else NOT_CHECKED if value == NO_VERDICT else value
            for key, value in columns.items()
        }
    method = None if verdict is None else method_of(verdict)
    eager = NO_RATIO if verdict is None else measured(verdict, "eager", method)
    best = NO_RATIO if verdict is None else measured(verdict, "best_compiled", method)
    speedup = (verdict or {}).get("speedup") or {}
    columns = {
        "verdict": NO_VERDICT if verdict is None else verdict["verdict"],
        "outcome": outcome(verdict, best),
        "failed_checks": "" if verdict is None else " ".join(verdict["failed_checks"]),
        "findings": "" if verdict is None else " ".join(verdict["findings"]),
        "method": method,
        **_columns("measured_over_eager", eager),
        "best_compiled": (speedup.get(method) or {}).get("best_compiled"),
        **_columns("measured_over_best_compiled", best),
    }
    for claim in claims:
        if claim["against"] is None:
            continue
        name = claim["name"]
        ratio = NO_RATIO if verdict is None else measured(verdict, claim["against"], method)
        columns.update(_columns(f"measured_{name}", ratio))
        columns[f"status_{name}"] = claim_status(entry["claims"].get(name), verdict, ratio)
    return {f"{prefix}{key}": value for key, value in columns.items()}


def entry_row(
    entry: dict, claims: list[dict], verdicts: dict[str, dict | None], pinned: dict | None
) -> dict:
    """One row: the entry, its measurement in the claims' mode (the first of `verdicts`, its
    verdicts by mode) beside every claim, then the other modes' measurements."""
    (mode, verdict), *others = verdicts.items()
    row = {
        "entry": entry["name"],
        "source": entry["source"],
        "task": f"{entry['level']}/{entry['task']}",
        "reference_vs_pinned": reference_status(entry["reference"], pinned),
        "numerics": mode,
    }
    mine = measured_columns(entry, claims, verdict)
    row.update({k: mine[k] for k in list(mine)[:5]})  # verdict ... method first
    for claim in claims:
        row[f"claim_{claim['name']}"] = entry["claims"].get(claim["name"])
        if claim["against"] is not None:
            row[f"against_{claim['name']}"] = claim["against"]
    row.update(mine)
    for other, record in others:
        row.update(measured_columns(entry, claims, record, mode_prefix(other)))
    return row


def skipped_row(skipped: dict, claims: list[dict], modes: list[str]) -> dict:
    row = {
        "entry": "",
        "source": skipped["source"],
        "task": f"{skipped['level']}/{skipped['task']}",
    }
    for prefix in ["", *map(mode_prefix, modes[1:])]:
        row[f"{prefix}verdict"] = NOT_CHECKED
        row[f"{prefix}outcome"] = f"{NOT_CHECKED}: {skipped['why']}"
        for claim in claims:
            if claim["against"] is not None:
                row[f"{prefix}status_{claim['name']}"] = NOT_CHECKED
    return row


def table(
    index: dict, verdicts: dict[str, dict[str, dict]], pinned: dict[tuple, dict | None]
) -> pd.DataFrame:
    """Every entry of the index (checked ones first, in corpus order, then the skipped);
    `verdicts` {mode: {entry name: verdict}}, `pinned` digests by (level, task)."""
    claims, modes = index["claims"], index["corpus"]["measured"]
    rows = [
        entry_row(
            e,
            claims,
            {mode: verdicts.get(mode, {}).get(e["name"]) for mode in modes},
            pinned.get((e["level"], e["task"])),
        )
        for e in index["entries"]
    ]
    rows += [skipped_row(s, claims, modes) for s in index["skipped"]]
    return pd.DataFrame(rows)


def _counts(group: str, values) -> list[dict]:
    counted = Counter(v for v in values if v)
    return [
        {"group": group, "kind": kind, "count": n}
        for kind, n in sorted(counted.items(), key=lambda item: (-item[1], item[0]))
    ]


def _mode_tallies(frame: pd.DataFrame, claims: list[dict], mode: str | None) -> list[dict]:
    """The tallies of one mode's columns: the claims' (None) or another mode's."""
    prefix, said = ("", "") if mode is None else (mode_prefix(mode), f", {mode}")
    checked = frame[~frame[f"{prefix}verdict"].isin([NOT_CHECKED, NO_VERDICT])]
    outcomes = [NOT_CHECKED if o.startswith(NOT_CHECKED) else o for o in frame[f"{prefix}outcome"]]
    in_mode = "" if mode is None else f" ({mode})"
    rows = _counts(f"outcome{in_mode}", outcomes)
    for column, group in (("failed_checks", "failed check"), ("findings", "finding")):
        words = [w for cell in checked.get(f"{prefix}{column}", []) for w in str(cell).split()]
        rows += _counts(f"{group}{in_mode}", words)
    for claim in claims:
        column = f"{prefix}status_{claim['name']}"
        if column in frame:
            group = f"claim {claim['name']} (against {claim['against']}{said})"
            rows += _counts(group, frame[column])
    return rows


def tallies(frame: pd.DataFrame, claims: list[dict], modes: list[str]) -> pd.DataFrame:
    """Counts by kind, in each measured mode (the claims' first, `modes`): each entry's
    outcome; every failed check and finding; each compared claim's status; then how the
    references compare with the pinned task files."""
    if frame.empty:
        return pd.DataFrame(columns=["group", "kind", "count"])
    rows = _mode_tallies(frame, claims, None)
    for mode in modes[1:]:
        rows += _mode_tallies(frame, claims, mode)
    checked = frame[~frame["verdict"].isin([NOT_CHECKED, NO_VERDICT])]
    rows += _counts("reference vs pinned", checked.get("reference_vs_pinned", []))
    return pd.DataFrame(rows, columns=["group", "kind", "count"])
