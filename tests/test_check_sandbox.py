"""The sandbox of a check's children (kbfuse.candidates.bwrap, kbfuse.candidates.sandbox):
finding a bwrap that works or saying why not, what a child's bwrap command shows it, the
environment it keeps, and the parent's side of the GPU handoff where the child controls the
files."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from contracts import contract_file

from kbfuse.candidates import bwrap, sandbox
from kbfuse.errors import KbfuseError

ROOT = Path(__file__).resolve().parents[1]
GOOD = ROOT / "tests" / "candidates" / "cpu" / "good.py"
TASK53 = ROOT / "tests" / "candidates" / "cpu" / "task53_small.py"


def test_a_missing_bwrap_is_named_with_what_to_do(monkeypatch, tmp_path):
    monkeypatch.setenv(bwrap.ENV_BWRAP, str(tmp_path / "nowhere" / "bwrap"))
    with pytest.raises(KbfuseError, match=r"KBFUSE_BWRAP=\S+nowhere/bwrap is not an executable"):
        bwrap.require()
    monkeypatch.delenv(bwrap.ENV_BWRAP)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(KbfuseError, match=r"needs bubblewrap \(bwrap\), which is not on PATH: "):
        bwrap.require()


def test_a_bwrap_that_cannot_make_namespaces_is_named(monkeypatch, tmp_path):
    fake = tmp_path / "bwrap"
    fake.write_text(
        "#!/bin/sh\n"
        'if [ "$1" = --version ]; then echo "bubblewrap 0.0"; exit 0; fi\n'
        'if [ "$1" = --help ]; then exit 0; fi\n'
        "echo 'bwrap: No permissions to create a new namespace' >&2; exit 1\n"
    )
    fake.chmod(0o755)
    monkeypatch.setenv(bwrap.ENV_BWRAP, str(fake))
    with pytest.raises(KbfuseError, match="cannot make a sandbox here .*No permissions to create"):
        bwrap.require()


def test_kbfuse_check_without_bwrap_stops_before_any_child(tmp_path):
    out = tmp_path / "v.json"
    env = {
        **os.environ,
        bwrap.ENV_BWRAP: str(tmp_path / "missing"),
        "PYTHONPATH": str(ROOT / "src"),
    }
    command = [sys.executable, "-m", "kbfuse.workflow.cli", "check", str(GOOD), "--task", "2/53"]
    command += ["--task-file", str(TASK53), "--device", "cpu", "--out", str(out)]
    command += ["--contract", contract_file(tmp_path)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert done.stderr.startswith("kbfuse check: KBFUSE_BWRAP=")
    assert "--unsandboxed" in done.stderr and "Traceback" not in done.stderr
    assert not out.exists() and not list(tmp_path.glob("*.log"))


def test_the_working_bwrap_is_found_and_tried():
    path, version = bwrap.require()
    assert Path(path).name == "bwrap" and version.startswith("bubblewrap ")


def _pairs(args: list[str], option: str) -> list[tuple[str, str]]:
    return [(args[i + 1], args[i + 2]) for i, a in enumerate(args) if a == option]


def test_a_childs_view_read_only_system_its_folder_writable_the_rest_hidden(tmp_path):
    src = tmp_path / "src"
    (src / "results").mkdir(parents=True)
    folder = tmp_path / "scratch" / "candidate"
    view = bwrap.View(folder, hidden=(src / "results", tmp_path / "scratch"))
    env = {"PATH": "/usr/bin:relative/bin:/", "PYTHONPATH": str(src)}
    args = bwrap.arguments("/usr/bin/bwrap", view, env, 7)
    assert args[:5] == ["/usr/bin/bwrap", "--unshare-all", "--unshare-user", "--cap-drop", "ALL"]
    for flag in ("--die-with-parent", "--new-session", "--disable-userns"):
        assert flag in args
    assert args[args.index("--info-fd") + 1] == "7"
    ro = _pairs(args, "--ro-bind")
    assert (str(src), str(src)) in ro and ("/usr", "/usr") in ro
    assert all(a != "/" and not a.startswith("relative") for a, _ in ro)
    assert not any(a.startswith(str(tmp_path / "scratch")) for a, _ in ro)  # nor a sibling's
    assert _pairs(args, "--bind") == [(str(folder), str(folder))]
    tmpfs = [args[i + 1] for i, a in enumerate(args) if a == "--tmpfs"]
    assert tmpfs == ["/tmp", "/dev/shm", str(src / "results")]  # hidden though under src
    assert args.index("--tmpfs") < args.index("--ro-bind")  # /tmp first, binds on top
    sizes = [args[i + 1] for i, a in enumerate(args) if a == "--size"]
    assert sizes == [str(bwrap.TMPFS_BYTES)] * 2
    assert args[-4:] == ["--remount-ro", "/", "--chdir", str(folder)]
    assert "--dev-bind-try" not in args  # no GPU asked for


def test_a_readable_path_under_a_hidden_one_is_shown_again(tmp_path):
    hidden = tmp_path / "work"
    code = hidden / "src"
    code.mkdir(parents=True)
    view = bwrap.View(tmp_path / "f", hidden=(hidden,))
    args = bwrap.arguments("/usr/bin/bwrap", view, {"PYTHONPATH": f"{hidden}:{code}"}, -1)
    assert "--info-fd" not in args
    ro = _pairs(args, "--ro-bind")
    # `work` is readable (on PYTHONPATH) and hidden: covered by a tmpfs, its `src` shown again
    assert str(hidden) in [args[i + 1] for i, a in enumerate(args) if a == "--tmpfs"]
    assert ro.count((str(code), str(code))) == 1
    assert ro.index((str(code), str(code))) > ro.index((str(hidden), str(hidden)))


def test_the_gpu_nodes_and_sysfs_are_bound_where_the_gpu_is_used(tmp_path):
    args = bwrap.arguments("/usr/bin/bwrap", bwrap.View(tmp_path, gpu=True), {}, -1)
    devices = [a for a, _ in _pairs(args, "--dev-bind-try")]
    assert {"/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"} <= set(devices)
    assert ("/sys", "/sys") in _pairs(args, "--ro-bind-try")


def test_readable_paths_keep_links_and_their_targets_but_never_the_root(tmp_path):
    target = tmp_path / "real"
    target.mkdir()
    (tmp_path / "link").symlink_to(target)
    found = bwrap.readable_paths({"PATH": f"{tmp_path / 'link'}:/:/nonexistent-kbfuse"})
    assert tmp_path / "link" in found and target in found
    assert Path("/") not in found and Path("/nonexistent-kbfuse") not in found
    assert all(not p.is_relative_to(q) for p in found for q in found if p != q)


def test_a_sandboxed_child_keeps_only_the_environment_builds_need(tmp_path, monkeypatch):
    monkeypatch.setenv("SECRET_TOKEN", "x")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "9.0")
    env = sandbox.child_env(tmp_path, sandboxed=True)
    assert "SECRET_TOKEN" not in env
    assert env["CUDA_VISIBLE_DEVICES"] == "0" and env["TORCH_CUDA_ARCH_LIST"] == "9.0"
    assert env["PATH"] == os.environ["PATH"]
    for name in ("HOME", "TMPDIR", "TORCH_EXTENSIONS_DIR", "TRITON_CACHE_DIR", "XDG_CACHE_HOME"):
        assert Path(env[name]).parent == tmp_path and Path(env[name]).is_dir()
    assert sandbox.child_env(tmp_path, sandboxed=False)["SECRET_TOKEN"] == "x"


class _Lock:
    def shared(self):
        return _nothing()

    def alone(self):
        return _nothing()


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class _Processes:
    def __init__(self):
        self.signals = []

    def signal(self, signum):
        self.signals.append(signum)

    def stats(self):
        return []


def test_the_handoff_never_follows_a_link_the_child_left_as_its_granted_file(tmp_path):
    victim = tmp_path / "victim"
    handoff = sandbox.Handoff(_Lock(), tmp_path)
    handoff.start()
    processes = _Processes()
    handoff.attach(processes)
    handoff.granted.symlink_to(victim)  # the child, before asking
    handoff.request.touch()
    assert handoff.waiting() in (True, False)
    handoff.close()
    assert not victim.exists()
    assert handoff.granted.is_file() and not handoff.granted.is_symlink()
    assert processes.signals[0] == signal.SIGSTOP and processes.signals[-1] == signal.SIGCONT
