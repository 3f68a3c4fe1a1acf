"""The scratch disk a check needs, and a budget that keeps the checks of one machine within
the free space of the filesystem their scratch folders are on.

A check keeps every case's outputs as files in its scratch folder: the reference writes each
case's output, the candidate each case's output and one more after timing (kbfuse.candidates.
check; the inputs are drawn again by each side, not written). On KernelBench's larger level-2
tasks that is gigabytes: task 35 at the pin has 260 MB of output per case (and 537 MB of
input), 8.1 GB for 14 cases (15.1 GB when the inputs were written too). In the first audit of
CUDA-L1's kernels on the H200 machine (64 GiB of disk), six checks beside each other, which
then also wrote every case's inputs, filled the disk: the children's writes failed
(`torch.save`: "iostream error") and two candidates were recorded as failing with a runtime
error that was the checker's own.

- `task_bytes(task_file)`: a task's input and output bytes, read on the CPU by building its
  Model and inputs under torch's FakeTensorMode (shapes and dtypes, no data) and calling the
  forward once, as kbfuse.survey.floor does. None when the fake forward cannot run (a
  data-dependent shape): the check then runs without a reservation, as before. It imports the
  task file, so the check calls it for the pinned KernelBench file only (kbfuse.candidates.
  check: a task file without a commit runs in the sandbox alone).
- `scratch_need(sizes, cases)`: the bytes a check of `cases` cases writes, plus SLACK_BYTES
  for the logs, records and the candidate's build folders.
- `reserve(need, root)`: held around the check's children. Reservations live in a ledger
  folder next to the GPU locks (kbfuse.workflow.gpulock.lock_dir), one file per check, each
  flock-ed by its holder, so a killed check's reservation lapses with it. A check goes ahead
  when its need fits the free space less what the running checks have reserved and not yet
  written (FREE_MARGIN_BYTES kept free); it waits while it does not; it is refused at once,
  with a KbfuseError naming the sizes, when it could not fit even with no other check running.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from kbfuse.errors import KbfuseError

SLACK_BYTES = 512 << 20  # logs, records, the candidate's extension builds
FREE_MARGIN_BYTES = 1 << 30  # never planned into: what the rest of the machine writes meanwhile
POLL_S = 2.0
LEDGER = "kbfuse-scratch-budget"


class ScratchTooSmall(KbfuseError):
    """A check whose cases could not fit on this machine's scratch filesystem even with no
    other check running: a fact about the machine, not about the candidate."""

    def __init__(self, message: str, need: int, free: int):
        super().__init__(message)
        self.need, self.free = need, free


@dataclass(frozen=True)
class TaskBytes:
    inputs: int
    output: int


def _tensor_bytes(values) -> int:
    import torch

    if isinstance(values, torch.Tensor):
        return values.numel() * 4  # the check stores float32 (KernelBench's input cast)
    if isinstance(values, (list, tuple)):
        return sum(_tensor_bytes(v) for v in values)
    return 0


def task_bytes(task_file: str | Path) -> TaskBytes | None:
    """Input and output bytes of one call of the task's Model (see the module docstring)."""
    import importlib.util

    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    spec = importlib.util.spec_from_file_location(f"kbfuse_sizes_{uuid.uuid4().hex}", task_file)
    try:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        with FakeTensorMode(allow_non_fake_inputs=True), torch.no_grad():
            model = module.Model(*module.get_init_inputs())
            inputs = list(module.get_inputs())
            output = model(*inputs)
    except Exception:  # noqa: BLE001 - unknown sizes: the check runs without a reservation
        return None
    return TaskBytes(_tensor_bytes(inputs), _tensor_bytes(output))


def scratch_need(sizes: TaskBytes, cases: int) -> int:
    """Bytes a check of `cases` planned cases writes: the reference's output of every case,
    the candidate's outputs and the one after timing, and SLACK_BYTES."""
    return (2 * cases + 1) * sizes.output + SLACK_BYTES


def folder_bytes(root: Path) -> int:
    """Disk blocks used under `root` (0 when it is gone)."""
    total = 0
    for folder, _, files in os.walk(root):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(folder, name)).st_blocks * 512
    return total


def free_bytes(path: Path) -> int:
    stat = os.statvfs(path)
    return stat.f_bavail * stat.f_frsize


def _live_reservations(ledger: Path, own: Path | None) -> list[dict]:
    """The reservations whose holder still runs (its flock held); lapsed ones are removed."""
    live = []
    for path in sorted(ledger.glob("*.json")):
        if path == own:
            continue
        try:
            with open(path) as handle:
                try:
                    fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    live.append(json.loads(path.read_text()))
                    continue
                path.unlink(missing_ok=True)  # its holder is gone
        except (OSError, ValueError):
            continue
    return live


def decide(need: int, free: int, reservations: list[dict]) -> str:
    """ "go", "wait" or "never": the rule of the module docstring, given the free bytes and the
    other checks' reservations ({"bytes": reserved, "used": written so far})."""
    outstanding = sum(max(0, r["bytes"] - r["used"]) for r in reservations)
    if need > free + sum(r["used"] for r in reservations) - FREE_MARGIN_BYTES:
        return "never"
    return "go" if need + outstanding <= free - FREE_MARGIN_BYTES else "wait"


@contextlib.contextmanager
def reserve(need: int | None, root: Path, ledger_root: Path, timeout_s: float) -> Iterator[dict]:
    """Hold a reservation of `need` bytes for the scratch folder `root` (see the module
    docstring); yields {"estimated_bytes", "waited_s"}. `need` None: no reservation."""
    info = {"estimated_bytes": need, "waited_s": 0.0}
    if need is None:
        yield info
        return
    ledger = ledger_root / LEDGER
    ledger.mkdir(exist_ok=True)
    own = ledger / f"{os.getpid()}-{uuid.uuid4().hex}.json"
    guard = open(ledger / "ledger.lock", "a+")  # noqa: SIM115 - held across the loop
    start = time.monotonic()
    holder = None
    try:
        while True:
            fcntl.flock(guard, fcntl.LOCK_EX)
            try:
                others = [
                    {"bytes": r["bytes"], "used": folder_bytes(Path(r["root"]))}
                    for r in _live_reservations(ledger, own)
                ]
                free = free_bytes(root)
                verdict = decide(need, free, others)
                if verdict == "never":
                    usable = free - FREE_MARGIN_BYTES
                    raise ScratchTooSmall(
                        f"this check needs about {need / 1e9:.1f} GB of scratch disk under "
                        f"{root.parent} (its cases' outputs), more than the "
                        f"{usable / 1e9:.1f} GB that are free there (keeping "
                        f"{FREE_MARGIN_BYTES >> 30} GiB free) even with no other check running: "
                        "set TMPDIR to a larger filesystem, or check fewer cases (check.seeds)",
                        need,
                        usable,
                    )
                if verdict == "go":
                    holder = open(own, "w")  # noqa: SIM115 - its flock marks the holder alive
                    fcntl.flock(holder, fcntl.LOCK_EX)
                    holder.write(json.dumps({"bytes": need, "root": str(root)}))
                    holder.flush()
                    break
            finally:
                fcntl.flock(guard, fcntl.LOCK_UN)
            if time.monotonic() - start > timeout_s:
                raise KbfuseError(
                    f"this check waited {timeout_s:.0f} s for {need / 1e9:.1f} GB of scratch disk "
                    f"under {root.parent}, held by other checks; it did not start"
                )
            time.sleep(POLL_S)
        info["waited_s"] = round(time.monotonic() - start, 3)
        yield info
    finally:
        guard.close()
        if holder is not None:
            own.unlink(missing_ok=True)
            holder.close()
