"""Isolating the CUDA compute cache and CuPy's kernel cache for one process.

Where a driver is present, NVRTC's cubin output passes through the CUDA compute cache
(CUDA_CACHE_PATH, by default ~/.nv/ComputeCache) whose key ignores --ftz: a flushing cubin compiled
earlier, by any process, can be served for a later --ftz=false compile. CuPy has its own on-disk
kernel cache (CUPY_CACHE_DIR, default ~/.cupy/kernel_cache) keyed on the options, which is safer
but still shared state. `isolate` gives this process a disabled compute cache at a private empty
path and keeps CuPy's cache in memory, before anything initialises CUDA (the driver and CuPy read
these variables once, at initialisation).
"""

from __future__ import annotations

import ctypes
import os
import sys
import tempfile
from pathlib import Path

from kbfuse.errors import KbfuseError

ISOLATION_VARIABLES = (
    "CUDA_CACHE_DISABLE",
    "CUDA_CACHE_PATH",
    "CUPY_CACHE_DIR",
    "CUPY_CACHE_IN_MEMORY",
)
CUDA_SUCCESS = 0
# Remember which directories `isolate` created, also for child processes (which inherit os.environ).
_MARK_CUDA = "KBFUSE_PRIVATE_CUDA_CACHE_PATH"
_MARK_CUPY = "KBFUSE_PRIVATE_CUPY_CACHE_DIR"


def driver_initialised() -> bool:
    """True once cuInit has run in this process (by anyone: torch, CuPy, NVRTC, ...).

    Looks at libcuda only if it is already loaded (RTLD_NOLOAD): before cuInit, cuDeviceGetCount
    answers CUDA_ERROR_NOT_INITIALIZED.
    """
    try:
        libcuda = ctypes.CDLL("libcuda.so.1", mode=getattr(os, "RTLD_NOLOAD", 4))
    except OSError:
        return False
    count = ctypes.c_int()
    return libcuda.cuDeviceGetCount(ctypes.byref(count)) == CUDA_SUCCESS


def cuda_initialised() -> str | None:
    """Why CUDA may already be initialised in this process, or None. Never imports torch/cupy."""
    if driver_initialised():
        return "the CUDA driver is already initialised in this process (cuInit has run)"
    if "cupy" in sys.modules:
        return "cupy is already imported"
    torch = sys.modules.get("torch")
    if torch is not None:
        cuda = getattr(torch, "cuda", None)
        if cuda is not None and cuda.is_initialized():
            return "torch.cuda is already initialised"
    return None


def _isolation_variables(scratch_dir) -> dict:
    """The isolation settings, with fresh empty directories made under `scratch_dir`."""
    scratch = Path(scratch_dir)
    scratch.mkdir(parents=True, exist_ok=True)
    cuda_dir = tempfile.mkdtemp(prefix="cuda-compute-cache-", dir=scratch)
    cupy_dir = tempfile.mkdtemp(prefix="cupy-kernel-cache-", dir=scratch)
    return {
        "CUDA_CACHE_DISABLE": "1",
        "CUDA_CACHE_PATH": cuda_dir,
        "CUPY_CACHE_DIR": cupy_dir,
        "CUPY_CACHE_IN_MEMORY": "1",
        _MARK_CUDA: cuda_dir,
        _MARK_CUPY: cupy_dir,
    }


def isolate(scratch_dir) -> dict:
    """Point every CUDA/CuPy cache of this process at fresh private directories under `scratch_dir`.

    Sets CUDA_CACHE_DISABLE=1, CUDA_CACHE_PATH and CUPY_CACHE_DIR to new empty directories, and
    CUPY_CACHE_IN_MEMORY=1. Refuses (KbfuseError) once CUDA may be initialised, because the driver
    would ignore the new values. Returns the stable record of `current_setting()`.
    """
    reason = cuda_initialised()
    if reason is not None:
        raise KbfuseError(
            f"cudacache.isolate({scratch_dir!s}) called too late: {reason}; the CUDA driver and "
            "CuPy read the cache variables at initialisation, so call isolate before importing "
            "cupy or touching torch.cuda"
        )
    os.environ.update(_isolation_variables(scratch_dir))
    return current_setting()


def _describe_dir(var: str, mark: str) -> str:
    value = os.environ.get(var)
    if value is None:
        return "default"
    if os.environ.get(mark) == value:
        return "private-empty"
    return "custom"


def current_setting() -> dict:
    """The cache setting in force now, without absolute paths: directories read "default" (variable
    unset), "private-empty" (made by `isolate`) or "custom" (set by someone else)."""
    record = {
        "CUDA_CACHE_DISABLE": os.environ.get("CUDA_CACHE_DISABLE"),
        "CUDA_CACHE_PATH": _describe_dir("CUDA_CACHE_PATH", _MARK_CUDA),
        "CUPY_CACHE_DIR": _describe_dir("CUPY_CACHE_DIR", _MARK_CUPY),
        "CUPY_CACHE_IN_MEMORY": os.environ.get("CUPY_CACHE_IN_MEMORY"),
    }
    record["isolated"] = (
        record["CUDA_CACHE_DISABLE"] == "1"
        and record["CUDA_CACHE_PATH"] == "private-empty"
        and record["CUPY_CACHE_DIR"] == "private-empty"
        and record["CUPY_CACHE_IN_MEMORY"] == "1"
    )
    return record


def default_cache_env(cache_path=None, base_env=None) -> dict:
    """An environment for a child process that uses the CUDA compute cache the default way.

    Removes every isolation variable (and isolate's marks) from `base_env` (default os.environ), so
    the driver caches as it does out of the box. With `cache_path`, CUDA_CACHE_PATH points there: a
    shared, persistent cache that stands in for ~/.nv/ComputeCache, so a test can poison a cache
    without touching the user's real one.
    """
    env = dict(os.environ if base_env is None else base_env)
    for var in (*ISOLATION_VARIABLES, _MARK_CUDA, _MARK_CUPY):
        env.pop(var, None)
    if cache_path is not None:
        env["CUDA_CACHE_PATH"] = str(cache_path)
    return env


def isolated_env(scratch_dir, base_env=None) -> dict:
    """An environment for a child process with the isolation of `isolate`, in fresh directories."""
    env = default_cache_env(base_env=base_env)
    env.update(_isolation_variables(scratch_dir))
    return env
