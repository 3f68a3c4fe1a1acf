"""The GPU lock's details that tests/test_gpulock.py leaves open (found by mutation testing,
docs/mutation.md): what each hold takes on the lock, turnstile and queue files, what it gives
back (also after an error), how waiting adds up, and the names of the files.

flock treats two open() of one file as two holders even in one process, so a second open
file with a non-blocking flock probes what the lock under test holds.
"""

from __future__ import annotations

import fcntl
import socket
import tempfile

import pytest

from kbfuse.errors import KbfuseError
from kbfuse.workflow import gpulock
from kbfuse.workflow.gpulock import GpuLock


def can_take(path, mode: int) -> bool:
    """Whether another holder could take `path` in `mode` now (and give it back at once)."""
    with open(path, "a") as other:
        try:
            fcntl.flock(other, mode | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        fcntl.flock(other, fcntl.LOCK_UN)
        return True


def test_shared_lets_others_share_but_keeps_a_timer_out(tmp_path):
    lock = GpuLock("GPU-x", tmp_path)
    with lock.shared():
        assert lock.held == "shared"
        assert can_take(lock.path, fcntl.LOCK_SH)
        assert not can_take(lock.path, fcntl.LOCK_EX)
        assert can_take(lock.turnstile, fcntl.LOCK_EX)  # the turnstile is passed, not kept
        assert can_take(lock.queue, fcntl.LOCK_EX)  # and a sharer leaves no one queued
    assert lock.held is None
    assert can_take(lock.path, fcntl.LOCK_EX)


def test_alone_keeps_everyone_out_and_gives_the_lock_back(tmp_path):
    lock = GpuLock("GPU-x", tmp_path)
    with lock.alone():
        assert lock.held == "alone"
        assert not can_take(lock.path, fcntl.LOCK_SH)
        assert can_take(lock.turnstile, fcntl.LOCK_EX)
        # queued while alone: other timers may queue too, sharers wait
        assert can_take(lock.queue, fcntl.LOCK_SH)
        assert not can_take(lock.queue, fcntl.LOCK_EX)
    assert lock.held is None
    assert can_take(lock.path, fcntl.LOCK_EX)
    assert can_take(lock.queue, fcntl.LOCK_EX)


def test_an_error_inside_gives_the_lock_back(tmp_path):
    lock = GpuLock("GPU-x", tmp_path)
    with pytest.raises(RuntimeError, match="inside"), lock.alone():
        raise RuntimeError("inside")
    assert lock.held is None
    assert can_take(lock.path, fcntl.LOCK_EX)
    with lock.shared():  # usable again
        assert lock.held == "shared"


def test_nesting_is_refused_in_both_orders_with_the_files_name(tmp_path):
    lock = GpuLock("GPU-x", tmp_path)
    with lock.alone():
        # checked first: a hold that did not record itself would let the shared request below
        # wait for this very lock for ever
        assert lock.held == "alone"
        with (
            pytest.raises(KbfuseError, match="asked to be shared while already alone") as refused,
            lock.shared(),
        ):
            pass
        assert str(refused.value) == (
            f"GPU lock {lock.path}: asked to be shared while already alone"
        )
        assert lock.held == "alone"  # the refusal leaves the outer hold as it was
    assert lock.held is None


def test_waiting_starts_at_zero_and_adds_up(tmp_path, monkeypatch):
    clock = iter([10.0, 10.5, 20.0, 20.25])
    monkeypatch.setattr(gpulock.time, "perf_counter", lambda: next(clock))
    lock = GpuLock("GPU-x", tmp_path)
    assert lock.waited_s == 0.0
    with lock.shared():
        assert lock.waited_s == 0.5
    with lock.alone():
        pass
    assert lock.waited_s == 0.75


def test_file_names_keep_safe_characters_and_replace_the_rest(tmp_path):
    lock = GpuLock("GPU-a.b_c/d e:f", tmp_path)
    assert lock.path == tmp_path / "kbfuse-gpu-GPU-a.b_c_d_e_f.lock"
    assert lock.turnstile == tmp_path / "kbfuse-gpu-GPU-a.b_c_d_e_f.turnstile"
    assert lock.queue == tmp_path / "kbfuse-gpu-GPU-a.b_c_d_e_f.queue"
    assert lock.held is None


def test_the_cpu_key_is_the_host_name():
    assert gpulock.device_key("cpu") == "cpu-" + socket.gethostname()


def test_the_cuda_key_is_the_uuid_of_device_zero(monkeypatch):
    asked = []

    def uuid(ordinal=7):
        asked.append(ordinal)
        return "GPU-1234"

    monkeypatch.setattr("kbfuse.compilation.cudadriver.device_uuid", uuid)
    assert gpulock.device_key("cuda") == "GPU-1234"
    assert asked == [0]


@pytest.mark.parametrize("value", [None, ""])
def test_the_lock_folder_defaults_to_the_temporary_folder(monkeypatch, value):
    if value is None:
        monkeypatch.delenv(gpulock.LOCK_DIR_VARIABLE, raising=False)
    else:
        monkeypatch.setenv(gpulock.LOCK_DIR_VARIABLE, value)
    assert gpulock.lock_dir() == gpulock.Path(tempfile.gettempdir())
    lock = gpulock.for_device("cpu")
    expected = f"kbfuse-gpu-cpu-{socket.gethostname()}.lock".replace(" ", "_")
    assert lock.path.parent == gpulock.Path(tempfile.gettempdir())
    assert lock.path.name == expected


def test_the_lock_folder_comes_from_the_variable(tmp_path, monkeypatch):
    monkeypatch.setenv(gpulock.LOCK_DIR_VARIABLE, str(tmp_path))
    assert gpulock.lock_dir() == tmp_path
    assert GpuLock("k").path == tmp_path / "kbfuse-gpu-k.lock"


def test_a_lock_folder_that_is_a_file_is_refused(tmp_path, monkeypatch):
    afile = tmp_path / "f"
    afile.write_text("")
    monkeypatch.setenv(gpulock.LOCK_DIR_VARIABLE, str(afile))
    with pytest.raises(KbfuseError, match=r"^KBFUSE_GPU_LOCK_DIR=\S+/f is not a folder$"):
        gpulock.lock_dir()
