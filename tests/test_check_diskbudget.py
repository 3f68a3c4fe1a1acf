"""The scratch disk a check reserves (kbfuse.candidates.diskbudget): a task's bytes under
FakeTensorMode, the arithmetic of the need, the go/wait/never rule, and reservations held by
other processes, lapsing when they die."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from kbfuse.candidates import diskbudget
from kbfuse.candidates.diskbudget import FREE_MARGIN_BYTES, SLACK_BYTES, TaskBytes
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
    assert diskbudget.decide(need, free, others) == expected
    assert diskbudget.decide(free - FREE_MARGIN_BYTES, free, []) == "go"


HOLDER = textwrap.dedent(
    """
    import fcntl, json, sys, time
    path, root, size = sys.argv[1], sys.argv[2], int(sys.argv[3])
    handle = open(path, "w")
    fcntl.flock(handle, fcntl.LOCK_EX)
    handle.write(json.dumps({"bytes": size, "root": root}))
    handle.flush()
    print("held", flush=True)
    time.sleep(float(sys.argv[4]))
    """
)


def hold(ledger: Path, root: Path, size: int, seconds: float) -> subprocess.Popen:
    """Another check's reservation: a process holding the flock of its ledger file."""
    ledger.mkdir(exist_ok=True)
    args = [str(ledger / "other.json"), str(root), str(size), str(seconds)]
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
        with diskbudget.reserve(10 * GB, root, tmp_path, timeout_s=30) as info:
            assert other.poll() is not None  # granted only once the other check ended
            assert info["estimated_bytes"] == 10 * GB and info["waited_s"] > 0.3
            mine = [p for p in ledger.glob("*.json")]
            assert len(mine) == 1 and mine[0].name != "other.json"  # the lapsed one is gone
    finally:
        other.wait()
    assert list(ledger.glob("*.json")) == []


def test_a_check_that_could_never_fit_is_refused_at_once(tmp_path, monkeypatch):
    monkeypatch.setattr(diskbudget, "free_bytes", lambda path: 20 * GB)
    root = tmp_path / "mine"
    root.mkdir()
    start = time.monotonic()
    refused = r"needs about 40\.0 GB of scratch disk .* free there"
    with (
        pytest.raises(diskbudget.ScratchTooSmall, match=refused) as refusal,
        diskbudget.reserve(40 * GB, root, tmp_path, timeout_s=30),
    ):
        pytest.fail("granted")
    assert time.monotonic() - start < 5
    assert isinstance(refusal.value, KbfuseError)
    assert (refusal.value.need, refusal.value.free) == (40 * GB, 20 * GB - (1 << 30))


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
            diskbudget.reserve(10 * GB, root, tmp_path, timeout_s=0.3),
        ):
            pytest.fail("granted")
    finally:
        other.kill()
        other.wait()


def test_no_sizes_no_reservation(tmp_path):
    with diskbudget.reserve(None, tmp_path, tmp_path, timeout_s=1) as info:
        assert info == {"estimated_bytes": None, "waited_s": 0.0}
    assert not (tmp_path / diskbudget.LEDGER).exists()


def test_folder_bytes_counts_what_a_check_wrote(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "x.pt").write_bytes(b"\1" * 100_000)
    assert 100_000 <= diskbudget.folder_bytes(tmp_path) < 200_000
    assert diskbudget.folder_bytes(tmp_path / "gone") == 0
