"""Where an audit's wall time went, from its verdicts: the check's phases and the candidate
process's stages, per check and summed, and how many timing blocks the spread let stop early.

Each verdict (kbfuse.candidates.check) records `phases_s` (scratch wait, reference, candidate,
witness, compare: measured by the checker), of those the seconds the checker waited for the
GPU lock (`lock_wait_s`, since session 25 of docs/device-runs.md) and `stage_s` (build,
correctness, baselines, alone_wait, guards, timing: reported by the candidate's process, so
self-reported). A verdict without them (written before they existed) counts as a check with
no phases, or no lock waits. Its `scratch`
says how many bytes its cases were estimated at and the type of filesystem they lay on
(`tmpfs`: the machine's memory; "not recorded" before verdicts said). The run's wall time
comes from a Snakemake run log when one is given. No GPU needed: it only reads files.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from kbfuse import layout
from kbfuse.candidates.verdict import PHASE_NAMES as PHASES
from kbfuse.candidates.verdict import STAGE_NAMES as STAGES
from kbfuse.errors import KbfuseError
from kbfuse.results.jobtimes import run_wall
from kbfuse.results.records import parse_json, read_limited

BLOCKS = ("events", "cold_l2", "graph")
NOT_RECORDED = "not recorded"


def named_seconds(block: Any, names: tuple[str, ...]) -> dict[str, float]:
    if not isinstance(block, dict):
        return {}
    return {
        name: float(block[name])
        for name in names
        if isinstance(block.get(name), (int, float)) and not isinstance(block.get(name), bool)
    }


def block_end(timing: Any, block: str, rounds: int | None) -> str | None:
    """How a timing block ended: "two cycles" (the spread let it stop at the earliest),
    "all rounds" (it ran `rounds`), "between"; None where the block is not there."""
    stats = timing.get(block) if isinstance(timing, dict) else None
    if not isinstance(stats, dict):
        return None
    counts = [
        len(s["samples_ms"]) for s in stats.values() if isinstance(s, dict) and "samples_ms" in s
    ]
    if not counts:
        return None
    if counts[0] <= 2 * len(counts):  # one sample per implementation per round
        return "two cycles"
    return "all rounds" if rounds is not None and counts[0] >= rounds else "between"


def check_row(path: Path) -> dict[str, Any]:
    """One verdict's entry, mode, verdict, phases, stages and timing blocks."""
    record = parse_json(read_limited(path), str(path))
    if not isinstance(record, dict) or "verdict" not in record:
        raise KbfuseError(f"{path}: not a check verdict")
    settings = record.get("settings") if isinstance(record.get("settings"), dict) else {}
    rounds = (settings.get("timing") or {}).get("rounds")
    scratch = record.get("scratch") if isinstance(record.get("scratch"), dict) else {}
    estimated = scratch.get("estimated_bytes")
    return {
        "entry": path.stem,
        "numerics": path.parent.name,
        "verdict": record["verdict"],
        "failed_checks": list(record.get("failed_checks") or []),
        "phases_s": named_seconds(record.get("phases_s"), PHASES),
        "lock_wait_s": named_seconds(record.get("lock_wait_s"), PHASES),
        "stage_s": named_seconds(record.get("stage_s"), STAGES),
        "blocks": {block: block_end(record.get("timing"), block, rounds) for block in BLOCKS},
        "scratch_gb": round(estimated / 1e9, 2) if isinstance(estimated, int) else 0.0,
        "scratch_filesystem": scratch.get("filesystem") or NOT_RECORDED,
    }


def by_filesystem(rows: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Checks and their estimated scratch GB per filesystem type their cases lay on."""
    table: dict[str, dict[str, float]] = {}
    for row in rows:
        entry = table.setdefault(row["scratch_filesystem"], {"checks": 0, "gb": 0.0})
        entry["checks"] += 1
        entry["gb"] = round(entry["gb"] + row["scratch_gb"], 2)
    return dict(sorted(table.items()))


def audit_wall(audit: str | Path, snakemake_log=None) -> dict[str, Any]:
    """The report of the audit folder `audit` (results/audit/<name>): every verdict's row, the
    phases and stages summed, the verdicts counted, the timing blocks by how they ended, and
    the run's wall seconds (None without a log; the pieces of a resumed run add up)."""
    audit = Path(audit)
    paths = sorted(
        Path(p) for p in audit.glob(layout.audit_file("verdict", ".", numerics="*", entry="*"))
    )
    if not paths:
        raise KbfuseError(f"no verdicts under {audit}")
    rows = [check_row(path) for path in paths]
    ended = Counter(
        (block, how) for row in rows for block, how in row["blocks"].items() if how is not None
    )
    return {
        "kind": "audit_wall",
        "schema_version": 1,
        "audit": audit.name,
        "checks": len(rows),
        "verdicts": dict(sorted(Counter(row["verdict"] for row in rows).items())),
        "phases_s": {p: round(sum(r["phases_s"].get(p, 0.0) for r in rows), 1) for p in PHASES},
        "lock_wait_s": {
            p: round(sum(r["lock_wait_s"].get(p, 0.0) for r in rows), 1)
            for p in PHASES
            if any(p in r["lock_wait_s"] for r in rows)
        },
        "lock_wait_checks": sum(1 for r in rows if r["lock_wait_s"]),
        "stage_s": {s: round(sum(r["stage_s"].get(s, 0.0) for r in rows), 1) for s in STAGES},
        "blocks": {f"{block}: {how}": n for (block, how), n in sorted(ended.items())},
        "scratch": by_filesystem(rows),
        "run_wall_s": sum(run_wall(Path(p)) for p in snakemake_log) if snakemake_log else None,
        "rows": rows,
    }


def report_markdown(report: dict[str, Any], slowest: int = 10) -> str:
    lines = [f"# Where audit `{report['audit']}`'s time went", ""]
    wall = report["run_wall_s"]
    counted = ", ".join(f"{verdict} {n}" for verdict, n in report["verdicts"].items())
    lines.append(
        f"{report['checks']} checks ({counted})"
        + (f" in {wall:.0f} s of Snakemake wall time." if wall is not None else ".")
    )
    waits, recorded = report["lock_wait_s"], report["lock_wait_checks"]
    lines += [
        "",
        f"| phase (the checker's) | seconds, summed | of which waiting for the GPU lock "
        f"({recorded} of {report['checks']} checks record it) |",
        "|---|---|---|",
    ]
    lines += [
        f"| {name} | {value:.1f} | " + (f"{waits[name]:.1f}" if name in waits else "") + " |"
        for name, value in report["phases_s"].items()
    ]
    lines += ["", "| candidate stage (self-reported) | seconds, summed |", "|---|---|"]
    lines += [f"| {name} | {value:.1f} |" for name, value in report["stage_s"].items()]
    lines += ["", "| timing block: how it ended | blocks |", "|---|---|"]
    lines += [f"| {name} | {count} |" for name, count in report["blocks"].items()]
    lines += ["", "| scratch filesystem | checks | GB estimated |", "|---|---|---|"]
    lines += [
        f"| {name} | {entry['checks']} | {entry['gb']:.1f} |"
        for name, entry in report["scratch"].items()
    ]
    walls = sorted(report["rows"], key=lambda r: -sum(r["phases_s"].values()))[:slowest]
    lines += ["", f"Slowest {len(walls)} checks:", ""]
    head = "| entry | verdict | scratch GB | " + " | ".join(PHASES) + " |"
    lines += [head, "|---" * (3 + len(PHASES)) + "|"]
    for row in walls:
        cells = [f"{row['phases_s'].get(p, 0.0):.0f}" for p in PHASES]
        where = f"{row['scratch_gb']:.1f} ({row['scratch_filesystem']})"
        lines.append(f"| {row['entry']} | {row['verdict']} | {where} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
