"""Where a finished survey's wall time went: start-up, builds, waiting for the GPU, timing.

Read from what a survey run leaves behind, nothing re-run (benchmarks/survey_wall.py):

- Snakemake's `benchmark:` file of every survey job, `benchmarks/survey/{task}.tsv` (column
  `s`: the job's wall seconds, the script's process included; another level's under
  `benchmarks/survey/level<N>/`, its logs and records under `survey/level<N>/`);
- the job log, `survey/logs/tasks/{task}.log`, whose last line kbfuse.survey.job writes as
  `wrote N records (...) in <seconds> s` (the time inside the job's library call);
- the task's records, `survey/{mode}/tasks/{task}.json`, whose `phases_s` (the job's, the
  same in every mode's record) split that time: `load`, `wait_shared` (for the GPU lock, while
  another job timed), `reference_and_builds` (eager's references, the builds, correctness),
  `wait_alone` (for the other jobs to leave the GPU), `alone_builds` (the builds that
  benchmark kernels on the GPU, max-autotune's; 0 in records without it), `timing`, `profile`;
  and, within `reference_and_builds` and `alone_builds`, `official_trials` (KernelBench's
  trials: eager once per trial, the blind spots, every baseline's check; unknown, None, in
  records made before session 11, which did not time it apart) and, within
  `reference_and_builds`, `warm_builds` (max-autotune's warm-up compiles, kbfuse.survey.baselines;
  None in records made before session 17); after the GPU hold, `profile_read` (parsing the
  profiles' traces, CPU work; None in records made before session 21, whose `profile` held it).

Per job: `startup_s` = job seconds - seconds inside the library call (interpreter, imports,
Snakemake's preamble); `alone_s` = alone builds + timing + profile, the part no other job can
overlap. With
the Snakemake run log (`.snakemake/log/*.snakemake.log`) the report adds the run's wall time
(its `Elapsed time:` line) and the parallelism it reached (sum of job seconds / wall seconds);
the sum of `alone_s` against the wall says how close the run came to keeping the GPU busy
timing. On several GPUs (kbfuse.workflow.devices) each record names the GPU its job ran on
(`environment.gpu`): `devices` sums the jobs, their seconds and their alone seconds per GPU, so
a run shows whether its jobs spread over every GPU and how busy each one was kept timing.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from kbfuse.errors import KbfuseError
from kbfuse.layout import survey_root
from kbfuse.results.jobtimes import benchmark_seconds, run_wall
from kbfuse.results.records import parse_json, read_limited

INSIDE_LINE = re.compile(r"^wrote .* in ([0-9.]+) s\s*$", re.M)
RECORD_PHASES = (
    "load", "wait_shared", "reference_and_builds", "wait_alone", "alone_builds", "timing",
    "profile",
)  # fmt: skip
# Parts of other phases (named by what they are within): not added to them, absent from
# older records.
WITHIN_PHASES = {
    "official_trials": "the two builds phases",  # reference_and_builds and alone_builds
    "warm_builds": "reference_and_builds",
}
# Phases of their own that older records lack (blank there, not 0): reading the profiles
# after the job has left the GPU (before, it was part of `profile`).
LATER_PHASES = ("profile_read",)
OPTIONAL_PHASES = (*WITHIN_PHASES, *LATER_PHASES)
PHASES = ("startup_s", *(f"{p}_s" for p in (*RECORD_PHASES, *OPTIONAL_PHASES)), "alone_s")


def inside_seconds(log: Path) -> float | None:
    """Seconds inside the job's library call, from its log's last `wrote ... in N s` line."""
    if not log.is_file():
        return None
    found = INSIDE_LINE.findall(log.read_text(errors="replace"))
    return float(found[-1]) if found else None


def _first_record(results: Path, task: str, level: int) -> tuple[Path, object] | None:
    for record in sorted(results.glob(f"{survey_root(level)}/*/tasks/{task}.json")):
        return record, parse_json(read_limited(record), str(record))
    return None


def record_phases(results: Path, task: str, level: int = 2) -> dict | None:
    """The job's `phases_s` from the first of its records found (every mode's holds the same)."""
    found = _first_record(results, task, level)
    if found is None:
        return None
    record, data = found
    phases = data.get("phases_s") if isinstance(data, dict) else None
    if not isinstance(phases, dict):
        raise KbfuseError(f"{record}: field phases_s is missing")
    return phases


def record_gpu(results: Path, task: str, level: int = 2) -> dict | None:
    """The GPU the job ran on ({index, uuid, name}, its records' `environment.gpu`), or None
    (a CPU survey, or records from before they named it)."""
    found = _first_record(results, task, level)
    data = found[1] if found is not None else None
    environment = data.get("environment") if isinstance(data, dict) else None
    gpu = environment.get("gpu") if isinstance(environment, dict) else None
    if not isinstance(gpu, dict) or not isinstance(gpu.get("uuid"), str):
        return None
    return {"index": gpu.get("index"), "uuid": gpu["uuid"], "name": gpu.get("name")}


def job_row(results: Path, task: str, tsv: Path, level: int = 2) -> dict[str, Any]:
    job_s = benchmark_seconds(tsv)
    inside = inside_seconds(results / survey_root(level) / "logs" / "tasks" / f"{task}.log")
    phases = record_phases(results, task, level)
    notes = [] if phases is not None else ["no record (job failed?)"]
    if inside is None:
        notes.append("no 'wrote ... in N s' line in the log: start-up unknown")
    row: dict[str, Any] = {"task": int(task), "job_s": job_s}
    row["startup_s"] = job_s - inside if inside is not None else None
    for phase in RECORD_PHASES:
        row[f"{phase}_s"] = float(phases.get(phase, 0.0)) if phases is not None else None
    for phase in OPTIONAL_PHASES:
        known = phases is not None and phase in phases
        row[f"{phase}_s"] = float(phases[phase]) if known else None
    alone = ("alone_builds_s", "timing_s", "profile_s")
    row["alone_s"] = sum(row[p] for p in alone) if phases is not None else None
    row["gpu"] = record_gpu(results, task, level)
    row["notes"] = "; ".join(notes)
    return row


def per_device(jobs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per GPU named by the jobs' records: its jobs, their seconds and alone seconds."""
    devices: dict[str, dict[str, Any]] = {}
    for job in jobs:
        gpu = job.get("gpu")
        if gpu is None:
            continue
        row = devices.setdefault(gpu["uuid"], {**gpu, "jobs": 0, "job_s": 0.0, "alone_s": 0.0})
        row["jobs"] += 1
        row["job_s"] += job["job_s"]
        row["alone_s"] += job["alone_s"] or 0.0
    return sorted(devices.values(), key=lambda d: (d["index"] is None, d["index"], d["uuid"]))


def survey_wall(results: str | Path, snakemake_log=None, level: int = 2) -> dict[str, Any]:
    """The report: one row per survey job of KernelBench level `level`, totals per phase, and
    the run's wall time.

    `snakemake_log`: the run's Snakemake log, or a list of them when the survey ran in several
    pieces (stopped and resumed): the wall time is then their sum."""
    results = Path(results)
    folder = results / "benchmarks" / survey_root(level)
    tsvs = sorted(folder.glob("*.tsv"))
    if not tsvs:
        raise KbfuseError(f"no survey benchmark files under {folder}/")
    jobs = sorted((job_row(results, t.stem, t, level) for t in tsvs), key=lambda r: r["task"])
    totals = {"job_s": sum(r["job_s"] for r in jobs)}
    for phase in PHASES:
        known = [r[phase] for r in jobs if r[phase] is not None]
        totals[phase] = sum(known) if known else None
    report: dict[str, Any] = {
        "kind": "survey_wall",
        "schema_version": 1,
        "results": str(results),
        "jobs": jobs,
        "totals": totals,
        "devices": per_device(jobs),
        "wall_s": None,
        "parallelism": None,
    }
    if snakemake_log is not None:
        logs = [snakemake_log] if isinstance(snakemake_log, str | Path) else list(snakemake_log)
        report["runs"] = len(logs)
        report["wall_s"] = sum(run_wall(Path(log)) for log in logs)
        report["parallelism"] = totals["job_s"] / report["wall_s"] if report["wall_s"] else None
    return report


def _fmt(value: Any) -> str:
    return "" if value is None else f"{value:.1f}" if isinstance(value, float) else str(value)


def report_markdown(report: dict[str, Any], slowest: int = 10) -> str:
    """Totals per phase (seconds, share of the jobs' seconds), then the slowest jobs."""
    totals = report["totals"]
    lines = ["| phase | seconds | share of job time |", "|---|---|---|"]
    for phase in ("job_s", *PHASES):
        value = totals[phase]
        share = "" if value is None else f"{100 * value / totals['job_s']:.0f}%"
        name = phase.removesuffix("_s")
        if name in WITHIN_PHASES:
            name += f" (within {WITHIN_PHASES[name]})"
        lines.append(f"| {name} | {_fmt(value)} | {share} |")
    if report["wall_s"] is not None:
        lines.append(
            f"| run wall ({report.get('runs', 1)} Snakemake log(s)) | {_fmt(report['wall_s'])} | "
            f"parallelism {report['parallelism']:.2f} |"
        )
    columns = ("task", "job_s", "startup_s", "reference_and_builds_s", "wait_shared_s",
               "wait_alone_s", "alone_s", "notes")  # fmt: skip
    lines += [
        "",
        "| task | job s | start-up s | references and builds s | waited (shared) s "
        "| waited (alone) s | alone (autotune builds, timing, profile) s | notes |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in sorted(report["jobs"], key=lambda r: -r["job_s"])[:slowest]:
        lines.append("| " + " | ".join(_fmt(r[c]) for c in columns) + " |")
    if report.get("devices"):
        lines += ["", "| GPU | UUID | name | jobs | job s | alone s |", "|---|---|---|---|---|---|"]
        for d in report["devices"]:
            cells = (d["index"], d["uuid"], d["name"], d["jobs"], d["job_s"], d["alone_s"])
            lines.append("| " + " | ".join(_fmt(c) for c in cells) + " |")
    return "\n".join(lines) + "\n"
