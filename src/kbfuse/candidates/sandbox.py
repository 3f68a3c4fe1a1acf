"""A child process for untrusted code: a sandbox, a wall-time limit, a memory limit, a scratch
folder.

`run_child(role, request, view, limits, log, sandbox)` runs `python -m kbfuse.candidates.child
ROLE REQUEST` in `view.folder` and watches it until it ends. With `sandbox` (a `bwrap.Bwrap`,
the default of kbfuse.candidates.check) the child runs inside bubblewrap
(kbfuse.candidates.bwrap: read-only system, its folder the only writable one, private /tmp
and /dev/shm, no network, a pid namespace of its own); without one (`--unsandboxed`) it is
only the leader of a new session and process group, as before the sandbox existed.

The processes of a child are every process of its pid namespace (sandboxed: a `setsid` does
not leave it) or of its process group (unsandboxed). Of those:

- wall time: past `time_limit_s` they are killed (SIGKILL; sandboxed, to the namespace's init,
  and the kernel kills the rest);
- memory: their resident sets are summed from /proc every `POLL_S` (nvcc, ninja and whatever
  else the child starts included); past `memory_limit_mb` they are killed. RLIMIT_AS is not
  used on purpose: CUDA reserves far more address space than it uses (tens of GiB on an H200
  for unified addressing) and fails to initialise under a bound that would be meaningful for
  host memory. A process can allocate and touch memory faster than one poll, so the limit is
  enforced within `POLL_S`, not to the byte. Files in the private /tmp and /dev/shm are not
  resident memory: those are capped by their size instead (bwrap.TMPFS_BYTES);
- files: core dumps are off (RLIMIT_CORE 0) and no file the child writes, its log included,
  can grow past FILE_BYTES (RLIMIT_FSIZE); cwd, HOME, TMPDIR and every cache folder (torch
  extensions, Triton, Inductor, CuPy, the CUDA compute cache under HOME) are in the child's
  folder, so builds and caches of one child never reach another's;
- environment: sandboxed, only the variables a build or the GPU needs (ENV_KEPT) pass;
- when the child's first process exits, whatever is left of it is killed too, and the call
  returns only once every process of the child is gone: the parent then reads what the
  child left with nothing of it still running.

A `Handoff` lets the child ask, once, to have the GPU alone (kbfuse.workflow.gpulock): the
child writes its `request` file and waits for the `granted` file; the parent, which held the
lock shared for the child until then, stops every process of the child (SIGSTOP), gives the
shared hold up, waits to be alone, and lets them go on (SIGCONT), in a thread while its loop
goes on watching memory. So the child never runs while another job may be timing (work it
queued on the device before it asked can still run). The time the parent waits for the lock
is not counted against `time_limit_s` (`lock_wait_s` in the outcome); a child that asks early
only waits longer. A child that writes `granted` itself gains nothing: the parent still holds
the lock (shared), so no other job times meanwhile.

The outcome says which limit ended the child, if any, with the peak RSS seen.
"""

from __future__ import annotations

import contextlib
import json
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
from kbfuse.candidates import bwrap
from kbfuse.untrusted import read_tail

POLL_S = 0.05
PAGE = os.sysconf("SC_PAGE_SIZE")
FILE_BYTES = 4 << 30
LOG_TAIL_BYTES = 4000
REAP_TIMEOUT_S = 30.0  # after a kill, how long the parent waits for the child to be gone
# The environment variables a sandboxed child keeps (names, or prefixes ending in "_").
ENV_KEPT = (
    "PATH", "LANG", "LANGUAGE", "TZ", "TERM", "USER", "LOGNAME", "LD_LIBRARY_PATH", "CC", "CXX",
    "LC_", "CUDA_", "NVIDIA_", "NVCC_", "TORCH_", "PYTORCH_", "TRITON_", "CUPY_", "OMP_",
    "MKL_", "OPENBLAS_", "KBFUSE_", "PYTHON",
)  # fmt: skip


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
    sandbox: str = "bwrap"  # or "none" (--unsandboxed)

    def as_dict(self) -> dict:
        return asdict(self)


# ------------------------------------------------------------------ the processes of a child


def _all_pids() -> list[str]:
    return [entry.name for entry in os.scandir("/proc") if entry.name.isdigit()]


def _stat_fields(pid: str) -> list[bytes] | None:
    """/proc/PID/stat's fields after the command name (state first), or None when gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            return handle.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None


class Group:
    """The processes of an unsandboxed child: its process group (the child leads it)."""

    kind = "none"

    def __init__(self) -> None:
        self.leader: int | None = None

    def command(self, argv: list[str]) -> tuple[list[str], tuple[int, ...]]:
        return argv, ()

    def started(self, proc: subprocess.Popen) -> None:
        self.leader = proc.pid

    def stats(self) -> list[list[bytes]]:
        found = []
        for pid in _all_pids():
            fields = _stat_fields(pid)
            if fields is not None and int(fields[2]) == self.leader:
                found.append(fields)
        return found

    def signal(self, signum: int) -> None:
        with contextlib.suppress(ProcessLookupError, TypeError):
            os.killpg(self.leader, signum)

    def kill(self, proc: subprocess.Popen) -> None:
        self.signal(signal.SIGKILL)
        proc.wait()

    def close(self) -> None:
        pass


class Sandboxed:
    """The processes of a sandboxed child: every process of its pid namespace, found through
    the pid of the namespace's init that bwrap writes to its --info-fd."""

    kind = "bwrap"

    def __init__(self, binary: str, view: bwrap.View, env: dict[str, str]) -> None:
        self.binary, self.view, self.env = binary, view, env
        self.init: int | None = None
        self.namespace: str | None = None
        self._info, self._buffer, self._write = -1, b"", -1

    def command(self, argv: list[str]) -> tuple[list[str], tuple[int, ...]]:
        self._info, self._write = os.pipe()
        os.set_blocking(self._info, False)
        return [*bwrap.arguments(self.binary, self.view, self.env, self._write), "--", *argv], (
            self._write,
        )

    def started(self, proc: subprocess.Popen) -> None:
        os.close(self._write)
        self._write = -1

    def _read_info(self) -> None:
        if self.init is not None or self._info < 0:
            return
        with contextlib.suppress(BlockingIOError):
            while chunk := os.read(self._info, 4096):
                self._buffer += chunk
                if len(self._buffer) > 65536:
                    break
        with contextlib.suppress(ValueError):
            pid = int(json.loads(self._buffer)["child-pid"])
            self.namespace = os.readlink(f"/proc/{pid}/ns/pid")
            self.init = pid

    def members(self) -> list[str]:
        """Every process of the pid namespace (a scan of /proc: the kernels kbfuse runs on
        have no /proc/PID/task/TID/children to walk the init's descendants)."""
        self._read_info()
        if self.namespace is None:
            return []
        return [pid for pid in _all_pids() if self._inside(pid)]

    def _inside(self, pid: str) -> bool:
        try:
            return os.readlink(f"/proc/{pid}/ns/pid") == self.namespace
        except OSError:
            return False

    def stats(self) -> list[list[bytes]]:
        return [f for f in map(_stat_fields, self.members()) if f is not None]

    def signal(self, signum: int) -> None:
        for pid in self.members():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signum)

    def kill(self, proc: subprocess.Popen) -> None:
        """Kill the namespace's init (the kernel kills the rest), then wait for bwrap."""
        if proc.poll() is None:
            self._read_info()
            if self.init is not None:
                if self._inside(str(self.init)):
                    with contextlib.suppress(OSError):
                        os.kill(self.init, signal.SIGKILL)
            else:
                proc.kill()  # not started yet: --die-with-parent takes the rest down
        try:
            proc.wait(timeout=REAP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def close(self) -> None:
        for fd in (self._info, self._write):
            if fd >= 0:
                os.close(fd)
        self._info = self._write = -1


def _rss_bytes(stats: list[list[bytes]]) -> int:
    return sum(int(fields[21]) * PAGE for fields in stats)


def _wait_until_stopped(processes, limit_s: float = 2.0) -> None:
    """A signal is delivered asynchronously: wait until every process shows the stopped state
    (or is gone), stopping again any that started since."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if all(fields[0] in (b"T", b"t", b"Z", b"X") for fields in processes.stats()):
            return
        processes.signal(signal.SIGSTOP)
        time.sleep(0.001)


# ------------------------------------------------------------------ the GPU handoff


def _create(path: Path) -> None:
    """Create an empty file where the child may have put anything: a link there is removed,
    never followed (the parent would otherwise create or touch the file it points to)."""
    with contextlib.suppress(FileNotFoundError, IsADirectoryError, PermissionError):
        path.unlink()
    with contextlib.suppress(OSError):
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_NOFOLLOW, 0o644))


class Handoff:
    """The parent's side of the child's one request to have the GPU alone. `lock` is a
    gpulock.GpuLock (or anything with `shared()` and `alone()` context managers); the child
    holds it shared from `start()` until it asks, then alone until `close()`."""

    def __init__(self, lock, folder: Path):
        self.lock = lock
        self.request, self.granted = folder / "alone.request", folder / "alone.granted"
        self._stack = contextlib.ExitStack()
        self._thread: threading.Thread | None = None
        self.processes = None  # the child's processes (attach)

    def paths(self) -> dict[str, str]:
        return {"request": str(self.request), "granted": str(self.granted)}

    def start(self) -> None:
        for path in (self.request, self.granted):
            path.unlink(missing_ok=True)
        self._stack.enter_context(self.lock.shared())

    def attach(self, processes) -> None:
        self.processes = processes

    def waiting(self) -> bool:
        """Is the parent waiting for the lock on the child's behalf? (starts the wait when the
        child has just asked)"""
        if self._thread is None and os.path.lexists(self.request):
            self._thread = threading.Thread(target=self._switch, daemon=True)
            self._thread.start()
        return self._thread is not None and self._thread.is_alive()

    def _switch(self) -> None:
        # Between giving up the shared hold and being alone, another job may be timing: every
        # process of the child is stopped meanwhile, so it launches nothing on the device.
        self.processes.signal(signal.SIGSTOP)
        _wait_until_stopped(self.processes)
        try:
            self._stack.close()
            self._stack.enter_context(self.lock.alone())
            _create(self.granted)
        finally:
            self.processes.signal(signal.SIGCONT)

    def close(self) -> None:
        if self._thread is not None:
            self._thread.join()
        self._stack.close()


class Turns:
    """The parent's side of a trusted child's turns on the GPU (the reference): the child
    asks for each turn with a file `gpu.{n}.ask` in its folder; the parent takes `lock`
    shared for it and says so (`gpu.{n}.held`); when the child has finished its device work
    and synchronized (`gpu.{n}.done`) the parent lets the lock go. Between turns the child
    holds nothing while it writes its cases to disk, so a job waiting to have the GPU alone
    waits for one turn, not for the child's whole run. The same interface as Handoff
    (start, attach, waiting, close): the parent's waits are not the child's time."""

    def __init__(self, lock, folder: Path):
        self.lock, self.folder = lock, folder
        self.turn = 0
        self.held = False
        self._stack = contextlib.ExitStack()
        self._thread: threading.Thread | None = None

    def paths(self) -> dict[str, str]:
        return {"folder": str(self.folder)}

    def _file(self, what: str) -> Path:
        return self.folder / f"gpu.{self.turn}.{what}"

    def start(self) -> None:
        for stale in self.folder.glob("gpu.*"):
            stale.unlink()

    def attach(self, processes) -> None:
        pass

    def waiting(self) -> bool:
        """Is the parent waiting for the lock on the child's behalf? (gives up a finished
        turn's hold, starts the wait for a turn the child has just asked for)"""
        if self._thread is not None:
            if self._thread.is_alive():
                return True
            self._thread = None
        if self.held and os.path.lexists(self._file("done")):
            self._stack.close()
            self.held = False
            self.turn += 1
        if not self.held and os.path.lexists(self._file("ask")):
            self._thread = threading.Thread(target=self._take, daemon=True)
            self._thread.start()
            return True
        return False

    def _take(self) -> None:
        self._stack.enter_context(self.lock.shared())
        self.held = True
        _create(self._file("held"))

    def close(self) -> None:
        if self._thread is not None:
            self._thread.join()
        self._stack.close()
        self.held = False


# ------------------------------------------------------------------ running a child


def child_env(folder: Path, sandboxed: bool) -> dict[str, str]:
    """The environment of a child: this one (sandboxed: only ENV_KEPT), with HOME and every
    cache and temp folder in its folder and kbfuse importable from the same place as here."""
    env = dict(os.environ)
    if sandboxed:
        env = {k: v for k, v in env.items() if k in ENV_KEPT or k.startswith(_PREFIXES)}
    for name, sub in (
        ("HOME", "home"),
        ("TMPDIR", "tmp"),
        ("XDG_CACHE_HOME", "cache"),
        ("TORCH_EXTENSIONS_DIR", "torch_extensions"),
        ("TORCHINDUCTOR_CACHE_DIR", "inductor_cache"),
        ("TRITON_CACHE_DIR", "triton_cache"),
        ("CUPY_CACHE_DIR", "cupy_cache"),
    ):
        path = folder / sub
        path.mkdir(parents=True, exist_ok=True)
        env[name] = str(path)
    source_root = str(Path(kbfuse.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (source_root, env.get("PYTHONPATH")) if p)
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


_PREFIXES = tuple(name for name in ENV_KEPT if name.endswith("_") or name == "PYTHON")


def _limit_files() -> None:
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_FSIZE, (FILE_BYTES, FILE_BYTES))


def run_child(
    role: str,
    request: Path,
    view: bwrap.View,
    limits: Limits,
    log: Path,
    binary: str | None,
    env: dict[str, str] | None = None,
    handoff: Handoff | Turns | None = None,
) -> Outcome:
    """Run one child role on `request` under `limits`, sandboxed by the bwrap at `binary`
    (None: unsandboxed); never raises for what the child does. `env` adds to the child's
    environment; `handoff` holds the GPU lock for the child: a Handoff (shared, then alone
    when it asks) or Turns (shared for each turn it asks for)."""
    folder = view.folder
    folder.mkdir(parents=True, exist_ok=True)
    log.parent.mkdir(parents=True, exist_ok=True)
    child = {**child_env(folder, binary is not None), **(env or {})}
    processes = Group() if binary is None else Sandboxed(binary, view, child)
    argv = [sys.executable, "-m", "kbfuse.candidates.child", role, str(request)]
    command, fds = processes.command(argv)
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
    try:
        with open(log, "ab") as sink:
            proc = subprocess.Popen(
                command,
                cwd=folder,
                env=child,
                stdin=subprocess.DEVNULL,
                stdout=sink,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                pass_fds=fds,
                preexec_fn=_limit_files,
            )
        processes.started(proc)
        if handoff is not None:
            handoff.attach(processes)
        while proc.poll() is None:
            rss = _rss_bytes(processes.stats())
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
                break
            time.sleep(POLL_S)
        processes.kill(proc)  # whatever is left of the child (unsandboxed: of its group)
    finally:
        processes.close()
    if paused_since is not None:
        paused += time.monotonic() - paused_since
    if handoff is not None:
        handoff.close()
    returncode = proc.returncode if status == "exited" else -signal.SIGKILL
    if status != "exited":
        with open(log, "a") as sink:
            sink.write(f"\nkbfuse: {role} process killed: {status}\n")
    return Outcome(
        role=role,
        status=status,
        returncode=returncode,
        wall_s=round(time.monotonic() - start - paused, 3),
        peak_rss_mb=round(peak / 2**20, 1),
        log_tail=read_tail(log, LOG_TAIL_BYTES).decode("utf-8", errors="replace"),
        lock_wait_s=round(shared_wait + paused, 3),
        sandbox=processes.kind,
    )
