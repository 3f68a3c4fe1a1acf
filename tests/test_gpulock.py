"""The GPU lock: timing alone, builds side by side, a waiting timer goes first.

flock treats two open() of the same file as two holders even in one process, so threads stand
in for jobs here; each records when it got and left the lock.
"""

from __future__ import annotations

import fcntl
import threading
import time

import pytest

from kbfuse.errors import KbfuseError
from kbfuse.workflow import gpulock
from kbfuse.workflow.gpulock import GpuLock


class Log:
    def __init__(self):
        self.events: list[tuple[str, str]] = []
        self.guard = threading.Lock()

    def add(self, who: str, what: str) -> None:
        with self.guard:
            self.events.append((who, what))


def hold(folder, how: str, who: str, log: Log, seconds: float, started=None) -> threading.Thread:
    def body():
        lock = GpuLock("GPU-test", folder)
        if started is not None:
            started.set()
        with getattr(lock, how)():
            log.add(who, "in")
            time.sleep(seconds)
            log.add(who, "out")

    thread = threading.Thread(target=body)
    thread.start()
    return thread


def test_two_jobs_share_the_device_at_once(tmp_path):
    log = Log()
    a = hold(tmp_path, "shared", "a", log, 0.3)
    time.sleep(0.05)
    b = hold(tmp_path, "shared", "b", log, 0.05)
    a.join(), b.join()
    # b came and went while a was still inside
    assert log.events == [("a", "in"), ("b", "in"), ("b", "out"), ("a", "out")]


def test_a_job_alone_waits_for_the_sharing_ones_and_keeps_them_out(tmp_path):
    log = Log()
    a = hold(tmp_path, "shared", "a", log, 0.3)
    time.sleep(0.05)
    timer = hold(tmp_path, "alone", "timer", log, 0.2)
    time.sleep(0.05)
    late = hold(tmp_path, "shared", "late", log, 0.01)  # asks while the timer waits
    for thread in (a, timer, late):
        thread.join()
    assert log.events == [
        ("a", "in"),
        ("a", "out"),
        ("timer", "in"),  # before `late`, although `late` could have shared with `a`
        ("timer", "out"),
        ("late", "in"),
        ("late", "out"),
    ]


def test_every_waiting_timer_goes_before_a_waiting_sharer(tmp_path):
    # A build holds the device; t0 comes to time; `late` asks to share (a job starting its
    # build); then t1 comes to time. In the order they asked, `late` would share next and t1
    # would wait for its whole build; timing goes first, so t1 times before `late` shares.
    log = Log()
    build = hold(tmp_path, "shared", "build", log, 0.3)
    time.sleep(0.05)
    t0 = hold(tmp_path, "alone", "t0", log, 0.15)
    time.sleep(0.05)
    late = hold(tmp_path, "shared", "late", log, 0.01)
    time.sleep(0.05)
    t1 = hold(tmp_path, "alone", "t1", log, 0.15)
    for thread in (build, t0, late, t1):
        thread.join()
    assert log.events == [
        ("build", "in"),
        ("build", "out"),
        ("t0", "in"),
        ("t0", "out"),
        ("t1", "in"),
        ("t1", "out"),
        ("late", "in"),
        ("late", "out"),
    ]


def test_a_sharer_is_not_held_back_once_no_one_waits_to_time(tmp_path):
    log = Log()
    timer = hold(tmp_path, "alone", "timer", log, 0.1)
    time.sleep(0.03)
    sharers = [hold(tmp_path, "shared", f"s{i}", log, 0.2) for i in range(2)]
    for thread in (timer, *sharers):
        thread.join()
    whats = [what for _, what in log.events]
    # the timer, then both sharers inside at once
    assert log.events[:2] == [("timer", "in"), ("timer", "out")]
    assert whats[2:] == ["in", "in", "out", "out"]


def test_two_timers_never_overlap(tmp_path):
    log = Log()
    threads = [hold(tmp_path, "alone", f"t{i}", log, 0.05) for i in range(4)]
    for thread in threads:
        thread.join()
    whats = [what for _, what in log.events]
    assert whats == ["in", "out"] * 4


def test_waiting_is_counted(tmp_path):
    log = Log()
    a = hold(tmp_path, "alone", "a", log, 0.3)
    time.sleep(0.05)
    lock = GpuLock("GPU-test", tmp_path)
    with lock.shared():
        assert lock.held == "shared"
    a.join()
    assert 0.15 < lock.waited_s < 2.0
    assert lock.held is None


def test_one_process_cannot_nest_its_holds(tmp_path):
    lock = GpuLock("GPU-test", tmp_path)
    with (
        lock.shared(),
        pytest.raises(KbfuseError, match="asked to be alone while already shared"),
        lock.alone(),
    ):
        pass


def test_the_lock_files_are_named_after_the_device(tmp_path, monkeypatch):
    monkeypatch.setenv(gpulock.LOCK_DIR_VARIABLE, str(tmp_path))
    monkeypatch.setattr(
        "kbfuse.compilation.cudadriver.device_uuid", lambda ordinal=0: "GPU-1234-ab/cd"
    )
    lock = gpulock.for_device("cuda")
    assert lock.path == tmp_path / "kbfuse-gpu-GPU-1234-ab_cd.lock"
    assert gpulock.device_key("cpu").startswith("cpu-")


def test_a_lock_folder_that_is_not_there_is_named(tmp_path, monkeypatch):
    monkeypatch.setenv(gpulock.LOCK_DIR_VARIABLE, str(tmp_path / "missing"))
    with pytest.raises(KbfuseError, match=r"KBFUSE_GPU_LOCK_DIR=.*missing is not a folder"):
        gpulock.for_device("cpu")


@pytest.mark.parametrize("how", ["alone", "shared"])
def test_a_study_job_holds_the_lock_as_its_stage_says(tmp_path, monkeypatch, how):
    from kbfuse.workflow import jobs

    monkeypatch.setattr(gpulock, "for_device", lambda device: GpuLock("GPU-test", tmp_path))
    with jobs._hold_the_gpu(how) as lock:
        assert lock.held == how
        # a sharing job gets in beside a sharing one, never beside one alone: probe without
        # waiting (LOCK_NB) through the lock file itself
        with open(lock.path, "a") as fh:
            if how == "shared":
                fcntl.flock(fh, fcntl.LOCK_SH | fcntl.LOCK_NB)
            else:
                with pytest.raises(BlockingIOError, match="Resource temporarily unavailable"):
                    fcntl.flock(fh, fcntl.LOCK_SH | fcntl.LOCK_NB)
    assert lock.held is None
    with (
        pytest.raises(KbfuseError, match="GPU lock mode 'both': 'alone' or 'shared'"),
        jobs._hold_the_gpu("both"),
    ):
        pass
