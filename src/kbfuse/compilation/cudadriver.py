"""A few CUDA driver calls through ctypes: the GPU's compute capability without importing torch.

`arch: auto` compile jobs only need "sm_XY" of GPU 0; importing torch for that costs about 2 s
per job. libcuda.so.1 (installed with the NVIDIA driver, not with the toolkit) answers in a few
milliseconds: cuInit(0), cuDeviceGet(&dev, 0), cuDeviceGetAttribute(COMPUTE_CAPABILITY_MAJOR /
MINOR). Device 0 is the first device CUDA_VISIBLE_DEVICES leaves visible, as for torch.

cuInit initialises the driver in this process: call kbfuse.compilation.cudacache.isolate before
(the job
wrapper kbfuse.workflow.jobs.job does), as before any other CUDA work.

Why ctypes rather than NVIDIA's `cuda.bindings.driver`: for these five calls it would add a
dependency that CPU installs do not otherwise have, published per CUDA major (12.x, 13.x) and
so to be matched with each machine's driver, while `cuda.pathfinder` finds the driver library
only by the system search that loading libcuda.so.1 here already is (its own error says so).
Revisit if kbfuse ever needs more of the driver API.

Errors are KbfuseErrors that name the problem: `NoCudaDriver` (the library cannot be loaded),
`NoCudaDevice` (the driver reports no GPU), `CudaDriverError` (any other failing call, with the
driver's own error name).
"""

from __future__ import annotations

import ctypes

from kbfuse.errors import KbfuseError

LIBRARY = "libcuda.so.1"

CUDA_SUCCESS = 0
CUDA_ERROR_NO_DEVICE = 100
CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75
CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76

# name -> (argtypes, restype) of every function used here; CUresult is an enum (int).
_SIGNATURES = {
    "cuInit": ([ctypes.c_uint], ctypes.c_int),
    "cuDeviceGetCount": ([ctypes.POINTER(ctypes.c_int)], ctypes.c_int),
    "cuDeviceGet": ([ctypes.POINTER(ctypes.c_int), ctypes.c_int], ctypes.c_int),
    "cuDeviceGetAttribute": (
        [ctypes.POINTER(ctypes.c_int), ctypes.c_int, ctypes.c_int],
        ctypes.c_int,
    ),
    "cuGetErrorName": ([ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)], ctypes.c_int),
}


class CudaDriverError(KbfuseError):
    """A CUDA driver call failed; `call` and `code` say which and how."""

    def __init__(self, message: str, call: str | None = None, code: int | None = None):
        super().__init__(message)
        self.call = call
        self.code = code


class NoCudaDriver(CudaDriverError):
    """libcuda cannot be loaded (no NVIDIA driver on this machine, or not on the loader path)."""


class NoCudaDevice(CudaDriverError):
    """The driver loads but reports no GPU (none installed, or CUDA_VISIBLE_DEVICES hides all)."""


def load_library(name: str = LIBRARY):
    """The driver library (a ctypes.CDLL); tests replace this function to simulate machines."""
    return ctypes.CDLL(name)


def _open():
    try:
        lib = load_library()
    except OSError as exc:
        raise NoCudaDriver(
            f"the CUDA driver library {LIBRARY} (installed with the NVIDIA driver) cannot be "
            f"loaded ({exc})"
        ) from exc
    for name, (argtypes, restype) in _SIGNATURES.items():
        function = getattr(lib, name, None)
        if function is None:
            raise CudaDriverError(f"the CUDA driver library {LIBRARY} has no function {name}")
        function.argtypes = argtypes
        function.restype = restype
    return lib


def error_name(lib, code: int) -> str:
    """The driver's name for a CUresult (e.g. CUDA_ERROR_NO_DEVICE), or CUresult <code>."""
    name = ctypes.c_char_p()
    try:
        if lib.cuGetErrorName(code, ctypes.byref(name)) == CUDA_SUCCESS and name.value:
            return name.value.decode(errors="replace")
    except Exception:  # the name is a courtesy; the code alone still says it
        pass
    return f"CUresult {code}"


def _check(lib, call: str, code: int) -> None:
    if code == CUDA_SUCCESS:
        return
    name = error_name(lib, code)
    if code == CUDA_ERROR_NO_DEVICE:
        raise NoCudaDevice(f"the CUDA driver reports no GPU ({call}: {name})", call=call, code=code)
    raise CudaDriverError(f"CUDA driver call {call} failed with {name} ({code})", call, code)


def _initialised():
    lib = _open()
    _check(lib, "cuInit(0)", lib.cuInit(0))
    return lib


def device_count() -> int:
    """Number of GPUs the driver sees (0 when it reports none); NoCudaDriver without libcuda."""
    try:
        lib = _initialised()
    except NoCudaDevice:
        return 0
    count = ctypes.c_int(0)
    _check(lib, "cuDeviceGetCount", lib.cuDeviceGetCount(ctypes.byref(count)))
    return int(count.value)


def compute_capability(ordinal: int = 0) -> tuple[int, int]:
    """(major, minor) compute capability of GPU `ordinal`; NoCudaDevice where there is none."""
    lib = _initialised()
    count = ctypes.c_int(0)
    _check(lib, "cuDeviceGetCount", lib.cuDeviceGetCount(ctypes.byref(count)))
    if count.value <= ordinal:
        raise NoCudaDevice(
            f"the CUDA driver reports {count.value} GPU(s), so there is no device {ordinal}",
            call="cuDeviceGetCount",
        )
    device = ctypes.c_int(0)
    _check(lib, f"cuDeviceGet({ordinal})", lib.cuDeviceGet(ctypes.byref(device), ordinal))
    values = []
    for attribute, label in (
        (CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, "COMPUTE_CAPABILITY_MAJOR"),
        (CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, "COMPUTE_CAPABILITY_MINOR"),
    ):
        value = ctypes.c_int(-1)
        code = lib.cuDeviceGetAttribute(ctypes.byref(value), attribute, device.value)
        _check(lib, f"cuDeviceGetAttribute({label})", code)
        values.append(int(value.value))
    major, minor = values
    if major <= 0 or minor < 0:
        raise CudaDriverError(
            f"the CUDA driver gave an impossible compute capability {major}.{minor} "
            f"for device {ordinal}"
        )
    return major, minor
