"""A job that shares the GPU runs once more alone when the device runs out of memory beside
other jobs (kbfuse.workflow.outofmemory), and only then; what counts as out of memory."""

import pytest

from kbfuse.workflow import outofmemory
from kbfuse.workflow.gpulock import GpuLock


class FakeOutOfMemory(RuntimeError):
    pass


FakeOutOfMemory.__name__ = "OutOfMemoryError"  # torch.OutOfMemoryError's name


def traced_oom() -> Exception:
    """What TorchScript raises when the device runs out during a trace's check (seen on the
    H200: the interpreter's RuntimeError inside a TracingCheckError's message)."""
    return RuntimeError(
        "Tracing failed sanity checks!\nencountered an exception while running the trace with "
        "test inputs.\nException:\n\tRuntimeError: CUDA out of memory. Tried to allocate 4.46 GiB."
    )


@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        (FakeOutOfMemory("CUDA out of memory. Tried to allocate 2.00 MiB"), True),
        (traced_oom(), True),
        (RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling cublasCreate"), True),
        (RuntimeError("shape mismatch: (2, 3) and (4, 5)"), False),
        (ValueError("CUDA error: an illegal memory access was encountered"), False),
    ],
)
def test_what_counts_as_out_of_memory(exc, expected):
    assert outofmemory.is_out_of_memory(exc) is expected


def test_an_error_raised_from_running_out_counts_too():
    try:
        try:
            raise FakeOutOfMemory("CUDA out of memory")
        except FakeOutOfMemory as inner:
            raise RuntimeError("baseline inductor failed") from inner
    except RuntimeError as outer:
        assert outofmemory.is_out_of_memory(outer)


def run(tmp_path, failures):
    """shared_then_alone on a body that fails with each of `failures` in turn (None: returns),
    noting how the lock was held at each call."""
    lock = GpuLock("test-device", tmp_path)
    held = []

    def body():
        held.append(lock.held)
        failure = failures[len(held) - 1]
        if failure is not None:
            raise failure
        return "record"

    return lock, held, lambda: outofmemory.shared_then_alone(body, lock)


def test_a_run_that_fits_holds_the_lock_shared_once(tmp_path):
    lock, held, go = run(tmp_path, [None])
    assert go() == "record"
    assert held == ["shared"]
    assert lock.held is None


def test_out_of_memory_beside_other_jobs_runs_again_alone(tmp_path):
    lock, held, go = run(tmp_path, [traced_oom(), None])
    assert go() == "record"
    assert held == ["shared", "alone"]
    assert lock.held is None


def test_out_of_memory_alone_is_the_jobs_own_failure(tmp_path):
    _, held, go = run(tmp_path, [traced_oom(), FakeOutOfMemory("CUDA out of memory")])
    with pytest.raises(FakeOutOfMemory, match="CUDA out of memory"):
        go()
    assert held == ["shared", "alone"]


def test_any_other_failure_is_not_run_again(tmp_path):
    _, held, go = run(tmp_path, [ValueError("wrong shape")])
    with pytest.raises(ValueError, match="wrong shape"):
        go()
    assert held == ["shared"]


def replay_with_capture_failing(monkeypatch, failure):
    """TaskChecks.graph_replay of a subject whose CUDA-graph capture raises `failure`."""
    import types

    import torch

    from kbfuse.checks import taskchecks

    def capture(*_):
        raise failure

    monkeypatch.setattr(taskchecks, "capture_graph", capture)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    said = []
    checks = types.SimpleNamespace(input=lambda *_: torch.zeros(2), progress=said.append)
    subject = types.SimpleNamespace(name="inductor", capture=None)
    return taskchecks.TaskChecks.graph_replay(checks, subject), said


def test_a_capture_that_runs_out_of_memory_is_not_recorded_as_the_subjects_failure(monkeypatch):
    with pytest.raises(FakeOutOfMemory, match="CUDA out of memory"):
        replay_with_capture_failing(monkeypatch, FakeOutOfMemory("CUDA out of memory"))


def test_a_capture_that_fails_otherwise_is_recorded(monkeypatch):
    (cases, capture), said = replay_with_capture_failing(monkeypatch, RuntimeError("not allowed"))
    assert cases == []
    assert capture == {"capturable": False, "error": "RuntimeError: not allowed"}
    assert said == ["inductor graph/capture: FAIL (RuntimeError: not allowed)"]
