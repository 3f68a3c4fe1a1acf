"""A trusted child's turns on the GPU (sandbox.Turns, the parent's side; childio.GpuTurns, the
child's): the lock is held for each turn the child asks for and let go between them, the
parent's wait for it is reported as waiting, and a child that ends inside a turn leaves no
hold behind."""

from __future__ import annotations

import contextlib
import threading
import time

from kbfuse.candidates.childio import GpuTurns
from kbfuse.candidates.sandbox import Turns


class CountingLock:
    """Stands in for gpulock.GpuLock's shared hold: takes `wait_s` to begin (another job on
    the device alone), counts its holds and says whether one is held."""

    def __init__(self, wait_s: float = 0.0):
        self.wait_s, self.taken, self.holding = wait_s, 0, False

    @contextlib.contextmanager
    def shared(self):
        time.sleep(self.wait_s)
        self.holding, self.taken = True, self.taken + 1
        try:
            yield
        finally:
            self.holding = False


def drive(turns: Turns, child: threading.Thread) -> list[bool]:
    """What run_child does while its child runs: ask `waiting()` every poll, then close."""
    waited = []
    while child.is_alive():
        waited.append(turns.waiting())
        time.sleep(0.01)
    turns.close()
    return waited


def test_each_turn_holds_the_lock_and_the_writes_between_hold_nothing(tmp_path):
    lock = CountingLock(wait_s=0.2)
    turns = Turns(lock, tmp_path)
    turns.start()
    seen = []

    def child():
        gpu = GpuTurns(turns.paths(), "cpu")
        for _ in range(3):
            with gpu.turn():
                seen.append(("device work", lock.holding))
            time.sleep(0.2)  # writing the case: the parent has let the lock go meanwhile
            seen.append(("write", lock.holding))

    thread = threading.Thread(target=child)
    thread.start()
    waited = drive(turns, thread)
    assert seen == [("device work", True), ("write", False)] * 3
    assert lock.taken == 3 and not lock.holding
    # the parent said it was waiting while each 0.2 s hold began: about 20 polls of 10 ms each
    assert 3 * 10 <= sum(waited) < len(waited)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        f"gpu.{n}.{what}" for n in range(3) for what in ("ask", "held", "done")
    )


def test_a_child_that_ends_inside_its_turn_leaves_no_hold(tmp_path):
    lock = CountingLock()
    turns = Turns(lock, tmp_path)
    turns.start()
    inside = []

    def child():
        gpu = GpuTurns(turns.paths(), "cpu")
        with contextlib.suppress(RuntimeError), gpu.turn():
            inside.append(lock.holding)
            raise RuntimeError("the task's Model failed")

    thread = threading.Thread(target=child)
    thread.start()
    drive(turns, thread)
    assert inside == [True] and lock.taken == 1
    assert not lock.holding and not (tmp_path / "gpu.0.done").exists()


def test_a_new_run_starts_from_the_first_turn(tmp_path):
    (tmp_path / "gpu.0.ask").touch()
    (tmp_path / "gpu.0.held").touch()
    lock = CountingLock()
    turns = Turns(lock, tmp_path)
    turns.start()  # a file left from before would answer the child's first ask at once
    assert list(tmp_path.iterdir()) == [] and turns.waiting() is False and lock.taken == 0


def test_without_a_lock_every_turn_is_at_once(tmp_path):
    gpu = GpuTurns(None, "cpu")
    with gpu.turn():
        pass
    with gpu.turn():
        pass
    assert gpu.count == 0 and list(tmp_path.iterdir()) == []
