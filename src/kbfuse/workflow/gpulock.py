"""Who may use the GPU when several jobs share it: timing always alone.

The survey runs several jobs at once (their start-up, builds and compiles overlap), but no job
may time while another uses the device. Every job that touches the GPU takes one lock per
device, held in one of two ways:

- `shared()`: building, compiling, correctness: several jobs at once;
- `alone()`: timing and profiling: no other job holds the lock in any way. The study's and the
  check's GPU jobs hold it alone for their whole life (kbfuse.workflow.jobs.job).

Timing goes first: a job that asks to share waits while any job waits to be alone or is
alone (each of those holds the `queue` file shared; a sharer takes it exclusively for a
moment before it asks). So the jobs that have finished building time one after the other, and
a build that starts in between never keeps them all waiting for its whole length (the audit's
checks, several at a time, time back to back). Every request then passes a turnstile lock,
which the job waiting to be alone holds, so no more sharers join those inside while it waits.
Sharers wait only as long as the jobs at a time take to time, each once per stage. The locks
are `fcntl.flock` on three files named after the device (its UUID, or the host for the CPU)
in the system's temporary folder (`KBFUSE_GPU_LOCK_DIR` overrides it; it must be a folder
every job on the machine sees). The kernel releases them when a process dies, so a
killed job never leaves a stale lock. Seconds spent waiting are counted (`waited_s`).

On a machine with several GPUs a job is placed on one of them before CUDA starts in it
(kbfuse.workflow.devices sets CUDA_VISIBLE_DEVICES to that GPU's UUID), so `for_device("cuda")`
is the lock of the job's own GPU: jobs on different GPUs never wait for each other.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import socket
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from kbfuse.errors import KbfuseError

LOCK_DIR_VARIABLE = "KBFUSE_GPU_LOCK_DIR"


def device_key(device: str) -> str:
    """What names the lock: the GPU's UUID (one physical GPU under any CUDA_VISIBLE_DEVICES
    numbering) on cuda, the host name on the CPU."""
    if device == "cuda":
        from kbfuse.compilation import cudadriver

        return cudadriver.device_uuid(0)
    return "cpu-" + socket.gethostname()


def lock_dir() -> Path:
    folder = Path(os.environ.get(LOCK_DIR_VARIABLE) or tempfile.gettempdir())
    if not folder.is_dir():
        raise KbfuseError(f"{LOCK_DIR_VARIABLE}={folder} is not a folder")
    return folder


class GpuLock:
    """The lock of one device. `shared()` and `alone()` are context managers; one process holds
    at most one of them at a time (flock would let a process's own shared hold block its
    request to be alone)."""

    def __init__(self, key: str, folder: Path | None = None):
        safe = re.sub(r"[^A-Za-z0-9_.-]", "_", key)
        folder = lock_dir() if folder is None else Path(folder)
        self.path = folder / f"kbfuse-gpu-{safe}.lock"
        self.turnstile = folder / f"kbfuse-gpu-{safe}.turnstile"
        self.queue = folder / f"kbfuse-gpu-{safe}.queue"
        self.waited_s = 0.0
        self.held: str | None = None

    @contextlib.contextmanager
    def _hold(self, how: str, mode: int) -> Iterator[None]:
        if self.held is not None:
            raise KbfuseError(f"GPU lock {self.path}: asked to be {how} while already {self.held}")
        start = time.perf_counter()
        with (
            open(self.queue, "a") as queue,
            open(self.turnstile, "a") as gate,
            open(self.path, "a") as lock,
        ):
            if mode == fcntl.LOCK_EX:  # queued to time: sharers wait until it has timed
                fcntl.flock(queue, fcntl.LOCK_SH)
            else:  # no job waiting to time or timing
                fcntl.flock(queue, fcntl.LOCK_EX)
                fcntl.flock(queue, fcntl.LOCK_UN)
            fcntl.flock(gate, fcntl.LOCK_EX)
            try:
                fcntl.flock(lock, mode)
            finally:
                fcntl.flock(gate, fcntl.LOCK_UN)
            self.waited_s += time.perf_counter() - start
            self.held = how
            try:
                yield
            finally:
                self.held = None
                fcntl.flock(lock, fcntl.LOCK_UN)

    def shared(self) -> contextlib.AbstractContextManager[None]:
        """Use the device beside other sharing jobs; never while one is alone."""
        return self._hold("shared", fcntl.LOCK_SH)

    def alone(self) -> contextlib.AbstractContextManager[None]:
        """Use the device with no other job on it."""
        return self._hold("alone", fcntl.LOCK_EX)


def for_device(device: str) -> GpuLock:
    return GpuLock(device_key(device))
