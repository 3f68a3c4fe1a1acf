"""How far two runs of one audit agree: the same candidates checked twice, verdict by verdict
and speedup by speedup.

Each audit folder (results/audit/<name>) holds verdicts by numerics mode and entry. A pair is
a verdict of the same entry and mode in both; a pair whose two files are byte for byte the same
was not checked again (a resumed run kept it) and is counted apart. For each pair checked
twice: whether the verdict, the failed checks and the findings are the same, and per timing
method the measured speedup over eager and over the best compiled baseline (the balanced
ratio, kbfuse.timing.measure.paired_ratios) in both runs, their ratio (second / first), and
whether the best compiled baseline is the same one; and the checker's phases, their waits for
the GPU lock and the candidate's stages summed over the pairs in each run (kbfuse.audit.wall
says what each is). No GPU needed: it only reads files.
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Any

from kbfuse import layout
from kbfuse.audit.wall import PHASES, STAGES, named_seconds
from kbfuse.errors import KbfuseError
from kbfuse.results.records import parse_json, read_limited

METHODS = ("events", "cold_l2", "graph")
OVER = ("over_eager", "over_best_compiled")
WITHIN = (0.05, 0.10)  # the agreement bands reported: |second / first - 1| at most this


def verdict_files(audit: Path) -> dict[tuple[str, str], Path]:
    """(numerics mode, entry) -> verdict file of the audit folder `audit`."""
    pattern = layout.audit_file("verdict", ".", numerics="*", entry="*")
    found = {(p.parent.name, p.stem): p for p in sorted(Path(audit).glob(pattern))}
    if not found:
        raise KbfuseError(f"no verdicts under {audit}")
    return found


def _read(path: Path) -> tuple[bytes, dict]:
    raw = read_limited(path)
    record = parse_json(raw, str(path))
    if not isinstance(record, dict) or record.get("kind") != "check_candidate":
        raise KbfuseError(f"{path}: not a check_candidate verdict")
    return raw, record


def _speedups(record: dict) -> dict[str, dict[str, Any]]:
    """method -> {over_eager, over_best_compiled (balanced ratios or None), best_compiled}."""
    found: dict[str, dict[str, Any]] = {}
    for method, block in (record.get("speedup") or {}).items():
        if method not in METHODS or not isinstance(block, dict):
            continue
        entry = {"best_compiled": block.get("best_compiled")}
        for over in OVER:
            ratio = block.get(over) if isinstance(block.get(over), dict) else {}
            value = ratio.get("balanced")
            entry[over] = float(value) if isinstance(value, (int, float)) else None
        found[method] = entry
    return found


def pair_row(key: tuple[str, str], first: dict, second: dict) -> dict[str, Any]:
    """One candidate checked twice: its two outcomes and, per method, its two speedups."""
    mode, entry = key
    row: dict[str, Any] = {
        "numerics": mode,
        "entry": entry,
        "verdict": [first["verdict"], second["verdict"]],
        "failed_checks": [list(first["failed_checks"]), list(second["failed_checks"])],
        "findings": [list(first["findings"]), list(second["findings"])],
        "same_verdict": first["verdict"] == second["verdict"],
        "same_failed_checks": first["failed_checks"] == second["failed_checks"],
        "same_findings": sorted(first["findings"]) == sorted(second["findings"]),
        "speedup": {},
    }
    one, two = _speedups(first), _speedups(second)
    for method in sorted(set(one) & set(two)):
        figures = {
            "same_best_compiled": one[method]["best_compiled"] == two[method]["best_compiled"]
        }
        for over in OVER:
            a, b = one[method][over], two[method][over]
            figures[over] = [a, b]
            figures[f"{over}_ratio"] = b / a if a and b else None
        row["speedup"][method] = figures
    return row


def _agreement(ratios: list[float]) -> dict[str, Any]:
    """How close second / first ratios are to 1: their count, median and largest distance
    (as |ratio - 1|, the larger of ratio and its inverse), and how many lie within each band."""
    if not ratios:
        return {"pairs": 0}
    distance = [max(r, 1 / r) - 1 for r in ratios]  # 1.1 is within 10%, float error aside
    return {
        "pairs": len(ratios),
        "median_ratio": round(statistics.median(ratios), 4),
        "geomean_ratio": round(math.exp(statistics.fmean(math.log(r) for r in ratios)), 4),
        "median_distance": round(statistics.median(distance), 4),
        "max_distance": round(max(distance), 4),
        **{f"within_{round(w * 100)}pct": sum(d <= w + 1e-12 for d in distance) for w in WITHIN},
    }


def audit_repeat(first: str | Path, second: str | Path) -> dict[str, Any]:
    """The report of two runs of one audit: the folders `first` and `second`."""
    one, two = verdict_files(Path(first)), verdict_files(Path(second))
    pairs, kept = {}, []
    for key in sorted(set(one) & set(two)):
        (raw_a, a), (raw_b, b) = _read(one[key]), _read(two[key])
        if raw_a == raw_b:
            kept.append("/".join(key))
        else:
            pairs[key] = (a, b)
    rows = [pair_row(key, a, b) for key, (a, b) in pairs.items()]
    if not rows:
        raise KbfuseError(f"no candidate of {first} was checked again in {second}")
    agreement = {
        method: {
            over: _agreement(
                [
                    r["speedup"][method][f"{over}_ratio"]
                    for r in rows
                    if method in r["speedup"] and r["speedup"][method][f"{over}_ratio"]
                ]
            )
            for over in OVER
        }
        for method in METHODS
        if any(method in r["speedup"] for r in rows)
    }
    return {
        "kind": "audit_repeat",
        "schema_version": 1,
        "first": str(first),
        "second": str(second),
        "checked_twice": len(rows),
        "kept": kept,
        "only_first": sorted("/".join(k) for k in set(one) - set(two)),
        "only_second": sorted("/".join(k) for k in set(two) - set(one)),
        "same_verdict": sum(r["same_verdict"] for r in rows),
        "same_failed_checks": sum(r["same_failed_checks"] for r in rows),
        "same_findings": sum(r["same_findings"] for r in rows),
        "differing": [r for r in rows if not (r["same_verdict"] and r["same_failed_checks"])],
        "speedup_agreement": agreement,
        "time_s": {
            field: [_summed([pair[run] for pair in pairs.values()], field, names) for run in (0, 1)]
            for field, names in (("phases_s", PHASES), ("lock_wait_s", PHASES), ("stage_s", STAGES))
        },
        "rows": rows,
    }


def _summed(records: list[dict], field: str, names: tuple[str, ...]) -> dict[str, float]:
    """`field`'s seconds summed over `records`, by name, for the names any record has."""
    each = [named_seconds(record.get(field), names) for record in records]
    return {
        n: round(sum(e.get(n, 0.0) for e in each), 1) for n in names if any(n in e for e in each)
    }


def _checks(failed: list[str]) -> str:
    return ", ".join(failed) or "none"


def report_markdown(
    report: dict[str, Any], first_name: str, second_name: str, largest: int = 5
) -> str:
    n = report["checked_twice"]
    lines = [
        f"# The same audit run twice: {first_name} and {second_name}",
        "",
        f"{n} candidates checked in both runs"
        + (
            f" ({len(report['kept'])} more kept from the first, not checked again)"
            if report["kept"]
            else ""
        )
        + f": the same verdict for {report['same_verdict']}, the same failed checks for"
        f" {report['same_failed_checks']}, the same findings for {report['same_findings']}.",
    ]
    if report["differing"]:
        lines += ["", f"| entry | mode | {first_name} | {second_name} |", "|---|---|---|---|"]
        for row in report["differing"]:
            a, b = (
                f"{v} (failed: {_checks(f)})"
                for v, f in zip(row["verdict"], row["failed_checks"], strict=True)
            )
            lines.append(f"| {row['entry']} | {row['numerics']} | {a} | {b} |")
    lines += [
        "",
        f"Measured speedups, {second_name} / {first_name} (balanced ratios; distance ="
        " the larger of the ratio and its inverse, less 1):",
        "",
        "| method | speedup over | pairs | geomean | median | median distance | largest"
        " distance | within 5% | within 10% |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for method, overs in report["speedup_agreement"].items():
        for over, stats in overs.items():
            if not stats["pairs"]:
                continue
            lines.append(
                f"| {method} | {over.removeprefix('over_').replace('_', ' ')} | {stats['pairs']} |"
                f" {stats['geomean_ratio']:.3f} | {stats['median_ratio']:.3f} |"
                f" {stats['median_distance']:.1%} | {stats['max_distance']:.1%} |"
                f" {stats['within_5pct']} | {stats['within_10pct']} |"
            )
    lines += [
        "",
        f"Where the time went, summed over the {n} candidates (seconds):",
        "",
        f"| | {first_name} | {second_name} |",
        "|---|---|---|",
    ]
    for field, label in (
        ("phases_s", "phase"),
        ("lock_wait_s", "of which waiting for the GPU lock:"),
        ("stage_s", "candidate stage (self-reported)"),
    ):
        a, b = report["time_s"][field]
        for name in dict.fromkeys([*a, *b]):
            cells = (f"{run[name]:.1f}" if name in run else "not recorded" for run in (a, b))
            lines.append(f"| {label} {name} | " + " | ".join(cells) + " |")
    far = _farthest(report["rows"], largest)
    if far:
        lines += [
            "",
            f"The {len(far)} candidates whose speedups differ most (events, over eager):",
            "",
            f"| entry | verdict | {first_name} | {second_name} | {second_name} / {first_name} |",
            "|---|---|---|---|---|",
        ]
        for row in far:
            a, b = row["speedup"]["events"]["over_eager"]
            ratio = row["speedup"]["events"]["over_eager_ratio"]
            lines.append(
                f"| {row['entry']} | {'/'.join(dict.fromkeys(row['verdict']))} | {a:.2f}x |"
                f" {b:.2f}x | {ratio:.3f} |"
            )
    return "\n".join(lines) + "\n"


def _farthest(rows: list[dict[str, Any]], count: int) -> list[dict[str, Any]]:
    def distance(row: dict[str, Any]) -> float:
        ratio = row["speedup"]["events"]["over_eager_ratio"]
        return max(ratio, 1 / ratio)

    timed = [r for r in rows if (r["speedup"].get("events") or {}).get("over_eager_ratio")]
    return sorted(timed, key=lambda r: (-distance(r), r["entry"]))[:count]
