"""Kill a snakemake run with SIGKILL at a named kbfuse pause point (see kbfuse.faults)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from conftest import snakemake


def kill_at(workdir: Path, point: str, marker: Path, *args: str, timeout: float = 300) -> None:
    """Start `snakemake --cores 1 *args`, wait until a job reaches `point`, SIGKILL everything."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(workdir / "src"), env.get("PYTHONPATH")]))
    env["KBFUSE_PAUSE_AT"] = point
    env["KBFUSE_PAUSE_MARKER"] = str(marker)
    marker.unlink(missing_ok=True)
    proc = subprocess.Popen(
        [sys.executable, "-m", "snakemake", "--cores", "1", *args],
        cwd=workdir,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # its own process group: the kill reaches every job
    )
    deadline = time.monotonic() + timeout
    try:
        while not marker.exists():
            if proc.poll() is not None:
                out = proc.stdout.read().decode(errors="replace")
                raise AssertionError(f"run ended before reaching {point}:\n{out}")
            if time.monotonic() > deadline:
                raise AssertionError(f"run did not reach {point} in {timeout} s")
            time.sleep(0.05)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def snakemake_run(workdir: Path, *args: str):
    """Recover as README says (unlock a stale lock), then run to completion."""
    snakemake(workdir, "--unlock", *args)
    return snakemake(workdir, "--cores", "1", *args)
