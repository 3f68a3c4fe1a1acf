"""A Snakemake run forked from the tests' Snakemake server (tests/snakefork.py) is what a fresh
`python -m snakemake` is: the same working directory, environment, module search path and
arguments, the kbfuse its own PYTHONPATH names, the same return code for an exit, a failure or
a signal, the same timeout; runs the server cannot stand for are plain subprocesses."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import snakefork

HERE = Path(__file__).resolve().parent


@pytest.fixture(autouse=True)
def _server_allowed(monkeypatch):
    """These tests are about the server: used even where KBFUSE_TEST_SNAKEFORK=0 is set."""
    monkeypatch.delenv(snakefork.DISABLE_VARIABLE, raising=False)


# Runs at the Snakefile's parse, in the Snakemake process itself.
PROBE = """
import json, os, sys
import kbfuse
print("PROBE " + json.dumps({
    "cwd": os.getcwd(), "path": sys.path, "argv": sys.argv, "name": __name__,
    "variable": os.environ.get("KBFUSE_PROBE"), "ppid": os.getppid(), "kbfuse": kbfuse.__file__,
    "stdin": os.path.realpath(f"/proc/self/fd/0"),
}))
{extra}

rule all:
    shell: "true"
"""


def _workflow(tmp_path, extra=""):
    """A Snakefile that prints what its process is, and a fake kbfuse in ./lib."""
    (tmp_path / "lib/kbfuse").mkdir(parents=True)
    (tmp_path / "lib/kbfuse/__init__.py").write_text("")
    (tmp_path / "Snakefile").write_text(PROBE.replace("{extra}", extra))
    env = dict(os.environ, KBFUSE_PROBE="seen", PYTHONPATH=os.pathsep.join(["lib", "", "/x/../y"]))
    return tmp_path, env


def _line(proc: subprocess.CompletedProcess, prefix: str) -> str:
    """The rest of the first line of the run's output that starts with `prefix`."""
    return next(line for line in proc.stdout.splitlines() if line.startswith(prefix))[len(prefix) :]


def _probe(proc: subprocess.CompletedProcess) -> dict:
    return json.loads(_line(proc, "PROBE "))


def _plain(argv, cwd, env, timeout=120):
    return subprocess.run([sys.executable, "-m", "snakemake", *argv], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)  # fmt: skip


ARGS = ["--cores", "1", "--dry-run", "--quiet", "all"]


def test_a_forked_run_is_what_a_fresh_snakemake_process_is(tmp_path):
    workdir, env = _workflow(tmp_path)
    forked = snakefork.run(ARGS, cwd=workdir, env=env, timeout=120)
    plain = _plain(ARGS, workdir, env)
    assert (forked.returncode, plain.returncode) == (0, 0)
    assert forked.args == plain.args
    assert _without_probe(forked) == _without_probe(plain)
    seen, expected = _probe(forked), _probe(plain)
    assert seen.pop("ppid") != os.getpid() and expected.pop("ppid") == os.getpid()
    # the fork's stdin is /dev/null, the plain run's this process's (under xdist, its pipe)
    assert seen.pop("stdin") == os.devnull
    expected.pop("stdin")
    assert seen == expected
    assert seen["path"][:4] == [str(workdir), str(workdir / "lib"), str(workdir), "/y"]
    # the fake kbfuse of its PYTHONPATH, not one imported before the fork (an installed one)
    assert seen["kbfuse"] == str(workdir / "lib/kbfuse/__init__.py")
    assert seen["variable"] == "seen"
    assert seen["argv"][0].endswith("snakemake/__main__.py") and seen["argv"][1:] == ARGS


WARMTH = """
import gc, importlib
registries = [getattr(importlib.import_module(module), name)._instance
              for module, name in snakefork.PLUGIN_REGISTRIES]
print("WARMTH", gc.get_freeze_count(), sum(hasattr(r, "plugins") for r in registries))
"""


def test_a_forked_run_starts_with_the_plugins_found_and_the_imports_frozen(tmp_path):
    """What makes a fork cheaper than its imports alone: Snakemake's plugin registries had
    searched the path in the server, and the server's objects are out of the garbage
    collector's way."""
    workdir, env = _workflow(tmp_path, f"import sys\nsys.path.insert(0, {str(HERE)!r})\n"
                             "import snakefork\n" + WARMTH)  # fmt: skip
    forked = snakefork.run(ARGS, cwd=workdir, env=env, timeout=120)
    frozen, collected = map(int, _line(forked, "WARMTH ").split())
    assert frozen > 100_000 and collected == len(snakefork.PLUGIN_REGISTRIES)
    frozen, collected = map(int, _line(_plain(ARGS, workdir, env), "WARMTH ").split())
    # a plain run has found them too by then (its arguments name plugins), each time anew
    assert frozen == 0 and collected == len(snakefork.PLUGIN_REGISTRIES)


def test_a_closed_server_has_ended_and_been_waited_for():
    # (its CPU time, and its runs', then count in this process's children: `time` sees it)
    server = snakefork._Server()
    assert server.proc.poll() is None
    server.close()
    assert server.proc.returncode == 0


@pytest.mark.parametrize(
    ("extra", "code", "message"),
    [
        ("sys.exit('a message of its own')", 1, "a message of its own"),
        ("raise ValueError('broken Snakefile')", 1, "broken Snakefile"),
        ("os.kill(os.getpid(), signal.SIGKILL)", -signal.SIGKILL, ""),
    ],
    ids=["exit", "exception", "signal"],
)
def test_an_ending_run_gives_the_return_code_and_output_of_a_fresh_one(
    tmp_path, extra, code, message
):
    workdir, env = _workflow(tmp_path, "import signal\n" + extra)
    forked = snakefork.run(ARGS, cwd=workdir, env=env, timeout=120)
    plain = _plain(ARGS, workdir, env)
    assert forked.returncode == plain.returncode == code
    assert message in forked.stdout + forked.stderr
    assert _without_probe(forked) == _without_probe(plain)


# Lines that differ from one run to the next: the probe's (its parent), the date and the run's
# identifier in Snakemake's header, the time stamp before each job.
VARYING = re.compile(r"PROBE |Date: |Workflow ID: |\[\w{3} \w{3} [ \d]\d \d\d:\d\d:\d\d \d{4}\]$")


def _without_probe(proc: subprocess.CompletedProcess) -> tuple[str, str]:
    def steady(text):
        return [line for line in text.splitlines(True) if not VARYING.match(line.strip())]

    return "".join(steady(proc.stdout)), "".join(steady(proc.stderr))


def test_a_run_past_its_timeout_is_killed_and_raises(tmp_path):
    pid_file = tmp_path / "pid"
    sleeper, env = _workflow(tmp_path / "sleeper", f"open({str(pid_file)!r}, 'w').write("
                             "str(os.getpid()))\nimport time; time.sleep(60)")  # fmt: skip
    with pytest.raises(subprocess.TimeoutExpired, match=r"timed out after 3 seconds"):
        snakefork.run(ARGS, cwd=sleeper, env=env, timeout=3)
    with pytest.raises(ProcessLookupError, match="No such process"):  # killed and reaped
        os.kill(int(pid_file.read_text()), 0)
    after, env = _workflow(tmp_path / "after")  # the server still serves
    assert _probe(snakefork.run(ARGS, cwd=after, env=env, timeout=120))["variable"] == "seen"


def test_runs_the_server_cannot_stand_for_are_plain_subprocesses(tmp_path, monkeypatch):
    workdir, env = _workflow(tmp_path)
    other_seed = dict(env, PYTHONHASHSEED="7")  # read by a new interpreter at its start
    assert _probe(snakefork.run(ARGS, cwd=workdir, env=other_seed, timeout=120))["ppid"] == (
        os.getpid()
    )
    server = snakefork._get_server()
    with server.lock:  # a run in progress on another thread
        assert _probe(snakefork.run(ARGS, cwd=workdir, env=env, timeout=120))["ppid"] == (
            os.getpid()
        )
    monkeypatch.setenv(snakefork.DISABLE_VARIABLE, "0")
    assert _probe(snakefork.run(ARGS, cwd=workdir, env=env, timeout=120))["ppid"] == os.getpid()


def test_the_module_path_is_the_interpreters():
    assert snakefork.module_path("/w", "a:/b/../c::", ["/std"]) == [
        "/w",
        "/w/a",
        "/c",
        "/w",
        "/w",
        "/std",
    ]
    assert snakefork.module_path("/w", None, ["/std"]) == ["/w", "/std"]
    assert snakefork.module_path("/w", "", ["/std"]) == ["/w", "/std"]


SLEEPER = """
import subprocess
open("group", "w").write(f"{os.getpid()} {os.getpgid(0)} {os.getsid(0)}")
print("to stdout", flush=True)
print("to stderr", file=sys.stderr, flush=True)
child = subprocess.Popen(["sleep", "60"])  # a job of the run: the group kill must reach it
open("child", "w").write(str(child.pid))
child.wait()
"""


@pytest.mark.parametrize("forked", [True, False], ids=["forked", "plain"])
def test_a_started_run_in_its_own_session_dies_whole_with_its_group(tmp_path, monkeypatch, forked):
    if not forked:
        monkeypatch.setenv(snakefork.DISABLE_VARIABLE, "0")
    workdir, env = _workflow(tmp_path, SLEEPER)
    proc = snakefork.start(ARGS, workdir, env, tmp_path / "out", new_session=True)
    assert isinstance(proc, snakefork.Started) is forked
    deadline = time.monotonic() + 60
    while not (workdir / "child").exists():
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    time.sleep(0.1)  # (the pid is written before the file is closed)
    pid, group, session = map(int, (workdir / "group").read_text().split())
    assert pid == group == session == proc.pid  # a session and a process group of its own
    assert proc.poll() is None
    os.killpg(proc.pid, signal.SIGKILL)
    assert proc.wait() == -signal.SIGKILL and proc.returncode == -signal.SIGKILL
    assert proc.poll() == -signal.SIGKILL
    child = int((workdir / "child").read_text())
    deadline = time.monotonic() + 10
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(child)
    output = (tmp_path / "out").read_text()
    assert "to stdout\n" in output and "to stderr\n" in output  # both streams, one file


def _alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie, killed but not yet reaped by its parent, does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except FileNotFoundError:
        return False


def test_a_started_run_ends_with_its_own_return_code(tmp_path):
    workdir, env = _workflow(tmp_path, "sys.exit('stopped')")
    proc = snakefork.start(ARGS, workdir, env, Path(os.devnull))
    assert isinstance(proc, snakefork.Started)
    assert proc.wait() == 1 and proc.poll() == 1


def test_the_server_keeps_the_pythonpath_entries_that_hold_no_kbfuse(tmp_path):
    """Where Snakemake itself comes from PYTHONPATH (the GPU machine's `pip install --target`
    folder), the server can import it; a folder with a kbfuse in it stays out of the server."""
    (tmp_path / "src/kbfuse").mkdir(parents=True)
    (tmp_path / "site").mkdir()
    given = os.pathsep.join([str(tmp_path / "src"), "", str(tmp_path / "site"), "rel"])
    expected = os.pathsep.join([str(tmp_path / "site"), os.path.abspath("rel")])
    assert snakefork.server_pythonpath(given) == expected
    assert snakefork.server_pythonpath(str(tmp_path / "src")) is None
    assert snakefork.server_pythonpath(None) is None
