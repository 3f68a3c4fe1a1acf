"""Why Slurm ended a failed job of the cluster profile, in words that name the rule and the
resource to raise.

With profiles/slurm every job but the `localrules` is one Slurm job. When Slurm kills one,
snakemake-executor-plugin-slurm (2.8) reports the state it reads from sacct and a reason that
says little: a job killed for its memory by Slurm's accounting poll (jobacct_gather with
OverMemoryKill) ends `FAILED`, "Reason: Unknown" (only a cgroup limit gives `OUT_OF_MEMORY`);
one past its time limit ends `TIMEOUT`. Neither names the resource a user would raise, and
Slurm's own words are in the job's Slurm log, which Snakemake names but does not show.

`explain_failures`, called by the Snakefile's `onerror` with Snakemake's log of the run, finds
each failed Slurm job there (its `Error in rule` block: rule, job id, Slurm job id, Slurm log),
the resources Snakemake asked for it (its `rule` block: mem_mb, runtime) and Slurm's verdict in
its Slurm log, and prints one line per job it can explain:

    kbfuse: rule compile_variant (nvrtc-cubin-noftz), Slurm job 12: killed for exceeding its
    memory, 142.33 MB used of mem_mb=100. Raise mem_mb for compile_variant under set-resources in
    profiles/slurm.

A local run's log holds no Slurm job, and a job that failed on its own (its rule's log says
why) is left to Snakemake's message: nothing is printed for either.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

# A job block of Snakemake's log: "rule NAME:" / "localrule NAME:" / "Error in rule NAME:",
# then its fields, each indented four spaces.
_BLOCK = re.compile(
    r"^(Error in rule|localrule|rule|checkpoint) (\w+):\n((?:    .*(?:\n|$))+)", re.M
)
_FIELD = re.compile(r"^    (\w+): (.*)$", re.M)
_SLURM_LOG = re.compile(r"(\S*/slurm_logs/rule_[^/\s]+/(?:(\S+)/)?[^/\s]+\.log)")
_STATUS = re.compile(r"SLURM status is: '(\w+)'")
# Slurm's words in a job's log (slurmstepd): the accounting poll's kill, as seen on 22.05 here;
# a cgroup memory limit's "Detected N oom_kill event(s)" ("oom-kill" in older versions); the
# time limit and a cancellation, as seen here.
_OVER_MEMORY = re.compile(r"exceeded memory limit \((\d+) > (\d+)\)")
_OOM_KILL = re.compile(r"oom[-_]kill event", re.I)
_TIME_LIMIT = "DUE TO TIME LIMIT"
_CANCELLED = re.compile(r"\*\*\* JOB \S+ ON \S+ CANCELLED AT")
PROFILE = "profiles/slurm"


@dataclass(frozen=True)
class FailedJob:
    """A Slurm job of the run that failed: what Snakemake's log says of it."""

    rule: str
    slurm_id: str
    status: str  # the state the plugin read ('' if it said none)
    slurm_log: Path | None
    wildcards: str  # as the plugin names the Slurm log's folder ('' for none)
    resources: dict[str, str]


def failed_jobs(text: str) -> list[FailedJob]:
    """The failed Slurm jobs in Snakemake's log `text`, in the order it reports them."""
    resources: dict[str, dict[str, str]] = {}
    failed = []
    for match in _BLOCK.finditer(text):
        kind, rule, body = match.groups()
        fields = dict(_FIELD.findall(body))
        if kind in ("rule", "checkpoint") and "jobid" in fields:
            resources[fields["jobid"]] = _resources(fields.get("resources", ""))
        elif kind == "Error in rule" and fields.get("external_jobid"):
            log = _SLURM_LOG.search(fields.get("log", ""))
            status = _STATUS.search(fields.get("message", ""))
            failed.append(
                FailedJob(
                    rule=rule,
                    slurm_id=fields["external_jobid"],
                    status=status.group(1) if status else "",
                    slurm_log=Path(log.group(1)) if log else None,
                    wildcards=(log.group(2) or "") if log else "",
                    resources=resources.get(fields.get("jobid", ""), {}),
                )
            )
    return failed


def _resources(field: str) -> dict[str, str]:
    """Snakemake's "resources: a=1, b=2 GB" field as {name: value}."""
    pairs = (item.split("=", 1) for item in field.split(", ") if "=" in item)
    return {name.strip(): value.strip() for name, value in pairs}


def explain(job: FailedJob, slurm_log_text: str) -> str | None:
    """One line naming the rule and the resource Slurm ended `job` for; None when its Slurm
    log and state show no limit and no cancellation (the job failed on its own)."""
    where = f"kbfuse: rule {job.rule}" + (f" ({job.wildcards})" if job.wildcards else "")
    where += f", Slurm job {job.slurm_id}"
    raise_it = f"Raise {{}} for {job.rule} under set-resources in {PROFILE}."
    over = _OVER_MEMORY.search(slurm_log_text)
    mem = _asked(job, "mem_mb")
    if over or _OOM_KILL.search(slurm_log_text) or job.status == "OUT_OF_MEMORY":
        used = f"{int(over.group(1)) / 2**20:.2f} MB used of " if over else ""
        return f"{where}: killed for exceeding its memory, {used}{mem}. {raise_it.format('mem_mb')}"
    if _TIME_LIMIT in slurm_log_text or job.status == "TIMEOUT":
        runtime = _asked(job, "runtime", " min")
        return f"{where}: cancelled at its time limit, {runtime}. {raise_it.format('runtime')}"
    if _CANCELLED.search(slurm_log_text) or job.status == "CANCELLED":
        return (
            f"{where}: cancelled (scancel, or the site). Run the same command again: the jobs"
            " that finished are kept, the cancelled one runs again."
        )
    return None


def _asked(job: FailedJob, name: str, unit: str = "") -> str:
    value = job.resources.get(name)
    return f"{name}={value}{unit}" if value else f"{name} as asked"


def explain_failures(
    logs: str | Path | Iterable[str | Path], out: TextIO = sys.stderr
) -> list[str]:
    """Print (to `out`) and return a line for each failed Slurm job in Snakemake's log(s)
    `logs` (what `onerror` gets: a path, or a list of them) that Slurm ended for a limit or
    cancelled."""
    paths = [logs] if isinstance(logs, str | Path) else list(logs)
    lines = []
    for path in paths:
        for job in failed_jobs(_read(Path(path))):
            line = explain(job, _read(job.slurm_log) if job.slurm_log else "")
            if line:
                lines.append(line)
                print(line, file=out, flush=True)
    return lines


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:  # a log removed or never written: nothing to explain from it
        return ""
