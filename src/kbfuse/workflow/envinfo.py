"""The machine a run came from: GPU, driver, toolchain versions and the copy-bandwidth floor.

A fused pointwise tail reads its input once and writes its output once, so a large
device-to-device copy (`dst.copy_(src)`, also one read and one write per byte) is the
physical floor its time is compared with. Bandwidth counts bytes read + bytes written.

Every probe that can be missing on some machine (cupy, triton, nvidia-smi, NVRTC) records
None and the reason under `notes` rather than failing: the fingerprint says what is there.
cupy and torch.cuda are touched only inside functions (the job isolates the CUDA cache first).
"""

from __future__ import annotations

import importlib.metadata
import logging
import os
import platform
import shutil
import statistics
import subprocess
from collections.abc import Callable
from typing import Any

from kbfuse.compilation import cudacache
from kbfuse.errors import KbfuseError
from kbfuse.io import write_json
from kbfuse.workflow import devices

log_ = logging.getLogger("kbfuse.workflow.envinfo")

COPY_BUFFER_BYTES = 2 * 1024**3
MIN_COPY_BUFFER_BYTES = 64 * 1024**2  # a smaller buffer would not reach steady-state bandwidth
COPY_WARMUP = 5
COPY_REPEATS = 25


def _say(log, message: str) -> None:
    log_.info(message)
    if log is not None:
        log.write(message + "\n")
        log.flush()


def _probe(notes: dict, key: str, fn: Callable[[], Any]) -> Any:
    """fn() or None, with the reason in notes[key]: a missing component is a fact to record."""
    try:
        return fn()
    except Exception as exc:  # any failure of an optional probe is recorded, not raised
        notes[key] = f"{type(exc).__name__}: {exc}"
        return None


def _gpu(device: int) -> dict:
    import torch

    props = torch.cuda.get_device_properties(device)
    found = {
        "name": props.name,
        "sm_count": int(props.multi_processor_count),
        "compute_capability": f"{props.major}.{props.minor}",
        "memory_bytes": int(props.total_memory),
    }
    placed = devices.current("cuda") if device == 0 else None
    if placed is not None:  # which GPU of the machine (kbfuse.workflow.devices)
        found.update(index=placed["index"], uuid=placed["uuid"])
    return found


def _nvidia_smi(device: int | str) -> dict:
    """Driver version and name from nvidia-smi, for device `device`: its index in nvidia-smi's
    own numbering (which ignores CUDA_VISIBLE_DEVICES) or its UUID."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        raise FileNotFoundError("nvidia-smi not on PATH")
    proc = subprocess.run(
        [exe, "--query-gpu=driver_version,name", "--format=csv,noheader", f"--id={device}"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    version, name = (part.strip() for part in proc.stdout.strip().splitlines()[0].split(",", 1))
    return {"driver_version": version, "name": name}


def _cuda_version_text(encoded: int) -> str:
    """CUDA's integer version (1000 * major + 10 * minor) as "major.minor"."""
    return f"{encoded // 1000}.{(encoded % 1000) // 10}"


def _cupy_driver() -> dict:
    import cupy

    encoded = int(cupy.cuda.runtime.driverGetVersion())
    return {"value": encoded, "cuda": _cuda_version_text(encoded)}


def _cupy_runtime() -> dict:
    import cupy

    encoded = int(cupy.cuda.runtime.runtimeGetVersion())
    return {"value": encoded, "cuda": _cuda_version_text(encoded)}


def _cupy_nvrtc() -> str:
    import cupy

    major, minor = cupy.cuda.nvrtc.getVersion()
    return f"{major}.{minor}"


def _kbfuse_nvrtc() -> dict:
    from kbfuse.compilation import nvrtc

    lib = nvrtc.load_library()
    return {
        "version": lib.version,
        "full_version": lib.full_version,
        "library": lib.path,
        "found_via": lib.source,
    }


def _dist_version(name: str) -> str:
    return importlib.metadata.version(name)


def _module_version(name: str) -> str:
    module = __import__(name)
    return str(module.__version__)


def measure_copy_bandwidth(
    nbytes: int = COPY_BUFFER_BYTES,
    warmup: int = COPY_WARMUP,
    repeats: int = COPY_REPEATS,
    device: int = 0,
) -> dict:
    """Median device-to-device copy time of an `nbytes` float32 buffer, CUDA events per copy.

    The buffer is halved (down to MIN_COPY_BUFFER_BYTES) while source and destination would
    take more than half the free memory; `buffer_bytes` records the size used.
    """
    import torch

    if nbytes < 4 or nbytes % 4:
        raise KbfuseError(f"copy buffer size must be a positive multiple of 4 bytes, got {nbytes}")
    if repeats < 1 or warmup < 0:
        raise KbfuseError(f"copy repeats must be >= 1 and warmup >= 0, got {repeats}, {warmup}")
    dev = torch.device("cuda", device)
    free_bytes, _ = torch.cuda.mem_get_info(dev)
    while 4 * nbytes > free_bytes and nbytes > MIN_COPY_BUFFER_BYTES:
        nbytes //= 2  # source + destination must fit with room to spare
    with torch.cuda.device(dev):
        src = torch.ones(nbytes // 4, dtype=torch.float32, device=dev)
        dst = torch.empty_like(src)
        for _ in range(warmup):
            dst.copy_(src)
        events = [
            (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
            for _ in range(repeats)
        ]
        torch.cuda.synchronize(dev)
        for start, end in events:
            start.record()
            dst.copy_(src)
            end.record()
        torch.cuda.synchronize(dev)
        samples = [start.elapsed_time(end) for start, end in events]
        copied = bool(torch.equal(dst, src))
        del src, dst
        torch.cuda.empty_cache()
    if not copied:
        raise KbfuseError("device-to-device copy produced wrong data; bandwidth not recorded")
    median_ms = statistics.median(samples)
    bytes_moved = 2 * nbytes  # every byte read once and written once
    return {
        "bytes_moved": bytes_moved,
        "buffer_bytes": nbytes,
        "median_ms": median_ms,
        "min_ms": min(samples),
        "max_ms": max(samples),
        "samples_ms": samples,
        "gbps": bytes_moved / (median_ms * 1e-3) / 1e9,
        "method": (
            f"torch.Tensor.copy_ of a {nbytes}-byte float32 buffer, device to device; "
            f"CUDA events around each copy; {warmup} warm-up copies, median of {repeats}; "
            "bytes_moved = bytes read + bytes written; gbps = 1e9 bytes/s"
        ),
    }


def fingerprint(copy_bytes: int = COPY_BUFFER_BYTES, device: int = 0, log=None) -> dict:
    """The env/fingerprint.json record (without cuda_cache) for CUDA device `device`."""
    import numpy
    import torch

    if not torch.cuda.is_available():
        raise KbfuseError("env fingerprint needs a CUDA GPU, but torch sees none")
    notes: dict[str, str] = {}
    placed = devices.placed_here()  # a job placed on one GPU of several: nvidia-smi by UUID
    smi_id = placed.uuid if placed is not None and device == 0 else device
    _say(log, f"probing GPU {device} and the CUDA stack")
    record = {
        "kind": "env",
        "schema_version": 1,
        "gpu": _gpu(device),
        "driver": {
            "cuda_driver_api": _probe(notes, "driver.cuda_driver_api", _cupy_driver),
            "nvidia_smi": _probe(notes, "driver.nvidia_smi", lambda: _nvidia_smi(smi_id)),
        },
        "cuda_runtime": _probe(notes, "cuda_runtime", _cupy_runtime),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "cupy": _probe(notes, "cupy", lambda: _module_version("cupy")),
        "nvrtc": {
            **(_probe(notes, "nvrtc", _kbfuse_nvrtc) or {"version": None, "library": None}),
            "cupy_nvrtc_version": _probe(notes, "nvrtc.cupy_nvrtc_version", _cupy_nvrtc),
        },
        "triton": _probe(notes, "triton", lambda: _dist_version("triton")),
        "python": platform.python_version(),
        "python_implementation": platform.python_implementation(),
        "numpy": numpy.__version__,
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
    }
    _say(log, f"GPU: {record['gpu']}; torch {record['torch']} (CUDA {record['torch_cuda']})")
    _say(log, f"measuring device-to-device copy bandwidth with a {copy_bytes}-byte buffer")
    record["copy_bandwidth"] = measure_copy_bandwidth(copy_bytes, device=device)
    _say(
        log,
        f"copy bandwidth: {record['copy_bandwidth']['gbps']:.1f} GB/s "
        f"(median {record['copy_bandwidth']['median_ms']:.4f} ms)",
    )
    record["notes"] = notes
    return record


def write_fingerprint(out, log=None, copy_bytes: int = COPY_BUFFER_BYTES) -> dict:
    """Write results/env/fingerprint.json; `log` is an optional progress-file path."""
    fh = open(log, "a") if log is not None else None  # noqa: SIM115 - closed below
    try:
        record = fingerprint(copy_bytes=copy_bytes, log=fh)
        record["cuda_cache"] = cudacache.current_setting()
        write_json(out, record)
        _say(fh, f"wrote {out}")
        return record
    finally:
        if fh is not None:
            fh.close()
