"""Running out of device memory beside other jobs: how it shows, and the run again alone.

Jobs that only compute share the GPU (kbfuse.workflow.gpulock). Beside them, a large task can
fail for want of memory that other jobs hold (their models, inputs and allocator caches), not
for want of its own. Such a job frees what it holds and runs once more with the device to
itself (`shared_then_alone`); only a failure then is the job's own.
"""

from __future__ import annotations

import gc
import logging
from collections.abc import Callable
from typing import TypeVar

from kbfuse.workflow import gpulock

T = TypeVar("T")

# How running out of device memory shows: torch's allocator raises OutOfMemoryError; a library
# that allocates for itself raises a RuntimeError that names its failed allocation (seen on the
# H200 with another job holding the memory: eager's first GEMM failed in `cublasCreate`).
OUT_OF_MEMORY_ERROR = "OutOfMemoryError"
OUT_OF_MEMORY_MESSAGES = (
    "CUBLAS_STATUS_ALLOC_FAILED",
    "CUBLASLT_STATUS_ALLOC_FAILED",
    "CUDNN_STATUS_ALLOC_FAILED",
    "CUSOLVER_STATUS_ALLOC_FAILED",
    "CUFFT_ALLOC_FAILED",
    "CUDA error: out of memory",
    "CUDA out of memory",
)


def out_of_memory(error: str, message: str) -> bool:
    """Is a failure (its error's type name and message, as records hold them) the device
    running out of memory?"""
    return error == OUT_OF_MEMORY_ERROR or any(m in message for m in OUT_OF_MEMORY_MESSAGES)


def is_out_of_memory(exc: BaseException) -> bool:
    """`out_of_memory` of a raised exception, or of any exception it was raised from (a
    TorchScript trace wraps the interpreter's error in a TracingCheckError)."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if out_of_memory(type(exc).__name__, str(exc)):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def release_memory() -> None:
    """Free what this process no longer references, and the CUDA allocator's cache of it."""
    gc.collect()
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()


_log = logging.getLogger("kbfuse")


def shared_then_alone(body: Callable[[], T], lock: gpulock.GpuLock | None = None) -> T:
    """`body()` holding the GPU lock shared; if the device runs out of memory there, once more
    holding it alone (after freeing what the first run left). `lock`: by default the lock of the
    job's device."""
    lock = gpulock.for_device("cuda") if lock is None else lock
    try:
        with lock.shared():
            _log.info("GPU lock %s (shared) after %.1f s", lock.path, lock.waited_s)
            return body()
    except Exception as exc:
        if not is_out_of_memory(exc):
            raise
        _log.warning("out of memory beside other jobs (%s): once more, alone on the device",
                    str(exc).strip().splitlines()[-1][:300])  # fmt: skip
    release_memory()
    with lock.alone():
        _log.info("GPU lock %s (alone) after %.1f s", lock.path, lock.waited_s)
        return body()
