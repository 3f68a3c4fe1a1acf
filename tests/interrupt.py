"""Kill a snakemake run with SIGKILL at a named kbfuse pause point (see kbfuse.faults)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import snakefork
from conftest import snakemake


def kill_at(workdir: Path, point: str, marker: Path, *args: str, timeout: float = 300) -> None:
    """Start `snakemake --cores 1 *args` (tests/snakefork.py), wait until a job reaches `point`,
    SIGKILL everything."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(workdir / "src"), env.get("PYTHONPATH")]))
    env["KBFUSE_PAUSE_AT"] = point
    env["KBFUSE_PAUSE_MARKER"] = str(marker)
    marker.unlink(missing_ok=True)
    output = marker.with_name(marker.name + ".out")
    # its own process group (session): the kill reaches every job
    proc = snakefork.start(["--cores", "1", *args], workdir, env, output, new_session=True)
    deadline = time.monotonic() + timeout
    try:
        while not marker.exists():
            if proc.poll() is not None:
                out = output.read_text(errors="replace")
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
