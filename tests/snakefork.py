"""`python -m snakemake` for the tests, without importing Snakemake again for every run.

A Snakemake start costs about 1.3 CPU s on the CI machine, of which about 0.8 s imports
Snakemake, its plugins and their libraries (pandas, SQLAlchemy, docutils, ...); the suite
starts it well over a hundred times. `run` hands each run to a server process (one per test
process, started at its first run) that has imported all that once, let Snakemake's plugin
registries search for their plugins, and frozen its objects out of the garbage collector's
way (`gc.freeze`; a forked dry run of the workflow then takes 0.3 CPU s instead of 0.5): the
server forks a child, and the child becomes the run a fresh `python -m snakemake` would have
been:

- its working directory, environment and arguments are the run's; its standard input is
  /dev/null (the server's), its standard output and error go to files the caller reads back;
- Snakemake's run directory (read from the working directory when Snakemake is imported) is
  the run's;
- its module search path is the one the interpreter would build from the run's PYTHONPATH
  (the working directory first, as with `-m`, then PYTHONPATH's entries made absolute, then
  the interpreter's own path), and `snakemake/__main__.py` runs as `__main__`;
- it exits as the interpreter does (Snakemake's SystemExit, atexit handlers, flushed streams),
  and a signal that ends it gives the negative return code that subprocess gives.

Nothing of kbfuse is imported before the fork (the server checks), so every run imports the
kbfuse its own PYTHONPATH names (the copied workflow's `src`). Where the run's environment
changes what a new interpreter would be at its start (PYTHONHASHSEED, PYTHONWARNINGS, the
locale, ...), or the server cannot be used (a second thread, KBFUSE_TEST_SNAKEFORK=0), the run
is a plain subprocess. One difference stays: the runs forked by one server share its seed
for hashing strings (a fresh interpreter draws its own), so an order that depends on string
hashes, such as a set's, is the same in every run of one test process.

`start` is the same for a run in the background (subprocess.Popen's part the tests use: pid,
poll, wait; a session of its own where asked, for a kill of its whole process group).

Protocol, one request at a time, each a JSON line: {"op": "run" or "start", argv, cwd, env,
stdout, stderr, new_session} is answered {"pid": ...} once the child is forked, and for "run"
then {"status": ...} (the wait status) when it has ended; {"op": "wait", pid, block} on a
started run is answered with its wait status, or null while it runs.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import locale
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

DISABLE_VARIABLE = "KBFUSE_TEST_SNAKEFORK"

# Environment variables a new interpreter reads at its start (besides PYTHONPATH, which the
# child applies itself): a run that sets any of them differently from the server's start
# gets a plain subprocess.
STARTUP_VARIABLES = (
    "PYTHONHOME",
    "PYTHONSAFEPATH",
    "PYTHONNOUSERSITE",
    "PYTHONUSERBASE",
    "PYTHONHASHSEED",
    "PYTHONWARNINGS",
    "PYTHONIOENCODING",
    "PYTHONUTF8",
    "PYTHONUNBUFFERED",
    "PYTHONDONTWRITEBYTECODE",
    "PYTHONPYCACHEPREFIX",
    "PYTHONOPTIMIZE",
    "PYTHONDEVMODE",
    "PYTHONFAULTHANDLER",
    "PYTHONTRACEMALLOC",
    "PYTHONINTMAXSTRDIGITS",
    "PYTHONSTARTUP",
    "PYTHONEXECUTABLE",
    "LANG",
    "LC_ALL",
    "LC_CTYPE",
)

# What a Snakemake start imports besides kbfuse (python -X importtime of a dry-run).
WARM_IMPORTS = (
    "snakemake.cli",
    "snakemake.report",
    "snakemake.report.html_reporter",
    "snakemake.shell",
    "snakemake.caching",
    "smart_open",
    "jsonschema",
    "nbformat",
    "yaml",
)


# --------------------------------------------------------------------------- server


# Snakemake's plugin registries: each searches the module path for its plugins (and imports
# them) on its first use, about 0.1 CPU s of every run together.
PLUGIN_REGISTRIES = (
    ("snakemake_interface_executor_plugins.registry", "ExecutorPluginRegistry"),
    ("snakemake_interface_storage_plugins.registry", "StoragePluginRegistry"),
    ("snakemake_interface_report_plugins.registry", "ReportPluginRegistry"),
    ("snakemake_interface_logger_plugins.registry", "LoggerPluginRegistry"),
    ("snakemake_interface_scheduler_plugins.registry", "SchedulerPluginRegistry"),
)


def _warm() -> None:
    import gc
    import importlib

    for name in WARM_IMPORTS:
        importlib.import_module(name)
    for module, registry in PLUGIN_REGISTRIES:
        with contextlib.suppress(ImportError):  # a registry this Snakemake does not have
            getattr(importlib.import_module(module), registry)()
    assert not [m for m in sys.modules if m.split(".")[0] == "kbfuse"], "kbfuse imported"
    assert threading.active_count() == 1, "the server must be single-threaded to fork"
    # What the server holds is never garbage: frozen, the runs' collections skip it (a run
    # otherwise spends a fifth of its CPU time walking the imported modules' objects).
    gc.freeze()


def _read_line(fd: int) -> bytes:
    line = b""
    while not line.endswith(b"\n"):
        chunk = os.read(fd, 1)
        if not chunk:
            return b""
        line += chunk
    return line


def _send(fd: int, message: dict) -> None:
    os.write(fd, json.dumps(message).encode() + b"\n")


def serve() -> dict:
    """The server's loop; returns (in a forked child only) the request the child is to run."""
    requests, replies = os.dup(0), os.dup(1)  # not inherited by the runs' own children
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    os.dup2(2, 1)
    _warm()
    # the interpreter's own path, without this script's folder and the server's PYTHONPATH
    # (each run brings its own), as Snakemake's import leaves it (it appends its pip
    # deployments' folder)
    own = set((os.environ.get("PYTHONPATH") or "").split(os.pathsep))
    base_path = [entry for entry in sys.path[1:] if entry not in own]
    _send(replies, {"ready": os.getpid()})
    while line := _read_line(requests):
        request = json.loads(line)
        if request["op"] == "wait":  # on a started run: its wait status, or None
            flags = 0 if request["block"] else os.WNOHANG
            pid, status = os.waitpid(request["pid"], flags)
            _send(replies, {"status": status if pid else None})
            continue
        pid = os.fork()
        if pid == 0:
            os.close(requests)
            os.close(replies)
            return {**request, "base_path": base_path}
        _send(replies, {"pid": pid})
        if request["op"] == "run":  # "start" returns at once; its status comes with "wait"
            _, status = os.waitpid(pid, 0)
            _send(replies, {"status": status})
    os._exit(0)


def server_pythonpath(pythonpath: str | None) -> str | None:
    """The server's PYTHONPATH: the entries of this process's that hold no kbfuse (where
    Snakemake itself may live, e.g. a `pip install --target` folder), absolute."""
    entries = [
        os.path.abspath(entry)
        for entry in (pythonpath or "").split(os.pathsep)
        if entry and not os.path.exists(os.path.join(entry, "kbfuse"))
    ]
    return os.pathsep.join(entries) or None


def module_path(cwd: str, pythonpath: str | None, base_path: list[str]) -> list[str]:
    """sys.path of `python -m` started in `cwd` with PYTHONPATH `pythonpath`: the working
    directory, then PYTHONPATH's entries made absolute against it (an empty entry is the
    working directory), then the interpreter's own path."""
    entries = pythonpath.split(os.pathsep) if pythonpath else []
    return [cwd, *(os.path.normpath(os.path.join(cwd, entry)) for entry in entries), *base_path]


def become_the_run(request: dict) -> None:
    """In the forked child: take the run's directory, environment, path and streams, and run
    Snakemake's __main__ as `python -m snakemake` does (its SystemExit ends the process)."""
    import runpy

    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    sys.path[:] = module_path(os.getcwd(), os.environ.get("PYTHONPATH"), request["base_path"])
    # The one piece of process state Snakemake takes at its import: the working directory it
    # reports as the run directory (a class attribute, evaluated when the class is made).
    from snakemake.workflow import Workflow

    Workflow._rundir = str(Path.cwd().absolute())
    if request.get("new_session"):
        os.setsid()
    for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
        if fd == 2 and path == request["stdout"]:  # stderr into stdout, one file position
            os.dup2(1, 2)
            continue
        target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(target, fd)
        os.close(target)
    sys.argv = ["snakemake", *request["argv"]]
    runpy.run_module("snakemake", run_name="__main__", alter_sys=True)
    sys.exit(0)


# --------------------------------------------------------------------------- client


class _Server:
    def __init__(self) -> None:
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        if path := server_pythonpath(os.environ.get("PYTHONPATH")):
            env["PYTHONPATH"] = path
        self.startup = {key: env.get(key) for key in STARTUP_VARIABLES}
        self.proc = subprocess.Popen(
            [sys.executable, __file__],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            bufsize=0,  # unbuffered: select() then sees every reply
            env=env,
            cwd=tempfile.gettempdir(),
        )
        self.lock = threading.Lock()
        ready = self._reply(timeout=120)
        if "ready" not in ready:
            raise RuntimeError(f"the Snakemake server did not start: {ready}")

    def _reply(self, timeout: float) -> dict:
        readable, _, _ = select.select([self.proc.stdout], [], [], max(timeout, 0))
        if not readable:
            return {}
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the Snakemake server ended ({self.proc.wait()})")
        return json.loads(line)

    def close(self) -> None:
        """End the server and wait for it (its CPU time then counts in this process's)."""
        self.proc.stdin.close()
        self.proc.wait(timeout=60)

    def fits(self, env: dict) -> bool:
        return all(env.get(key) == value for key, value in self.startup.items())

    def request(self, **request) -> dict:
        """Send one request; its first reply."""
        self.proc.stdin.write(json.dumps(request).encode() + b"\n")
        return self._reply(timeout=60)

    def run(self, argv, cwd, env, timeout) -> subprocess.CompletedProcess:
        with tempfile.TemporaryDirectory(prefix="snakefork-") as tmp:
            out, err = Path(tmp, "stdout"), Path(tmp, "stderr")
            pid = self.request(op="run", argv=list(argv), cwd=str(cwd), env=env,
                               stdout=str(out), stderr=str(err))["pid"]  # fmt: skip
            deadline = time.monotonic() + timeout
            reply = self._reply(timeout=deadline - time.monotonic())
            if not reply:
                os.kill(pid, signal.SIGKILL)
                self._reply(timeout=60)
            stdout, stderr = _read_text(out), _read_text(err)
        args = [sys.executable, "-m", "snakemake", *argv]
        if not reply:
            raise subprocess.TimeoutExpired(args, timeout, stdout, stderr)
        return subprocess.CompletedProcess(args, _returncode(reply["status"]), stdout, stderr)


class Started:
    """A run started in the background by the server (`start`): the part of subprocess.Popen's
    interface the tests use (pid, returncode, poll, wait)."""

    def __init__(self, server: _Server, pid: int, args: list[str]) -> None:
        self.server, self.pid, self.args, self.returncode = server, pid, args, None

    def _wait(self, block: bool) -> int | None:
        if self.returncode is None:
            with self.server.lock:
                status = self.server.request(op="wait", pid=self.pid, block=block)["status"]
            if status is not None:
                self.returncode = _returncode(status)
        return self.returncode

    def poll(self) -> int | None:
        return self._wait(block=False)

    def wait(self) -> int:
        return self._wait(block=True)


def _read_text(path: Path) -> str:
    """As subprocess's text=True reads a stream: the locale's encoding, universal newlines."""
    return path.read_text(encoding=locale.getpreferredencoding(False))


def _returncode(status: int) -> int:
    """subprocess's return code of a wait status: the exit code, or minus the signal."""
    return -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


_server: _Server | None = None
_server_pid: int | None = None  # the process that started it (an xdist worker)


def _get_server() -> _Server:
    global _server, _server_pid
    if _server is None or _server_pid != os.getpid() or _server.proc.poll() is not None:
        _server, _server_pid = _Server(), os.getpid()
        atexit.register(_server.close)
    return _server


def run(argv, cwd, env: dict, timeout: float) -> subprocess.CompletedProcess:
    """`python -m snakemake *argv` in `cwd` with environment `env`, its output captured as text,
    as subprocess.run(..., capture_output=True, text=True, timeout=timeout) would."""
    if os.environ.get(DISABLE_VARIABLE) != "0":
        server = _get_server()
        if server.fits(env) and server.lock.acquire(blocking=False):
            try:
                return server.run(argv, cwd, env, timeout)
            finally:
                server.lock.release()
    return subprocess.run(
        [sys.executable, "-m", "snakemake", *argv],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def start(argv, cwd, env: dict, output: Path, new_session: bool = False):
    """`python -m snakemake *argv` started in the background, its standard output and error
    into the file `output` (os.devnull for none), in a session of its own where asked: a
    Started, or the subprocess.Popen that stands in where the server cannot be used."""
    args = [sys.executable, "-m", "snakemake", *argv]
    if os.environ.get(DISABLE_VARIABLE) != "0":
        server = _get_server()
        if server.fits(env) and server.lock.acquire(blocking=False):
            try:
                reply = server.request(op="start", argv=list(argv), cwd=str(cwd), env=env,
                                       stdout=str(output), stderr=str(output),
                                       new_session=new_session)  # fmt: skip
            finally:
                server.lock.release()
            return Started(server, reply["pid"], args)
    with open(output, "wb") as out:
        return subprocess.Popen(args, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=new_session)  # fmt: skip


if __name__ == "__main__":
    become_the_run(serve())
