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
- `scratch_roots()`: the folders a check's scratch folder may be made in: $KBFUSE_SCRATCH
  (absolute folders separated by os.pathsep, in order of preference), else the temporary
  folder (TMPDIR). A machine whose disk is smaller than its memory can add a memory
  filesystem, e.g. KBFUSE_SCRATCH=/tmp:/dev/shm: a check then goes where its need fits.
- `room(root, others_used)`: what a root can take now and at most. On a memory filesystem
  (tmpfs, ramfs) what is written there is memory the checks' processes no longer have, so its
  room is also bounded by the machine's available memory less what is kept for the processes
  (the larger of 32 GiB and 40% of the memory): on the H200 machine (125 GiB), about 80 GB
  at most, one of the largest level-2 tasks' 62-64 GB, with 54 GB for the checks' processes
  (a candidate's peaks at 7-9 GB in the CUDA-L1 audit). A process killed for memory would be
  recorded as the candidate's failure: the room is not planned to the last gigabyte.
- `reserve(need, roots, ...)`: held around the check's children; makes the check's scratch
  folder in the first root where `need` fits and yields it. Reservations live in a ledger
  folder next to the GPU locks (kbfuse.workflow.gpulock.lock_dir), one file per check, each
  flock-ed by its holder, so a killed check's reservation lapses with it. A check goes ahead
  in a root when its need fits the room there less what the running checks on the same
  filesystem have reserved and not yet written (FREE_MARGIN_BYTES kept free); it waits while
  it fits in none; it is refused at once, with a ScratchTooSmall naming the sizes, when it
  could not fit in any even with no other check running.
- `pool_mb(roots)`: the room of the roots together, in MiB: Snakemake's `--resources
  scratch_mb=N` (`kbfuse scratch` prints it).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shutil
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from kbfuse.errors import KbfuseError

SLACK_BYTES = 512 << 20  # logs, records, the candidate's extension builds
FREE_MARGIN_BYTES = 1 << 30  # never planned into: what the rest of the machine writes meanwhile
POLL_S = 2.0
LEDGER = "kbfuse-scratch-budget"
ENV_ROOTS = "KBFUSE_SCRATCH"
MEMORY_FILESYSTEMS = ("tmpfs", "ramfs")
MEMORY_KEEP_BYTES = 32 << 30  # of the machine's memory, at least, never written as scratch
MEMORY_KEEP_FRACTION = 0.4


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


def scratch_roots(env: dict[str, str] | None = None) -> list[Path]:
    """The folders a check's scratch folder may be made in, in order (module docstring);
    KbfuseError naming the entry when $KBFUSE_SCRATCH names one that is not an existing,
    writable folder given by its absolute path."""
    value = (os.environ if env is None else env).get(ENV_ROOTS, "")
    if not value.strip():
        return [Path(tempfile.gettempdir()).resolve()]
    roots: list[Path] = []
    for item in (entry.strip() for entry in value.split(os.pathsep)):
        if not item:
            continue
        path = Path(item)
        if not path.is_absolute() or not path.is_dir() or not os.access(path, os.W_OK | os.X_OK):
            raise KbfuseError(
                f"{ENV_ROOTS}={value!r}: {item!r} is not an existing, writable folder given by "
                f"its absolute path (folders separated by {os.pathsep!r})"
            )
        roots.append(path.resolve())
    return list(dict.fromkeys(roots))


def _unescape(field_: str) -> str:
    """A path of /proc/self/mounts, whose spaces and the like are octal escapes."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field_)


def filesystem_type(path: Path, mounts: str | None = None) -> str:
    """The type of the filesystem `path` is on (its longest mount point in /proc/self/mounts,
    or `mounts`, that file's text); "" when unknown."""
    if mounts is None:
        try:
            mounts = Path("/proc/self/mounts").read_text()
        except OSError:
            return ""
    real = os.path.realpath(path)
    best, kind = "", ""
    for line in mounts.splitlines():
        fields = line.split()
        if len(fields) < 3:
            continue
        point = _unescape(fields[1])
        inside = real == point or real.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best):
            best, kind = point, fields[2]
    return kind


def memory_bytes() -> tuple[int, int]:
    """(MemTotal, MemAvailable) of /proc/meminfo, in bytes."""
    fields = {}
    for line in Path("/proc/meminfo").read_text().splitlines():
        name, _, rest = line.partition(":")
        if rest.split():
            fields[name] = int(rest.split()[0]) * 1024
    return fields["MemTotal"], fields["MemAvailable"]


@dataclass(frozen=True)
class Room:
    """What a root can take: `free` now, `ceiling` with no other check writing there."""

    free: int
    ceiling: int
    memory: bool = False


def room(root: Path, others_used: int = 0) -> Room:
    """The room of `root` (module docstring), given what the other checks on its filesystem
    have written there (it comes back when they end)."""
    free = free_bytes(root)
    ceiling = free + others_used
    memory = filesystem_type(root) in MEMORY_FILESYSTEMS
    if memory:
        total, available = memory_bytes()
        keep = max(MEMORY_KEEP_BYTES, int(total * MEMORY_KEEP_FRACTION))
        free, ceiling = min(free, available - keep), min(ceiling, total - keep)
    return Room(max(free, 0), max(ceiling, 0), memory)


def pool_mb(roots: Sequence[Path]) -> int:
    """The room of `roots` together now, less FREE_MARGIN_BYTES each, in MiB: Snakemake's
    `--resources scratch_mb` for the checks of one machine."""
    usable = sum(max(0, room(root).free - FREE_MARGIN_BYTES) for root in roots)
    return usable >> 20


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


def decide(need: int, space: Room, reservations: list[dict]) -> str:
    """ "go", "wait" or "never": the rule of the module docstring, given a root's room and the
    other checks' reservations on its filesystem ({"bytes": reserved, "used": written so
    far})."""
    outstanding = sum(max(0, r["bytes"] - r["used"]) for r in reservations)
    if need > space.ceiling - FREE_MARGIN_BYTES:
        return "never"
    return "go" if need + outstanding <= space.free - FREE_MARGIN_BYTES else "wait"


@dataclass(frozen=True)
class Held:
    """A granted reservation: the check's scratch folder and what the verdict records."""

    folder: Path
    info: dict


def _too_small(need: int, roots: Sequence[Path], rooms: list[Room]) -> ScratchTooSmall:
    usable = max(r.ceiling for r in rooms) - FREE_MARGIN_BYTES
    where = " or ".join(str(root) for root in roots)
    memory = (
        f"; on a memory filesystem, {MEMORY_KEEP_BYTES >> 30} GiB or "
        f"{MEMORY_KEEP_FRACTION:.0%} of the memory kept for the processes"
        if any(r.memory for r in rooms)
        else ""
    )
    return ScratchTooSmall(
        f"this check needs about {need / 1e9:.1f} GB of scratch disk under {where} (its "
        f"cases' outputs), more than the {usable / 1e9:.1f} GB that are free there (keeping "
        f"{FREE_MARGIN_BYTES >> 30} GiB free{memory}) even with no other check running: set "
        f"TMPDIR or {ENV_ROOTS} to larger filesystems, or check fewer cases (check.seeds)",
        need,
        usable,
    )


def _filesystem(path: Path) -> int:
    return os.stat(path).st_dev


def _place(need: int, roots: Sequence[Path], ledger: Path, own: Path) -> Path | None:
    """The first root where `need` goes now; None to wait; ScratchTooSmall when never."""
    live = _live_reservations(ledger, own)
    rooms = []
    for root in roots:
        device = _filesystem(root)
        others = [
            {"bytes": r["bytes"], "used": folder_bytes(Path(r["root"]))}
            for r in live
            if r.get("filesystem", device) == device
        ]
        space = room(root, sum(o["used"] for o in others))
        verdict = decide(need, space, others)
        if verdict == "go":
            return root
        rooms.append((verdict, space))
    if all(verdict == "never" for verdict, _ in rooms):
        raise _too_small(need, roots, [space for _, space in rooms])
    return None


def _scratch_folder(root: Path) -> Path:
    return Path(tempfile.mkdtemp(prefix="kbfuse-check-", dir=root)).resolve()


@contextlib.contextmanager
def reserve(
    need: int | None,
    roots: Sequence[Path],
    ledger_root: Path,
    timeout_s: float,
    keep: bool = False,
) -> Iterator[Held]:
    """Hold a reservation of `need` bytes in the first of `roots` where it fits (module
    docstring) and yield it with a new scratch folder there, removed afterwards unless `keep`;
    its `info` is {"estimated_bytes", "waited_s", "filesystem"} (the type of the root's
    filesystem, e.g. tmpfs: where the cases lay; None when unknown). `need` None: no
    reservation, the folder in the first root."""
    info = {"estimated_bytes": need, "waited_s": 0.0, "filesystem": None}
    guard = holder = held = own = None
    try:
        if need is None:
            info["filesystem"] = filesystem_type(roots[0]) or None
            held = Held(_scratch_folder(roots[0]), info)
            yield held
            return
        ledger = ledger_root / LEDGER
        ledger.mkdir(exist_ok=True)
        own = ledger / f"{os.getpid()}-{uuid.uuid4().hex}.json"
        guard = open(ledger / "ledger.lock", "a+")  # noqa: SIM115 - held across the loop
        start = time.monotonic()
        while True:
            fcntl.flock(guard, fcntl.LOCK_EX)
            try:
                root = _place(need, roots, ledger, own)
                if root is not None:
                    info["filesystem"] = filesystem_type(root) or None
                    held = Held(_scratch_folder(root), info)
                    holder = open(own, "w")  # noqa: SIM115 - its flock marks the holder alive
                    fcntl.flock(holder, fcntl.LOCK_EX)
                    entry = {"bytes": need, "root": str(held.folder)}
                    holder.write(json.dumps({**entry, "filesystem": _filesystem(root)}))
                    holder.flush()
                    break
            finally:
                fcntl.flock(guard, fcntl.LOCK_UN)
            if time.monotonic() - start > timeout_s:
                where = " or ".join(str(root) for root in roots)
                raise KbfuseError(
                    f"this check waited {timeout_s:.0f} s for {need / 1e9:.1f} GB of scratch disk "
                    f"under {where}, held by other checks; it did not start"
                )
            time.sleep(POLL_S)
        info["waited_s"] = round(time.monotonic() - start, 3)
        yield held
    finally:
        if guard is not None:
            guard.close()
        if held is not None and not keep:
            shutil.rmtree(held.folder, ignore_errors=True)
        if holder is not None:
            own.unlink(missing_ok=True)
            holder.close()
