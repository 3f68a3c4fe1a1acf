"""Where a finished run's wall time went, from what Snakemake leaves behind: the `benchmark:`
file of every job (column `s`: the job's wall seconds) and the run log's `Elapsed time:` line.

`study_wall` reports the study (every job's file under results/benchmarks/ but the survey's):
seconds per stage, the stages whose rules hold the GPU alone (`resources: gpu=1`, so they run
one after another whatever --cores says: the floor of the run's wall time), the run's wall
time and the parallelism it reached (sum of job seconds / wall seconds). The survey's own
report (kbfuse.survey.wall) splits its jobs further, from their records.
"""

from __future__ import annotations

import csv
import re
from datetime import datetime
from pathlib import Path
from typing import Any

from kbfuse.errors import KbfuseError

ELAPSED = re.compile(r"^Elapsed time: (\d+):(\d\d):(\d\d(?:\.\d+)?)\s*$", re.M)
STAMP = re.compile(r"^\[(\w{3} \w{3} +\d{1,2} \d\d:\d\d:\d\d \d{4})\]", re.M)
# The stages of the rules declaring `resources: gpu=1` (timing, the controls and the task-81
# witness, the environment fingerprint); tests/test_jobtimes.py reads them from the rules.
ALONE_STAGES = ("controls", "env", "timing")
SKIPPED_STAGES = ("survey",)


def benchmark_seconds(path: Path) -> float:
    """The `s` column of one Snakemake benchmark file (the last row when repeated)."""
    with open(path, newline="") as fh:
        rows = list(csv.DictReader(fh, delimiter="\t"))
    try:
        return float(rows[-1]["s"])
    except (IndexError, KeyError, ValueError):
        raise KbfuseError(
            f"{path}: no wall seconds (column s) in a Snakemake benchmark file"
        ) from None


def run_wall(snakemake_log: Path) -> float:
    """The run's wall seconds from a Snakemake run log: its `Elapsed time:` line, else (a run
    that did not finish) the first to the last `[timestamp]` line."""
    text = snakemake_log.read_text(errors="replace")
    elapsed = ELAPSED.findall(text)
    if elapsed:
        hours, minutes, seconds = elapsed[-1]
        return 3600 * int(hours) + 60 * int(minutes) + float(seconds)
    stamps = [
        datetime.strptime(" ".join(s.split()), "%a %b %d %H:%M:%S %Y") for s in STAMP.findall(text)
    ]
    if len(stamps) < 2:
        raise KbfuseError(f"{snakemake_log}: neither 'Elapsed time:' nor two [timestamp] lines")
    return (max(stamps) - min(stamps)).total_seconds()


def study_wall(results: str | Path, snakemake_log: str | Path | None = None) -> dict[str, Any]:
    """The report: one row per job (its stage and name, seconds), seconds per stage, the
    alone stages' sum and, with the run log, the wall time and the parallelism."""
    results = Path(results)
    root = results / "benchmarks"
    tsvs = sorted(
        p for p in root.rglob("*.tsv") if p.relative_to(root).parts[0] not in SKIPPED_STAGES
    )
    if not tsvs:
        raise KbfuseError(f"no Snakemake benchmark files under {root}/")
    jobs = []
    for tsv in tsvs:
        stage, *rest = tsv.relative_to(root).with_suffix("").parts
        jobs.append({"stage": stage, "job": "/".join(rest), "s": benchmark_seconds(tsv)})
    stages: dict[str, dict[str, Any]] = {}
    for job in jobs:
        alone = job["stage"] in ALONE_STAGES
        entry = stages.setdefault(job["stage"], {"jobs": 0, "s": 0.0, "alone": alone})
        entry["jobs"] += 1
        entry["s"] += job["s"]
    total = sum(job["s"] for job in jobs)
    report: dict[str, Any] = {
        "kind": "study_wall",
        "schema_version": 1,
        "jobs": jobs,
        "stages": stages,
        "job_s": total,
        "alone_s": sum(entry["s"] for entry in stages.values() if entry["alone"]),
        "wall_s": None,
        "parallelism": None,
    }
    if snakemake_log is not None:
        report["wall_s"] = run_wall(Path(snakemake_log))
        report["parallelism"] = total / report["wall_s"] if report["wall_s"] else None
    return report


def study_markdown(report: dict[str, Any]) -> str:
    """Seconds per stage (the alone stages marked), the totals and the run's wall time."""
    lines = [
        "| stage | jobs | seconds | share of job time | holds the GPU alone |",
        "|---|---|---|---|---|",
    ]
    total = report["job_s"]
    for name, entry in sorted(report["stages"].items(), key=lambda item: -item[1]["s"]):
        share = f"{100 * entry['s'] / total:.0f}%"
        alone = "yes" if entry["alone"] else ""
        lines.append(f"| {name} | {entry['jobs']} | {entry['s']:.1f} | {share} | {alone} |")
    lines.append(f"| all jobs | {len(report['jobs'])} | {total:.1f} | 100% | |")
    lines.append(
        f"| alone stages (the floor) | | {report['alone_s']:.1f} | "
        f"{100 * report['alone_s'] / total:.0f}% | yes |"
    )
    if report["wall_s"] is not None:
        lines.append(
            f"| run wall (Snakemake's Elapsed time) | | {report['wall_s']:.1f} | "
            f"parallelism {report['parallelism']:.2f} | |"
        )
    return "\n".join(lines) + "\n"
