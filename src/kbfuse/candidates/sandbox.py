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

A `Handoff` lets the child ask, once, to have the GPU alone (kbfuse.workflow.gpulock): the
child writes its `request` file and waits for the `granted` file; the parent, which held the
lock shared for the child until then, stops the child's process group (SIGSTOP), gives the
shared hold up, waits to be alone, and lets the group go on (SIGCONT), in a thread while its
loop goes on watching memory. So the child never runs while another job may be timing (work
it queued on the device before it asked can still run). The time the parent waits for the
lock is not counted against `time_limit_s` (`lock_wait_s` in the outcome); a child that asks
early only waits longer.

The outcome says which limit ended the process, if any, with the peak RSS seen.
"""

from __future__ import annotations

import contextlib
import os
import resource
import signal
import subprocess
import sys
import threading
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
    lock_wait_s: float = 0.0  # waiting for the GPU alone (Handoff), not in wall_s

    def as_dict(self) -> dict:
        return asdict(self)


class Handoff:
    """The parent's side of the child's one request to have the GPU alone. `lock` is a
    gpulock.GpuLock (or anything with `shared()` and `alone()` context managers); the child
    holds it shared from `start()` until it asks, then alone until `close()`."""

    def __init__(self, lock, folder: Path):
        self.lock = lock
        self.request, self.granted = folder / "alone.request", folder / "alone.granted"
        self._stack = contextlib.ExitStack()
        self._thread: threading.Thread | None = None
        self.pgid: int | None = None  # the child's process group (attach)

    def paths(self) -> dict[str, str]:
        return {"request": str(self.request), "granted": str(self.granted)}

    def start(self) -> None:
        for path in (self.request, self.granted):
            path.unlink(missing_ok=True)
        self._stack.enter_context(self.lock.shared())

    def attach(self, pgid: int) -> None:
        self.pgid = pgid

    def waiting(self) -> bool:
        """Is the parent waiting for the lock on the child's behalf? (starts the wait when the
        child has just asked)"""
        if self._thread is None and self.request.exists():
            self._thread = threading.Thread(target=self._switch, daemon=True)
            self._thread.start()
        return self._thread is not None and self._thread.is_alive()

    def _switch(self) -> None:
        # Between giving up the shared hold and being alone, another job may be timing: the
        # child's whole group is stopped meanwhile, so it launches nothing on the device.
        _signal_group(self.pgid, signal.SIGSTOP)
        _wait_until_stopped(self.pgid)
        try:
            self._stack.close()
            self._stack.enter_context(self.lock.alone())
            self.granted.touch()
        finally:
            _signal_group(self.pgid, signal.SIGCONT)

    def close(self) -> None:
        if self._thread is not None:
            self._thread.join()
        self._stack.close()


def _group_stats(pgid: int) -> list[list[bytes]]:
    """The /proc/*/stat fields after the command name (state first) of every process whose
    process group is `pgid`."""
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as handle:
                fields = handle.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid:
            found.append(fields)
    return found


def group_rss_bytes(pgid: int) -> int:
    """Resident bytes of every process whose process group is `pgid` (from /proc/*/stat)."""
    return sum(int(fields[21]) * PAGE for fields in _group_stats(pgid))


def _wait_until_stopped(pgid: int, limit_s: float = 2.0) -> None:
    """A signal is delivered asynchronously: wait until every process of the group shows the
    stopped state (or is gone)."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if all(fields[0] in (b"T", b"t", b"Z", b"X") for fields in _group_stats(pgid)):
            return
        time.sleep(0.001)


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


def _signal_group(pgid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signum)


def _kill_group(pgid: int) -> None:
    _signal_group(pgid, signal.SIGKILL)


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
    handoff: Handoff | None = None,
) -> Outcome:
    """Run one child role on `request` under `limits`; never raises for what the child does.
    `env` overrides the child's environment (the witness's shared extensions cache);
    `handoff` holds the GPU lock for the child (shared, then alone when it asks)."""
    scratch.mkdir(parents=True, exist_ok=True)
    log.parent.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "kbfuse.candidates.child", role, str(request)]
    limit_bytes = limits.memory_limit_mb * 1024 * 1024
    shared_wait = 0.0
    if handoff is not None:  # the shared hold, before the child's clock starts
        asked = time.monotonic()
        handoff.start()
        shared_wait = time.monotonic() - asked
    start = time.monotonic()
    # seconds the parent waited for the GPU alone on the child's behalf: not the child's time
    paused, paused_since = 0.0, None
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
        if handoff is not None:
            handoff.attach(proc.pid)
        while proc.poll() is None:
            rss = group_rss_bytes(proc.pid)
            peak = max(peak, rss)
            now = time.monotonic()
            waiting = handoff is not None and handoff.waiting()
            if waiting and paused_since is None:
                paused_since = now
            elif not waiting and paused_since is not None:
                paused, paused_since = paused + now - paused_since, None
            counted = now - start - paused - (now - paused_since if waiting else 0.0)
            if rss > limit_bytes:
                status = "memory_limit"
            elif counted > limits.time_limit_s:
                status = "time_limit"
            if status != "exited":
                _kill_group(proc.pid)
                proc.wait()
                break
            time.sleep(POLL_S)
        _kill_group(proc.pid)
    if paused_since is not None:
        paused += time.monotonic() - paused_since
    if handoff is not None:
        handoff.close()
    if status != "exited":
        with open(log, "a") as sink:
            sink.write(f"\nkbfuse: {role} process killed: {status}\n")
    return Outcome(
        role=role,
        status=status,
        returncode=proc.returncode,
        wall_s=round(time.monotonic() - start - paused, 3),
        peak_rss_mb=round(peak / 2**20, 1),
        log_tail=_tail(log),
        lock_wait_s=round(shared_wait + paused, 3),
    )
