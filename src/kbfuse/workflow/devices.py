"""Which GPU a job runs on when the machine has several: one device per job, chosen by its lock.

Every GPU job is placed on one device before CUDA is initialised in its process
(`placed(how)`, entered by kbfuse.workflow.jobs.job and by the check's job script):

1. The visible devices are listed without touching CUDA in this process. When
   `CUDA_VISIBLE_DEVICES` names one device, or is unset and the machine has at most one
   `/dev/nvidia<N>` node, there is nothing to choose: CUDA's view is left exactly as it is (the
   one-GPU case, as before: no listing, no extra lock, no variable set). Otherwise a child
   process asks the CUDA driver (kbfuse.compilation.cudadriver, under the inherited
   `CUDA_VISIBLE_DEVICES`) for each device's ordinal, UUID and name (`python -m
   kbfuse.workflow.devices`).
2. Under a host-wide placement lock, the job takes the device with the fewest jobs placed on it
   (ties: the lowest index). A job that holds its device alone for its whole life (timing,
   controls, the fingerprint) first looks for a device that no job uses at all (its GPU lock,
   kbfuse.workflow.gpulock, free, and no job waiting to be alone on it). A job counts as placed
   on a device while it holds one of the device's slot files (`kbfuse-gpu-<uuid>.slot<N>`,
   flock, beside the GPU locks), so a killed job is forgotten by the kernel.
3. `CUDA_VISIBLE_DEVICES` is set to the device's UUID, so the job (and every process it starts)
   sees that one device as device 0, and `KBFUSE_DEVICE` to its record ({index, uuid, name}).
   The job's GPU lock is then the device's own (gpulock.device_key reads device 0's UUID): two
   jobs never time on one device at once, and jobs on different devices never wait for each
   other.

`avoid` leaves devices out (the survey's devices that the cross-device check,
kbfuse.survey.agreement, found off the others, under `survey.exclude_outlier_devices`).
`current(device)` is the record that names the device a job ran on ({index, uuid, name}; index
is the device's CUDA ordinal among those visible to the run).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

from kbfuse.errors import KbfuseError
from kbfuse.workflow import gpulock

VISIBLE = "CUDA_VISIBLE_DEVICES"
PLACED = "KBFUSE_DEVICE"
LIST_TIMEOUT_S = 120
MODES = ("alone", "shared")


@dataclass(frozen=True)
class Device:
    """One GPU: its CUDA ordinal among the devices visible to the run, UUID and name."""

    index: int
    uuid: str
    name: str

    def record(self) -> dict:
        return asdict(self)


def from_record(record: Mapping) -> Device:
    try:
        return Device(int(record["index"]), str(record["uuid"]), str(record["name"]))
    except (KeyError, TypeError, ValueError) as exc:
        raise KbfuseError(f"not a device record ({exc}): {record!r}") from None


def device_nodes(dev: str | Path = "/dev") -> int:
    """How many /dev/nvidia<N> nodes this process can see (0 without an NVIDIA driver)."""
    try:
        return sum(1 for p in Path(dev).iterdir() if re.fullmatch(r"nvidia[0-9]+", p.name))
    except OSError:
        return 0


def maybe_several(environ: Mapping[str, str] | None = None, dev: str | Path = "/dev") -> bool:
    """Could more than one GPU be visible? False settles it without asking CUDA."""
    environ = os.environ if environ is None else environ
    value = environ.get(VISIBLE)
    if value is None:
        return device_nodes(dev) > 1
    # CUDA reads the entries up to the first empty or invalid one
    entries = value.split(",")
    return len(entries) > 1 and bool(entries[0].strip()) and bool(entries[1].strip())


def list_here() -> list[Device]:
    """Every device CUDA shows this process, through the driver (initialises CUDA here)."""
    from kbfuse.compilation import cudadriver

    return [
        Device(i, cudadriver.device_uuid(i), cudadriver.device_name(i))
        for i in range(cudadriver.device_count())
    ]


def list_in_child(timeout_s: float = LIST_TIMEOUT_S) -> list[Device]:
    """`list_here()` in a child process, so that CUDA is not initialised in this one; [] when
    the child cannot list them (no driver: the job's own GPU check then says why)."""
    try:
        done = subprocess.run(
            [sys.executable, "-m", "kbfuse.workflow.devices"],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
        if done.returncode != 0:
            return []
        return [from_record(r) for r in json.loads(done.stdout)]
    except (OSError, subprocess.TimeoutExpired, ValueError, KbfuseError):
        return []


def several_visible() -> list[Device]:
    """The visible devices when there are several; [] when there is one (or none): then
    CUDA's view is left as it is. CUDA is not initialised in this process."""
    if not maybe_several():
        return []
    found = list_in_child()
    return found if len(found) > 1 else []


# -- choosing a device -------------------------------------------------------------------------


def pick(devices: list[Device], how: str, load: Mapping[str, int], busy: Mapping[str, bool]):
    """The device a new job goes to: the one with the fewest jobs placed on it (`load`, by
    UUID), the lowest index on a tie; a job that holds its device alone for its whole life
    (`how` "alone") first among the devices that no job uses (`busy` False)."""
    if how not in MODES:
        raise KbfuseError(f"placement mode {how!r}: one of {MODES}")
    if not devices:
        raise KbfuseError("no device to place the job on")
    pool = [d for d in devices if not busy.get(d.uuid, False)] if how == "alone" else []
    return min(pool or devices, key=lambda d: (load.get(d.uuid, 0), d.index))


def _safe(key: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", key)


def _free(path: Path) -> bool:
    """Could an exclusive flock of `path` be had now? (Taken and let go at once.)"""
    if not path.exists():
        return True
    with open(path, "a") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        fcntl.flock(fh, fcntl.LOCK_UN)
        return True


def _slots(folder: Path, device: Device) -> list[Path]:
    return sorted(folder.glob(f"kbfuse-gpu-{_safe(device.uuid)}.slot*"))


def load_of(folder: Path, device: Device) -> int:
    """How many jobs are placed on `device` now (slot files held)."""
    return sum(not _free(p) for p in _slots(folder, device))


def in_use(folder: Path, device: Device) -> bool:
    """Does any job hold `device`'s GPU lock, or wait to have it alone?"""
    lock = gpulock.GpuLock(device.uuid, folder)
    return not all(_free(path) for path in (lock.queue, lock.turnstile, lock.path))


def take_slot(folder: Path, device: Device):
    """An open file holding a free slot of `device` (flock'ed until it is closed)."""
    n = 0
    while True:
        path = folder / f"kbfuse-gpu-{_safe(device.uuid)}.slot{n}"
        fh = open(path, "a")  # noqa: SIM115 - held for the job's life, closed by the caller
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fh
        except BlockingIOError:
            fh.close()
            n += 1


@contextlib.contextmanager
def _placement_lock(folder: Path) -> Iterator[None]:
    with open(folder / "kbfuse-gpu-placement.lock", "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def choose(devices: list[Device], how: str, folder: Path):
    """(device, its slot's open file): the device picked (`pick`) from the locks in `folder`
    and a slot of it taken, under the placement lock (two jobs starting at once see each other)."""
    with _placement_lock(folder):
        load = {d.uuid: load_of(folder, d) for d in devices}
        busy = {d.uuid: in_use(folder, d) for d in devices} if how == "alone" else {}
        device = pick(devices, how, load, busy)
        return device, take_slot(folder, device)


def placed_here() -> Device | None:
    """The device this process was placed on, when it (or its parent job) was."""
    raw = os.environ.get(PLACED)
    if not raw:
        return None
    try:
        device = from_record(json.loads(raw))
    except (ValueError, KbfuseError):
        return None
    return device if os.environ.get(VISIBLE) == device.uuid else None


@contextlib.contextmanager
def placed(
    how: str = "shared",
    avoid: Iterable[str] = (),
    devices: list[Device] | None = None,
    folder: str | Path | None = None,
) -> Iterator[Device | None]:
    """Place this job on one device (module docstring) for the life of the context: yields the
    device, or None when there is nothing to choose (one visible device: CUDA's view untouched).
    `devices`: the visible devices (by default `several_visible()`); `avoid`: UUIDs to leave
    out; `folder`: where the locks are (gpulock.lock_dir())."""
    if how not in MODES:
        raise KbfuseError(f"placement mode {how!r}: one of {MODES}")
    already = placed_here()
    if already is not None:  # a process of a job that is already placed: its device
        yield already
        return
    devices = several_visible() if devices is None else list(devices)
    if len(devices) <= 1:
        yield None
        return
    avoid = set(avoid)
    kept = [d for d in devices if d.uuid not in avoid]
    if not kept:
        raise KbfuseError(f"every visible device is left out ({sorted(avoid)}): none to run on")
    folder = gpulock.lock_dir() if folder is None else Path(folder)
    device, slot = choose(kept, how, folder)
    before = {key: os.environ.get(key) for key in (VISIBLE, PLACED)}
    os.environ[VISIBLE] = device.uuid
    os.environ[PLACED] = json.dumps(device.record())
    try:
        yield device
    finally:
        slot.close()
        for key, value in before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def current(device: str = "cuda") -> dict | None:
    """The record of the GPU this process runs on ({index, uuid, name}), None on the CPU (or
    when the driver cannot be asked). On one visible device it is asked from the driver:
    device 0, index 0."""
    if device != "cuda":
        return None
    here = placed_here()
    if here is not None:
        return here.record()
    from kbfuse.compilation import cudadriver

    try:
        return {"index": 0, "uuid": cudadriver.device_uuid(0), "name": cudadriver.device_name(0)}
    except KbfuseError:  # no driver to ask (the job's own GPU checks say why): not named
        return None


def main() -> int:
    """Print the visible devices as a JSON list (run in a child by `list_in_child`)."""
    print(json.dumps([d.record() for d in list_here()]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
