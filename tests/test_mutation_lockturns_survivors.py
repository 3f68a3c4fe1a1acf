"""How the check holds the GPU lock case by case (kbfuse.candidates.check's gather and
run_reference, kbfuse.candidates.evidence.compare_on), in the details mutation testing found
open (docs/mutation.md, "Survivors"): what each step of the check waited for the lock (the
verdict's lock_wait_s), that the reference is given turns only with a lock, and what the
comparison holds, frees and retries on the device. The children are played in this process
as in tests/test_mutation_check.py."""

from __future__ import annotations

import contextlib
import json

import pytest
import torch
from test_mutation_check import Children, judge, same

from kbfuse.candidates import check, compare, evidence
from kbfuse.candidates.sandbox import Outcome
from kbfuse.errors import KbfuseError


@pytest.fixture
def children(monkeypatch):
    """test_mutation_check's children (its `judge` runs them), installed as check.run_child."""

    def install(**kwargs) -> Children:
        fake = Children(**kwargs)
        monkeypatch.setattr(check, "run_child", fake)
        return fake

    return install


# --------------------------------------------------------------------------- lock_wait_s


class CountingLock:
    """Stands in for gpulock.GpuLock: each shared hold takes `wait_s` to begin, added to
    `waited_s` as GpuLock counts its waits (from `waited_s` already waited before this
    check); says whether it is held."""

    def __init__(self, waited_s: float = 0.0, wait_s: float = 0.0):
        self.waited_s, self.wait_s, self.holds, self.holding = waited_s, wait_s, 0, False

    @contextlib.contextmanager
    def shared(self):
        self.waited_s += self.wait_s
        self.holds, self.holding = self.holds + 1, True
        try:
            yield
        finally:
            self.holding = False

    alone = shared


def test_the_verdict_records_each_steps_wait_for_the_lock(tmp_path, children):
    # a pinned task file: 5 turns of the reference (its 4 cases, the trivial outputs) and 5
    # comparisons (the 4 cases, the output after timing), 0.10004 s each: 0.5002 s a step
    children(change=same)
    lock = CountingLock(waited_s=1.0, wait_s=0.10004)
    record = judge(tmp_path, lock=lock, commit="c" * 40)
    assert lock.holds == 10 and record["verdict"] == "pass"
    # to the millisecond; the waits before this check (1 s) are not its own; the played
    # candidate and the CPU's absent witness take no hold
    assert record["lock_wait_s"] == {
        "reference": 0.5, "candidate": 0.0, "witness": 0.0, "compare": 0.5,
    }  # fmt: skip
    assert set(record["phases_s"]) == {"scratch_wait", *record["lock_wait_s"]}


def test_a_lock_that_waited_whole_seconds_is_counted_for_an_unpinned_reference(tmp_path, children):
    children(change=same)
    lock = CountingLock(waited_s=2, wait_s=1)
    record = judge(tmp_path, lock=lock)
    # a task file of unknown origin: one hold for the reference's whole run
    assert lock.holds == 6
    assert record["lock_wait_s"] == {
        "reference": 1.0, "candidate": 0.0, "witness": 0.0, "compare": 5.0,
    }  # fmt: skip


def test_a_lock_that_does_not_count_its_waits_records_none(tmp_path, children):
    class Uncounted:
        @contextlib.contextmanager
        def shared(self):
            yield

        alone = shared

    children(change=same)
    record = judge(tmp_path, lock=Uncounted())
    assert record["verdict"] == "pass" and "lock_wait_s" not in record


# --------------------------------------------------------------------------- run_reference


@pytest.mark.parametrize(
    "with_lock, pinned, turns, held",
    [
        (False, False, False, False),
        (False, True, False, False),  # no lock: no turns (nobody could give one)
        (True, False, False, True),  # a task file of unknown origin: held for the whole run
        (True, True, True, False),  # the pinned task file's: the lock is its turns'
    ],
)
def test_the_reference_takes_turns_only_with_a_lock_on_a_pinned_task_file(
    tmp_path, monkeypatch, with_lock, pinned, turns, held
):
    lock = CountingLock() if with_lock else None
    calls = []

    def refused(role, request_path, view, limits, log, binary, env=None, handoff=None):
        request = json.loads(request_path.read_text())
        holding = lock is not None and lock.holding
        calls.append((role, handoff, request["turns"], holding, request_path.parent))
        return Outcome(role, "exited", 1, 0.1, 1.0, "")

    monkeypatch.setattr(check, "run_child", refused)
    commit = "c" * 40 if pinned else None
    with pytest.raises(KbfuseError, match=r"the reference process for \S+ failed \(exited, exit 1"):
        judge(tmp_path, lock=lock, commit=commit)
    ((role, handoff, asked, holding, folder),) = calls
    assert role == "reference" and holding is held
    assert (handoff is not None, asked is not None) == (turns, turns)
    if turns:
        assert isinstance(handoff, check.Turns) and handoff.lock is lock
        assert asked == {"folder": str(folder)} and folder.name == "reference"
    assert lock is None or not lock.holding


# --------------------------------------------------------------------------- compare_on


class Hold:
    """Stands in for the comparison's hold of the GPU lock: says whether it is held."""

    def __init__(self):
        self.held, self.count = False, 0

    @contextlib.contextmanager
    def __call__(self):
        self.held, self.count = True, self.count + 1
        try:
            yield
        finally:
            self.held = False


@pytest.fixture
def device_events(monkeypatch):
    """compare.compare_case and torch.cuda.empty_cache recorded with whether the hold was
    held; compare_case runs short of memory on the devices in `short`."""
    hold, events, short = Hold(), [], set()

    def compare_case(reference, output, contract, device="cpu"):
        events.append(("compare", device, hold.held))
        if device in short:
            raise torch.OutOfMemoryError(f"{device} out of memory")
        return {"compared_on": device}

    monkeypatch.setattr(compare, "compare_case", compare_case)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: events.append(("empty", hold.held)))
    return hold, events, short


X = torch.arange(4, dtype=torch.float32)
TOLERANCE = {"atol": 1e-2, "rtol": 1e-2, "argument_order": ["reference", "candidate"]}


def test_on_the_gpu_each_comparison_frees_its_memory_inside_its_hold(device_events):
    hold, events, _ = device_events
    assert evidence.compare_on("cuda", X, X, TOLERANCE, hold) == {"compared_on": "cuda"}
    assert events == [("compare", "cuda", True), ("empty", True)] and not hold.held


def test_short_of_gpu_memory_the_case_is_compared_on_the_cpu_outside_the_hold(device_events):
    hold, events, short = device_events
    short.add("cuda")
    assert evidence.compare_on("cuda", X, X, TOLERANCE, hold) == {"compared_on": "cpu"}
    assert events == [("compare", "cuda", True), ("empty", True), ("compare", "cpu", False)]
    assert hold.count == 1


def test_on_the_cpu_nothing_is_freed_and_running_short_is_not_retried(device_events):
    hold, events, short = device_events
    assert evidence.compare_on("cpu", X, X, TOLERANCE, hold) == {"compared_on": "cpu"}
    assert events == [("compare", "cpu", True)]
    short.add("cpu")
    events.clear()
    with pytest.raises(torch.OutOfMemoryError, match="^cpu out of memory$"):
        evidence.compare_on("cpu", X, X, TOLERANCE, hold)
    assert events == [("compare", "cpu", True)] and hold.count == 2 and not hold.held
