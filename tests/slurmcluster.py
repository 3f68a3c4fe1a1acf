"""A throwaway Slurm cluster for the tests (tools/slurm-local.sh) and what they ask it.

`Cluster.start(folder)` starts one (munge, MariaDB, slurmdbd, slurmctld, slurmd, about 5 s on
two cores) with everything in `folder`; `stop()` stops exactly its daemons. `env` is the
environment a Snakemake run needs to reach it (SLURM_CONF, and the srun the script puts first
on PATH; see the script). `missing()` says why one cannot start here (Slurm or MariaDB not
installed, not root), or None.

What Snakemake's Slurm plugin printed about the jobs it submitted is read by `submitted`; what
the scheduler knows of them by `Cluster.sacct` (the accounting records) and
`Cluster.show_job` (`scontrol show job`, as one dict of its `Key=Value` fields). ACCOUNT,
PARTITION and GPU_MODEL are the names the script gives its account, partition and GPUs.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "tools" / "slurm-local.sh"
NOT_INSTALLED = 3  # the script's exit status for "cannot run here"
UNSETTLED = {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "REQUEUED", "RESIZING"}


def _setting(name: str) -> str:
    return re.search(rf"^{name}=(\S+)$", SCRIPT.read_text(), re.M).group(1)


# What the script names its cluster's account and partition and its GPUs' model.
ACCOUNT, PARTITION, GPU_MODEL = _setting("ACCOUNT"), _setting("PARTITION"), _setting("GPU_TYPE")
# the plugin's line for each job it submits
_SUBMITTED = re.compile(
    r"^Job (\d+) has been submitted with SLURM jobid (\S+) "
    r"\(log: (\S*/rule_(\w+)/(?:(\S+)/)?\S+\.log)\)",
    re.M,
)


def missing() -> str | None:
    """Why the script cannot start a cluster here (its own words), or None."""
    proc = subprocess.run(["bash", str(SCRIPT), "check"], capture_output=True, text=True)
    if proc.returncode == 0:
        return None
    if proc.returncode == NOT_INSTALLED:
        return proc.stderr.strip()
    raise AssertionError(f"{SCRIPT.name} check failed ({proc.returncode}): {proc.stderr}")


@dataclass(frozen=True)
class Submitted:
    """A job the plugin submitted: Snakemake's job id, its Slurm id, rule and wildcards."""

    jobid: str
    slurm_id: str
    rule: str
    wildcards: str
    slurm_log: Path


def submitted(output: str) -> list[Submitted]:
    """The jobs a Snakemake run's output says it submitted to Slurm."""
    return [
        Submitted(jobid, slurm_id, rule, wildcards or "", Path(log))
        for jobid, slurm_id, log, rule, wildcards in _SUBMITTED.findall(output)
    ]


def run_id(output: str) -> str:
    """The plugin's run id (every Slurm job of the run is named after it)."""
    return re.search(r"^SLURM run ID: (\S+)$", output, re.M).group(1)


class Cluster:
    def __init__(self, folder: Path):
        self.folder = folder
        self.env = _sourced_env(folder / "env")

    @classmethod
    def start(cls, folder: Path) -> Cluster:
        _script("start", folder)
        return cls(folder)

    def stop(self) -> None:
        _script("stop", self.folder)

    def pids(self) -> dict[str, int]:
        """The pid of each daemon it runs, by name (its pid files)."""
        return {p.stem: int(p.read_text()) for p in (self.folder / "run").glob("*.pid")}

    def command(self, *args: str) -> str:
        """A Slurm command's output, run against this cluster."""
        proc = subprocess.run(args, env=self.env, capture_output=True, text=True, timeout=60)
        if proc.returncode != 0:
            raise AssertionError(f"{' '.join(args)} failed ({proc.returncode}): {proc.stderr}")
        return proc.stdout

    def sacct(self, name: str, timeout: float = 30) -> dict[str, dict[str, str]]:
        """The accounting records of the jobs named `name` (a run id), by job id, once none is
        still pending or running there (slurmctld tells slurmdbd a job's end a moment after
        squeue, which the plugin reads, knows it)."""
        fields = ("JobIDRaw", "JobName", "State", "Comment", "Account", "Partition")
        deadline = time.monotonic() + timeout
        while True:
            out = self.command("sacct", "-X", "-P", "-n", "--name", name,
                               "--format", ",".join(fields))  # fmt: skip
            rows = [dict(zip(fields, line.split("|"), strict=True)) for line in out.splitlines()]
            unsettled = [row for row in rows if row["State"] in UNSETTLED]
            if not unsettled or time.monotonic() > deadline:
                return {row["JobIDRaw"]: row for row in rows}
            time.sleep(0.5)

    def show_job(self, slurm_id: str) -> dict[str, str]:
        """`scontrol show job` of one job, its `Key=Value` fields as a dict."""
        out = self.command("scontrol", "show", "job", slurm_id)
        return dict(re.findall(r"(?:^|\s)([\w/:]+)=(\S*)", out))


def _script(action: str, folder: Path) -> None:
    proc = subprocess.run(["bash", str(SCRIPT), action, str(folder)], capture_output=True,
                          text=True, timeout=180)  # fmt: skip
    if proc.returncode != 0:
        raise AssertionError(f"{SCRIPT.name} {action} failed ({proc.returncode}):\n"
                             f"{proc.stdout}\n{proc.stderr}")  # fmt: skip


def _sourced_env(env_file: Path) -> dict[str, str]:
    """os.environ with SLURM_CONF and PATH as they are after `source env_file` in bash."""
    dump = 'source "$1" && printf "%s\\0%s" "$SLURM_CONF" "$PATH"'
    proc = subprocess.run(["bash", "-c", dump, "bash", str(env_file)], capture_output=True,
                          text=True, check=True)  # fmt: skip
    conf, path = proc.stdout.split("\0")
    return {**os.environ, "SLURM_CONF": conf, "PATH": path}
