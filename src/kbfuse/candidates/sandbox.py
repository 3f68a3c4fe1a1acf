"""A child process for untrusted code: wall-time limit, memory limit, scratch directory.

`run_child(role, request, scratch, limits, log)` runs `python -m kbfuse.candidates.child ROLE
REQUEST` in `scratch` as the leader of a new session and process group, and watches it:

- wall time: past `time_limit_s` the whole process group gets SIGKILL;
- memory: the resident set of every process of the group (the interpreter, and nvcc, ninja or
  any other process it starts) is summed from /proc every `POLL_S`; past `memory_limit_mb` the
  group gets SIGKILL. RLIMIT_AS is not used on purpose: CUDA reserves far more address space
  than it uses (tens of GiB on an H200 for unified addressing) and fails to initialise under
  a bound that would be meaningful for host memory. A process can allocate and touch memory
  faster than one poll, so the limit is enforced within `POLL_S`, not to the byte;
- scratch: cwd, TMPDIR, TORCH_EXTENSIONS_DIR, TRITON_CACHE_DIR and CUPY_CACHE_DIR all point
  inside `scratch`, so builds and caches of one candidate never reach another's;
- core dumps are off (RLIMIT_CORE 0);
- when the leader exits, whatever is left of its group is killed too.

The outcome says which limit ended the process, if any, with the peak RSS seen.
"""

from __future__ import annotations

import contextlib
import os
import resource
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import kbfuse

POLL_S = 0.05
PAGE = os.sysconf("SC_PAGE_SIZE")


@dataclass(frozen=True)
class Limits:
    time_limit_s: float
    memory_limit_mb: int


@dataclass(frozen=True)
class Outcome:
    role: str
    status: str  # "exited", "time_limit", "memory_limit"
    returncode: int | None
    wall_s: float
    peak_rss_mb: float
    log_tail: str

    def as_dict(self) -> dict:
        return asdict(self)


def group_rss_bytes(pgid: int) -> int:
    """Resident bytes of every process whose process group is `pgid` (from /proc/*/stat)."""
    total = 0
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as handle:
                fields = handle.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid:
            total += int(fields[21]) * PAGE
    return total


def child_env(scratch: Path) -> dict[str, str]:
    """The environment of a child: this one, with every cache and temp folder in scratch and
    kbfuse importable from the same place as in this process."""
    env = dict(os.environ)
    for name, sub in (
        ("TMPDIR", "tmp"),
        ("TORCH_EXTENSIONS_DIR", "torch_extensions"),
        ("TRITON_CACHE_DIR", "triton_cache"),
        ("CUPY_CACHE_DIR", "cupy_cache"),
    ):
        folder = scratch / sub
        folder.mkdir(parents=True, exist_ok=True)
        env[name] = str(folder)
    source_root = str(Path(kbfuse.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (source_root, env.get("PYTHONPATH")) if p)
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def _no_core_dumps() -> None:
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)


def _tail(path: Path, limit: int = 4000) -> str:
    try:
        data = path.read_bytes()
    except OSError:
        return ""
    return data[-limit:].decode("utf-8", errors="replace")


def run_child(
    role: str,
    request: Path,
    scratch: Path,
    limits: Limits,
    log: Path,
    env: dict[str, str] | None = None,
) -> Outcome:
    """Run one child role on `request` under `limits`; never raises for what the child does.
    `env` overrides the child's environment (the witness's shared extensions cache)."""
    scratch.mkdir(parents=True, exist_ok=True)
    log.parent.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "kbfuse.candidates.child", role, str(request)]
    limit_bytes = limits.memory_limit_mb * 1024 * 1024
    start = time.monotonic()
    status, peak = "exited", 0
    with open(log, "ab") as sink:
        proc = subprocess.Popen(
            command,
            cwd=scratch,
            env={**child_env(scratch), **(env or {})},
            stdin=subprocess.DEVNULL,
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_no_core_dumps,
        )
        while proc.poll() is None:
            rss = group_rss_bytes(proc.pid)
            peak = max(peak, rss)
            if rss > limit_bytes:
                status = "memory_limit"
            elif time.monotonic() - start > limits.time_limit_s:
                status = "time_limit"
            if status != "exited":
                _kill_group(proc.pid)
                proc.wait()
                break
            time.sleep(POLL_S)
        _kill_group(proc.pid)
    if status != "exited":
        with open(log, "a") as sink:
            sink.write(f"\nkbfuse: {role} process killed: {status}\n")
    return Outcome(
        role=role,
        status=status,
        returncode=proc.returncode,
        wall_s=round(time.monotonic() - start, 3),
        peak_rss_mb=round(peak / 2**20, 1),
        log_tail=_tail(log),
    )
