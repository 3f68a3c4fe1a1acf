"""The sandbox of a check's child processes: bubblewrap (bwrap), what a child sees in it.

A child (reference, candidate, witness: kbfuse.candidates.sandbox) runs as
`bwrap ARGS -- python -m kbfuse.candidates.child ROLE REQUEST`, with

  --unshare-all          new user, pid, network, IPC, UTS and cgroup namespaces: no network
                         but a loopback of its own; it sees no process outside (it cannot signal
                         its checker or anything else), and the kernel kills every process of
                         the pid namespace when its first process (bwrap's init) dies, setsid
                         or not
  --unshare-user         a user namespace even where bwrap runs as root; its own uid inside
  --disable-userns       no user namespace inside the sandbox (no way to regain capabilities)
  --cap-drop ALL         no capability, not even as root inside
  --die-with-parent      the sandbox dies with the process that started it
  --new-session          a new terminal session (no TIOCSTI on the checker's terminal)
  --ro-bind P P          read-only, only what Python, torch and the compilers need: the system
                         folders (/usr, /bin, /lib*, /etc, /opt), the interpreter's prefixes,
                         every folder on the child's import path and PATH, CUDA_HOME, and the
                         paths in $KBFUSE_SANDBOX_BIND; nothing else of the machine exists
                         inside (home folders, the results, the verdict folder, the scratch
                         folders of the other children)
  --tmpfs P              over a hidden path that lies inside a read-only one (the verdict
                         folder, the scratch root), so it is not visible there either
  --bind SCRATCH         the child's own folder, the only place it can write (and the witness's
                         build folders in a shared cache, one per flag set)
  --ro-bind INPUTS F/inputs   the candidate's inputs (written by the reference), read-only,
                         shown inside its own folder: nothing else of the reference is there
  --dev /dev, --proc     a minimal /dev (null, zero, random, ...) and the pid namespace's /proc
  --size N --tmpfs /tmp, /dev/shm   private, TMPFS_BYTES each: writing more fails (ENOSPC)
  --dev-bind-try /dev/nvidia*, --ro-bind /sys   where the child uses the GPU: its device
                         nodes (nvidiactl, nvidia-uvm, nvidia0, ...) and sysfs, which the
                         CUDA driver reads
  --remount-ro /         the sandbox's own root (a tmpfs holding the mount points) read-only:
                         writable, it would be memory no limit counts
  --chdir SCRATCH        the working folder
  --info-fd FD           bwrap tells the parent the pid of the sandbox's init (its pid namespace
                         is how the parent finds, measures, stops and kills every process in it)

bwrap is found as $KBFUSE_BWRAP (a path, e.g. to a bwrap unpacked from Debian's .deb where no
package can be installed) or `bwrap` on PATH, and tried once per process on a trivial command:
where it is missing or cannot make namespaces, `require()` raises a KbfuseError saying how to
install it, or to judge without a sandbox (`--unsandboxed`, recorded in the verdict).
"""

from __future__ import annotations

import functools
import glob
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import kbfuse
from kbfuse.errors import KbfuseError

ENV_BWRAP = "KBFUSE_BWRAP"
ENV_BIND = "KBFUSE_SANDBOX_BIND"  # more read-only paths, separated by os.pathsep
TMPFS_BYTES = 256 << 20
SYSTEM = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/opt")
GPU_NODES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset")
PROBE_TIMEOUT_S = 30
INSTALL_HINT = (
    "install bubblewrap (Debian/Ubuntu: apt-get install bubblewrap) or point KBFUSE_BWRAP at a "
    "bwrap binary; or judge without a sandbox with --unsandboxed (check.unsandboxed: true), "
    "which the verdict records"
)


@dataclass(frozen=True)
class View:
    """What one child sees: its own folder (writable), more writable paths, the paths that
    must stay hidden even inside a read-only one, and whether it uses the GPU."""

    folder: Path
    writable: tuple[Path, ...] = ()
    hidden: tuple[Path, ...] = ()
    gpu: bool = False


def _found(bwrap: str | None) -> str:
    if not bwrap:
        raise KbfuseError(
            f"kbfuse check needs bubblewrap (bwrap), which is not on PATH: {INSTALL_HINT}"
        )
    path = shutil.which(bwrap)
    if path is None:
        raise KbfuseError(f"{ENV_BWRAP}={bwrap} is not an executable file: {INSTALL_HINT}")
    return path


def locate() -> str:
    """The bwrap binary: $KBFUSE_BWRAP, else `bwrap` on PATH (KbfuseError when neither)."""
    return _found(os.environ.get(ENV_BWRAP) or shutil.which("bwrap"))


@functools.cache
def _probe(bwrap: str) -> str:
    """bwrap's version, once it has run a trivial command in a sandbox made as a child's."""
    import tempfile

    try:
        with tempfile.TemporaryDirectory(prefix="kbfuse-bwrap-probe-") as folder:
            argv = arguments(bwrap, View(Path(folder)), dict(os.environ), -1) + ["--", "true"]
            done = subprocess.run(argv, capture_output=True, text=True, timeout=PROBE_TIMEOUT_S)
        version = subprocess.run(
            [bwrap, "--version"], capture_output=True, text=True, timeout=PROBE_TIMEOUT_S
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise KbfuseError(f"{bwrap} cannot run: {exc}; {INSTALL_HINT}") from None
    if done.returncode != 0:
        why = " ".join(done.stderr.split())[:300] or f"exit status {done.returncode}"
        raise KbfuseError(
            f"{bwrap} cannot make a sandbox here (no user namespaces, or a bwrap older than "
            f"0.8?): {why}; {INSTALL_HINT}"
        )
    return version.stdout.strip() or "bwrap"


def require() -> tuple[str, str]:
    """(path, version) of a bwrap that works here; KbfuseError naming the problem otherwise."""
    bwrap = locate()
    return bwrap, _probe(bwrap)


@functools.cache
def _supports(bwrap: str, option: str) -> bool:
    try:
        done = subprocess.run([bwrap, "--help"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return option in done.stdout + done.stderr


def _inside(path: Path, folders: list[Path]) -> bool:
    return any(path == f or path.is_relative_to(f) for f in folders)


def readable_paths(env: dict[str, str], nested: bool = False) -> list[Path]:
    """The read-only paths of every child (see the module docstring), existing ones only, with
    none that is `/` itself (that would show the whole machine), parents first; a path inside
    another one of them only with `nested`."""
    candidates = [*SYSTEM, sys.prefix, sys.base_prefix, sys.exec_prefix]
    candidates.append(str(Path(os.path.realpath(sys.executable)).parent.parent))
    candidates.append(str(Path(kbfuse.__file__).resolve().parent.parent))
    candidates += [p for p in sys.path if p]
    for name in ("PYTHONPATH", "PATH", ENV_BIND):
        candidates += [p for p in env.get(name, "").split(os.pathsep) if p]
    for name in ("CUDA_HOME", "CUDA_PATH"):
        if env.get(name):
            candidates.append(env[name])
    found: list[Path] = []
    for item in candidates:
        path = Path(os.path.normpath(item))
        if path.is_absolute() and path.exists() and path != Path("/"):
            found.append(path)
            real = Path(os.path.realpath(path))  # /lib -> /usr/lib: the link and its target
            if real != Path("/"):
                found.append(real)
    found = sorted(set(found), key=lambda p: (len(p.parts), str(p)))
    if nested:
        return found
    kept: list[Path] = []
    for path in found:  # a path inside another one is bound with it
        if not any(path.is_relative_to(k) for k in kept):
            kept.append(path)
    return kept


def _gpu_args() -> list[str]:
    nodes = [*GPU_NODES, *sorted(glob.glob("/dev/nvidia[0-9]*"))]
    args = [arg for node in nodes for arg in ("--dev-bind-try", node, node)]
    if os.path.isdir("/dev/nvidia-caps"):
        args += ["--dev-bind", "/dev/nvidia-caps", "/dev/nvidia-caps"]
    return args + ["--ro-bind-try", "/sys", "/sys"]


def arguments(bwrap: str, view: View, env: dict[str, str], info_fd: int) -> list[str]:
    """bwrap's options for one child (everything before `--`)."""
    args = [bwrap, "--unshare-all", "--unshare-user", "--cap-drop", "ALL"]
    if _supports(bwrap, "--disable-userns"):
        args.append("--disable-userns")
    args += ["--die-with-parent", "--new-session"]
    if info_fd >= 0:
        args += ["--info-fd", str(info_fd)]
    args += ["--dev", "/dev", "--proc", "/proc"]
    args += ["--size", str(TMPFS_BYTES), "--tmpfs", "/tmp"]
    args += ["--size", str(TMPFS_BYTES), "--tmpfs", "/dev/shm"]
    own = [view.folder, *view.writable]
    readable = [p for p in readable_paths(env) if not _inside(p, own)]
    for path in readable:
        args += ["--ro-bind", str(path), str(path)]
    covered = [Path(p) for p in view.hidden if _inside(Path(p), readable)]
    for path in covered:
        args += ["--tmpfs", str(path)]
    for path in readable_paths(env, nested=True):  # what a tmpfs above covered, shown again
        if not _inside(path, own) and any(path != h and path.is_relative_to(h) for h in covered):
            args += ["--ro-bind", str(path), str(path)]
    if view.gpu:
        args += _gpu_args()
    for path in own:
        args += ["--bind", str(path), str(path)]
    return args + ["--remount-ro", "/", "--chdir", str(view.folder)]
