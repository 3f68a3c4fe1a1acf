"""The scratch disk a check reserves (kbfuse.candidates.diskbudget): a task's bytes under
FakeTensorMode, the arithmetic of the need, the go/wait/never rule, the room of a root (a
memory filesystem's bounded by the memory kept for processes), the choice among several roots
($KBFUSE_SCRATCH), and reservations held by other processes, lapsing when they die."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from kbfuse.candidates import diskbudget
from kbfuse.candidates.diskbudget import FREE_MARGIN_BYTES, SLACK_BYTES, Room, TaskBytes
from kbfuse.errors import KbfuseError

FIXTURE = Path(__file__).parent / "candidates" / "cpu"
GB = 10**9

CONV_TASK = textwrap.dedent(
    """
    import torch
    import torch.nn as nn

    class Model(nn.Module):
        def __init__(self, c_in, c_out, k):
            super().__init__()
            self.conv = nn.Conv2d(c_in, c_out, k)

        def forward(self, x):
            return torch.nn.functional.max_pool2d(torch.relu(self.conv(x)), 2)

    def get_inputs():
        return [torch.randn(128, 64, 128, 128)]  # 537 MB: never allocated, only faked

    def get_init_inputs():
        return [64, 128, 3]
    """
)

DATA_DEPENDENT = textwrap.dedent(
    """
    import torch
    import torch.nn as nn

    class Model(nn.Module):
        def forward(self, x):
            return x[: int(x.sum().item()) % 3 + 1]

    def get_inputs():
        return [torch.rand(8, 4)]

    def get_init_inputs():
        return []
    """
)


def test_task_bytes_reads_shapes_without_allocating(tmp_path):
    task = tmp_path / "conv.py"
    task.write_text(CONV_TASK)
    sizes = diskbudget.task_bytes(task)
    # task 35's shapes at the pin: the input, and the pooled output 128 x 128 x 63 x 63
    assert sizes == TaskBytes(inputs=128 * 64 * 128 * 128 * 4, output=128 * 128 * 63 * 63 * 4)


def test_task_bytes_of_the_cpu_fixture_task():
    assert diskbudget.task_bytes(FIXTURE / "task53_small.py") == TaskBytes(16 * 32 * 4, 16 * 64 * 4)


def test_a_data_dependent_forward_has_no_sizes(tmp_path):
    task = tmp_path / "dynamic.py"
    task.write_text(DATA_DEPENDENT)
    assert diskbudget.task_bytes(task) is None


def test_scratch_need_counts_both_outputs_per_case_and_no_inputs():
    sizes = TaskBytes(inputs=537_000_000, output=260_000_000)
    # 14 cases: the reference's outputs, the candidate's outputs and after_timing; the inputs
    # are drawn by each side, not written
    assert diskbudget.scratch_need(sizes, 14) == 29 * 260_000_000 + SLACK_BYTES
    assert diskbudget.scratch_need(TaskBytes(inputs=10**12, output=260_000_000), 14) == (
        diskbudget.scratch_need(sizes, 14)
    )


@pytest.mark.parametrize(
    ("need", "free", "others", "expected"),
    [
        (10 * GB, 20 * GB, [], "go"),
        # another check reserved 13 GB and wrote 4: 9 GB more will go
        (10 * GB, 20 * GB, [{"bytes": 13 * GB, "used": 4 * GB}], "wait"),
        (5 * GB, 20 * GB, [{"bytes": 13 * GB, "used": 4 * GB}], "go"),
        # what the others wrote comes back when they end: fits later
        (30 * GB, 20 * GB, [{"bytes": 14 * GB, "used": 14 * GB}], "wait"),
        # more than the disk could ever give it
        (40 * GB, 20 * GB, [{"bytes": 14 * GB, "used": 14 * GB}], "never"),
        (20 * GB, 20 * GB, [], "never"),  # the margin is never planned into
    ],
)
def test_decide(need, free, others, expected):
    # a disk's ceiling: what is free and what the others wrote
    space = Room(free, free + sum(o["used"] for o in others))
    assert diskbudget.decide(need, space, others) == expected
    assert diskbudget.decide(free - FREE_MARGIN_BYTES, Room(free, free), []) == "go"


def test_decide_on_a_memory_filesystem_waits_for_memory_below_its_ceiling():
    # 90 GB could be had once the processes end (ceiling), 10 GB now: a 30 GB check waits
    assert diskbudget.decide(30 * GB, Room(10 * GB, 90 * GB, memory=True), []) == "wait"
    assert diskbudget.decide(95 * GB, Room(10 * GB, 90 * GB, memory=True), []) == "never"


MOUNTS = textwrap.dedent(
    """
    overlay / overlay rw,relatime 0 0
    tmpfs /dev/shm tmpfs rw,nosuid,nodev 0 0
    /dev/vda /scratch ext4 rw,relatime 0 0
    /dev/vdb /scratch/with\\040space xfs rw 0 0
    tmpfs /scratch/ram ramfs rw 0 0
    """
)


@pytest.mark.parametrize(
    ("path", "kind"),
    [
        ("/dev/shm/kbfuse-check-x", "tmpfs"),
        ("/dev/shmx", "overlay"),  # a sibling whose name starts alike is not inside
        ("/scratch", "ext4"),
        ("/scratch/with space/a", "xfs"),  # /proc/self/mounts writes a space as \\040
        ("/scratch/ram", "ramfs"),
        ("/home", "overlay"),
    ],
)
def test_filesystem_type_is_the_longest_mount_point_above_the_path(path, kind):
    assert diskbudget.filesystem_type(Path(path), MOUNTS) == kind


def test_filesystem_type_of_this_machines_memory_folder():
    assert diskbudget.filesystem_type(Path("/dev/shm")) == "tmpfs"
    assert diskbudget.filesystem_type(Path("/proc")) == "proc"


def fake_machine(monkeypatch, free, memory_roots=(), total=128 * GB, available=120 * GB):
    """Roots with `free` bytes each ({root: bytes}) and the given memory; `memory_roots` are
    on a tmpfs."""
    monkeypatch.setattr(diskbudget, "free_bytes", lambda path: free[Path(path)])
    kinds = {Path(r): "tmpfs" for r in memory_roots}
    monkeypatch.setattr(diskbudget, "filesystem_type", lambda path: kinds.get(Path(path), "ext4"))
    monkeypatch.setattr(diskbudget, "memory_bytes", lambda: (total, available))


def test_the_room_of_a_disk_is_its_free_space_and_what_the_others_wrote(tmp_path, monkeypatch):
    fake_machine(monkeypatch, {tmp_path: 20 * GB})
    assert diskbudget.room(tmp_path, others_used=5 * GB) == Room(20 * GB, 25 * GB, memory=False)


def test_the_room_of_a_memory_filesystem_keeps_memory_for_the_processes(tmp_path, monkeypatch):
    # 128 GB of memory, 120 GB available: 40% (51.2 GB) is kept, more than 32 GiB
    fake_machine(monkeypatch, {tmp_path: 128 * GB}, memory_roots=[tmp_path])
    keep = 51_200_000_000
    assert diskbudget.room(tmp_path) == Room(120 * GB - keep, 128 * GB - keep, memory=True)
    # 256 GB: 102.4 GB kept; the tmpfs's own size bounds it too
    fake_machine(monkeypatch, {tmp_path: 100 * GB}, [tmp_path], 256 * GB, 250 * GB)
    assert diskbudget.room(tmp_path) == Room(100 * GB, 100 * GB, memory=True)
    fake_machine(monkeypatch, {tmp_path: 300 * GB}, [tmp_path], 256 * GB, 250 * GB)
    assert diskbudget.room(tmp_path) == Room(147_600_000_000, 153_600_000_000, memory=True)
    # 64 GB: 32 GiB is more than 40%
    fake_machine(monkeypatch, {tmp_path: 64 * GB}, [tmp_path], 64 * GB, 60 * GB)
    assert diskbudget.room(tmp_path) == Room(60 * GB - (32 << 30), 64 * GB - (32 << 30), True)
    # less memory than is kept: no room, not a negative one
    fake_machine(monkeypatch, {tmp_path: 24 * GB}, [tmp_path], 24 * GB, 23 * GB)
    assert diskbudget.room(tmp_path) == Room(0, 0, memory=True)


def test_the_pool_is_the_rooms_together_less_the_margin_each(tmp_path, monkeypatch):
    disk, memory = tmp_path / "disk", tmp_path / "shm"
    fake_machine(monkeypatch, {disk: 64 * GB, memory: 128 * GB}, [memory])
    room = 64 * GB + (120 * GB - 51_200_000_000) - 2 * FREE_MARGIN_BYTES
    assert diskbudget.pool_mb([disk, memory]) == room >> 20
    assert diskbudget.pool_mb([disk]) == (64 * GB - FREE_MARGIN_BYTES) >> 20


def test_scratch_roots_default_to_the_temporary_folder(tmp_path, monkeypatch):
    monkeypatch.delenv(diskbudget.ENV_ROOTS, raising=False)
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(diskbudget.tempfile, "tempdir", None)  # TMPDIR read again
    assert diskbudget.scratch_roots() == [tmp_path.resolve()]
    assert diskbudget.scratch_roots({diskbudget.ENV_ROOTS: " "}) == [tmp_path.resolve()]


def test_scratch_roots_from_the_environment_in_order(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    value = f"{b}:{a}::{b}"  # an empty entry is nothing, a repeated one counted once
    assert diskbudget.scratch_roots({diskbudget.ENV_ROOTS: value}) == [b, a]


@pytest.mark.parametrize("entry", ["relative/folder", "/no/such/folder", "FILE"])
def test_a_scratch_root_that_is_not_a_folder_is_named(tmp_path, entry):
    (tmp_path / "file").write_text("")
    entry = str(tmp_path / "file") if entry == "FILE" else entry
    with pytest.raises(KbfuseError, match=f"KBFUSE_SCRATCH=.*{entry!r} is not an existing"):
        diskbudget.scratch_roots({diskbudget.ENV_ROOTS: f"{tmp_path}:{entry}"})


HOLDER = textwrap.dedent(
    """
    import fcntl, json, sys, time
    path, root, size = sys.argv[1], sys.argv[2], int(sys.argv[3])
    entry = {"bytes": size, "root": root}
    if sys.argv[5] != "None":
        entry["filesystem"] = int(sys.argv[5])
    handle = open(path, "w")
    fcntl.flock(handle, fcntl.LOCK_EX)
    handle.write(json.dumps(entry))
    handle.flush()
    print("held", flush=True)
    time.sleep(float(sys.argv[4]))
    """
)


def hold(
    ledger: Path, root: Path, size: int, seconds: float, filesystem: int | None = None
) -> subprocess.Popen:
    """Another check's reservation: a process holding the flock of its ledger file (one
    without a filesystem counts on every root, as the first version's did)."""
    ledger.mkdir(exist_ok=True)
    args = [str(ledger / "other.json"), str(root), str(size), str(seconds), str(filesystem)]
    command = [sys.executable, "-c", HOLDER, *args]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_a_check_waits_for_another_checks_reservation_then_goes(tmp_path, monkeypatch):
    monkeypatch.setattr(diskbudget, "free_bytes", lambda path: 20 * GB)
    monkeypatch.setattr(diskbudget, "POLL_S", 0.05)
    root, other_root = tmp_path / "mine", tmp_path / "other"
    root.mkdir()
    other_root.mkdir()
    ledger = tmp_path / diskbudget.LEDGER
    other = hold(ledger, other_root, 13 * GB, 1.0)
    try:
        with diskbudget.reserve(10 * GB, [root], tmp_path, timeout_s=30) as held:
            # granted only once the other check's reservation lapsed, as its process ended (it
            # held it 1 s; the kernel drops the lock as the process closes its files, a moment
            # before the process is gone: wait for that moment, not poll it)
            assert other.wait(timeout=10) == 0
            assert held.info["estimated_bytes"] == 10 * GB and held.info["waited_s"] > 0.5
            assert held.folder.parent == root.resolve() and held.folder.is_dir()
            mine = [p for p in ledger.glob("*.json")]
            assert len(mine) == 1 and mine[0].name != "other.json"  # the lapsed one is gone
            entry = json.loads(mine[0].read_text())
            assert entry == {
                "bytes": 10 * GB,
                "root": str(held.folder),
                "filesystem": root.stat().st_dev,
            }
    finally:
        other.wait()
    assert list(ledger.glob("*.json")) == []
    assert not held.folder.exists()  # removed before the reservation lapsed


def test_a_check_goes_to_the_first_root_it_fits_and_others_count_on_their_own(
    tmp_path, monkeypatch
):
    """Two roots on two filesystems: a check that does not fit beside another check's
    reservation on the first goes to the second at once; a reservation on the second does not
    count against the first."""
    disk, memory = tmp_path / "disk", tmp_path / "shm"
    disk.mkdir()
    memory.mkdir()
    fake_machine(monkeypatch, {disk: 20 * GB, memory: 64 * GB}, [memory], 128 * GB, 100 * GB)
    devices = {disk: 1, memory: 2}
    monkeypatch.setattr(diskbudget, "_filesystem", lambda path: devices[Path(path)])
    ledger = tmp_path / diskbudget.LEDGER
    other = hold(ledger, disk / "x", 13 * GB, 30.0, filesystem=1)
    try:
        with diskbudget.reserve(10 * GB, [disk, memory], tmp_path, timeout_s=0.5) as held:
            assert held.folder.parent == memory and held.info["waited_s"] < 0.5
            assert held.info["filesystem"] == diskbudget.filesystem_type(memory)
        other.kill()
        other.wait()
        # a reservation on the memory filesystem leaves the disk's room alone
        other = hold(ledger, memory / "x", 60 * GB, 30.0, filesystem=2)
        with diskbudget.reserve(10 * GB, [disk, memory], tmp_path, timeout_s=0.5) as held:
            assert held.folder.parent == disk
    finally:
        other.kill()
        other.wait()


def test_keep_leaves_the_scratch_folder(tmp_path, monkeypatch):
    monkeypatch.setattr(diskbudget, "free_bytes", lambda path: 20 * GB)
    with diskbudget.reserve(GB, [tmp_path], tmp_path, timeout_s=1, keep=True) as held:
        (held.folder / "out.pt").write_bytes(b"1")
    assert (held.folder / "out.pt").read_bytes() == b"1"
    assert list((tmp_path / diskbudget.LEDGER).glob("*.json")) == []


def test_a_check_that_could_never_fit_is_refused_at_once(tmp_path, monkeypatch):
    monkeypatch.setattr(diskbudget, "free_bytes", lambda path: 20 * GB)
    root = tmp_path / "mine"
    root.mkdir()
    start = time.monotonic()
    refused = r"needs about 40\.0 GB of scratch disk .* free there"
    with (
        pytest.raises(diskbudget.ScratchTooSmall, match=refused) as refusal,
        diskbudget.reserve(40 * GB, [root], tmp_path, timeout_s=30),
    ):
        pytest.fail("granted")
    assert time.monotonic() - start < 5
    assert isinstance(refusal.value, KbfuseError)
    assert (refusal.value.need, refusal.value.free) == (40 * GB, 20 * GB - (1 << 30))
    assert list(root.iterdir()) == []  # no scratch folder made


def test_a_check_that_fits_no_root_is_refused_naming_them_all(tmp_path, monkeypatch):
    disk, memory = tmp_path / "disk", tmp_path / "shm"
    disk.mkdir()
    memory.mkdir()
    # a 128 GB tmpfs on a machine of 64 GB: 32 GiB kept, 29.6 GB at most, 28.6 less the margin
    fake_machine(monkeypatch, {disk: 20 * GB, memory: 128 * GB}, [memory], 64 * GB, 60 * GB)
    refused = (
        rf"needs about 40\.0 GB of scratch disk under {disk} or {memory} .* more than the "
        r"28\.6 GB .* 32 GiB or 40% of the memory kept for the processes"
    )
    with (
        pytest.raises(diskbudget.ScratchTooSmall, match=refused) as refusal,
        diskbudget.reserve(40 * GB, [disk, memory], tmp_path, timeout_s=30),
    ):
        pytest.fail("granted")
    assert refusal.value.free == 64 * GB - (32 << 30) - FREE_MARGIN_BYTES


def test_waiting_past_the_limit_is_an_error(tmp_path, monkeypatch):
    monkeypatch.setattr(diskbudget, "free_bytes", lambda path: 20 * GB)
    monkeypatch.setattr(diskbudget, "POLL_S", 0.05)
    root, other_root = tmp_path / "mine", tmp_path / "other"
    root.mkdir()
    other_root.mkdir()
    other = hold(tmp_path / diskbudget.LEDGER, other_root, 15 * GB, 30.0)
    try:
        waited = r"waited 0 s for 10\.0 GB .* held by other checks"
        with (
            pytest.raises(KbfuseError, match=waited),
            diskbudget.reserve(10 * GB, [root], tmp_path, timeout_s=0.3),
        ):
            pytest.fail("granted")
    finally:
        other.kill()
        other.wait()


def test_no_sizes_no_reservation(tmp_path):
    first, second = tmp_path / "a", tmp_path / "b"
    first.mkdir()
    second.mkdir()
    with diskbudget.reserve(None, [first, second], tmp_path, timeout_s=1) as held:
        fs = diskbudget.filesystem_type(first) or None
        assert held.info == {"estimated_bytes": None, "waited_s": 0.0, "filesystem": fs}
        assert held.folder.parent == first and held.folder.is_dir()
    assert not (tmp_path / diskbudget.LEDGER).exists()
    assert list(first.iterdir()) == []


def test_folder_bytes_counts_what_a_check_wrote(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "x.pt").write_bytes(b"\1" * 100_000)
    assert 100_000 <= diskbudget.folder_bytes(tmp_path) < 200_000
    assert diskbudget.folder_bytes(tmp_path / "gone") == 0


def test_kbfuse_scratch_prints_the_roots_and_the_pool(tmp_path, monkeypatch, capsys):
    from kbfuse.workflow.cli import main

    disk, memory = tmp_path / "disk", tmp_path / "shm"
    disk.mkdir()
    memory.mkdir()
    fake_machine(monkeypatch, {disk: 64 * GB, memory: 128 * GB}, [memory])
    monkeypatch.setenv(diskbudget.ENV_ROOTS, f"{memory}:{disk}")
    assert main(["scratch"]) == 0
    pool = (64 * GB + 120 * GB - 51_200_000_000 - 2 * FREE_MARGIN_BYTES) >> 20
    assert capsys.readouterr().out.splitlines() == [
        f"{memory}: tmpfs, 68.8 GB of room now, bounded by the memory kept for processes",
        f"{disk}: ext4, 64.0 GB of room now",
        f"scratch_mb={pool} (each root's room less 1 GiB)",
    ]
    assert main(["scratch", "--mb"]) == 0
    assert capsys.readouterr().out == f"{pool}\n"
    monkeypatch.setenv(diskbudget.ENV_ROOTS, "scratch")
    assert main(["scratch", "--mb"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("kbfuse scratch: KBFUSE_SCRATCH='scratch': 'scratch' is not an existing")
