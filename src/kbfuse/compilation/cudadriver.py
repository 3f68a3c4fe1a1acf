"""The GPU's compute capability without importing torch, through NVIDIA's `cuda.bindings.driver`.

`arch: auto` compile jobs only need "sm_XY" of GPU 0, and every GPU job first asks whether the
driver sees a GPU at all; importing torch for that costs about 2 s per job, while the driver
answers in a few milliseconds: cuInit(0), cuDeviceGetCount, cuDeviceGet(0),
cuDeviceGetAttribute(COMPUTE_CAPABILITY_MAJOR / MINOR). Device 0 is the first device
CUDA_VISIBLE_DEVICES leaves visible, as for torch.

The calls go through `cuda-bindings` (installed by the `cuda12`/`cuda13` extras, matching the
machine's CUDA major, and by the `test` extra), which loads libcuda.so.1 (installed with the
NVIDIA driver, not with the toolkit) on the first call. cuInit initialises the driver in this
process: call kbfuse.compilation.cudacache.isolate before (the job wrapper
kbfuse.workflow.jobs.job does), as before any other CUDA work. (cudacache keeps one small ctypes
call of its own: asking whether this process has *already* loaded libcuda, without loading it,
which no binding offers.)

Errors are KbfuseErrors that name the problem: `NoCudaDriver` (cuda-bindings is not installed,
or libcuda cannot be loaded), `NoCudaDevice` (the driver reports no GPU), `CudaDriverError` (any
other failing call, with the driver's own error name).
"""

from __future__ import annotations

from kbfuse.errors import KbfuseError

LIBRARY = "libcuda.so.1"
INSTALL_HINT = "pip install 'kbfuse[cuda13]' (or 'kbfuse[cuda12]' for a CUDA 12 driver)"

CUDA_SUCCESS = 0
CUDA_ERROR_NO_DEVICE = 100
# cuda.bindings.driver.CUdevice_attribute member names of the two attributes read here
CAPABILITY_ATTRIBUTES = (
    "CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR",
    "CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR",
)


class CudaDriverError(KbfuseError):
    """A CUDA driver call failed; `call` and `code` say which and how."""

    def __init__(self, message: str, call: str | None = None, code: int | None = None):
        super().__init__(message)
        self.call = call
        self.code = code


class NoCudaDriver(CudaDriverError):
    """No driver to ask: cuda-bindings is missing, or libcuda cannot be loaded (no NVIDIA driver
    on this machine, or not on the loader path)."""


class NoCudaDevice(CudaDriverError):
    """The driver loads but reports no GPU (none installed, or CUDA_VISIBLE_DEVICES hides all)."""


def load_driver():
    """The `cuda.bindings.driver` module; tests replace this function to simulate machines."""
    try:
        from cuda.bindings import driver
    except ImportError as exc:
        raise NoCudaDriver(
            f"NVIDIA's cuda-bindings, through which kbfuse asks the CUDA driver, is not "
            f"installed ({exc}): {INSTALL_HINT}"
        ) from exc
    return driver


def error_name(driver, code: int) -> str:
    """The driver's name for a CUresult (e.g. CUDA_ERROR_NO_DEVICE), or CUresult <code>."""
    try:
        status, name = driver.cuGetErrorName(code)
        if int(status) == CUDA_SUCCESS and name:
            return name.decode(errors="replace") if isinstance(name, bytes) else str(name)
    except Exception:  # the name is a courtesy; the code alone still says it
        pass
    return f"CUresult {int(code)}"


def _call(driver, label: str, function: str, *args):
    """`driver.<function>(*args)`, its CUresult checked; the values it returns after it."""
    bound = getattr(driver, function, None)
    if bound is None:
        raise CudaDriverError(f"this cuda-bindings has no driver function {function}", label)
    try:
        status, *values = bound(*args)
    except RuntimeError as exc:  # cuda-bindings loads libcuda on the first call
        raise NoCudaDriver(
            f"the CUDA driver library {LIBRARY} (installed with the NVIDIA driver) cannot be "
            f"loaded ({exc})"
        ) from exc
    code = int(status)
    if code == CUDA_ERROR_NO_DEVICE:
        name = error_name(driver, status)
        raise NoCudaDevice(f"the CUDA driver reports no GPU ({label}: {name})", label, code)
    if code != CUDA_SUCCESS:
        name = error_name(driver, status)
        raise CudaDriverError(f"CUDA driver call {label} failed with {name} ({code})", label, code)
    return values[0] if len(values) == 1 else tuple(values)


def _initialised():
    driver = load_driver()
    _call(driver, "cuInit(0)", "cuInit", 0)
    return driver


def device_count() -> int:
    """Number of GPUs the driver sees (0 when it reports none); NoCudaDriver without a driver."""
    try:
        driver = _initialised()
    except NoCudaDevice:
        return 0
    return int(_call(driver, "cuDeviceGetCount", "cuDeviceGetCount"))


def device_uuid(ordinal: int = 0) -> str:
    """GPU `ordinal`'s UUID as nvidia-smi writes it (GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx):
    the same physical GPU under any CUDA_VISIBLE_DEVICES numbering."""
    driver = _initialised()
    device = _call(driver, f"cuDeviceGet({ordinal})", "cuDeviceGet", ordinal)
    raw = bytes(_call(driver, "cuDeviceGetUuid", "cuDeviceGetUuid", device).bytes).hex()
    return f"GPU-{raw[:8]}-{raw[8:12]}-{raw[12:16]}-{raw[16:20]}-{raw[20:32]}"


def device_name(ordinal: int = 0) -> str:
    """GPU `ordinal`'s name as the driver gives it (e.g. "NVIDIA H200")."""
    driver = _initialised()
    device = _call(driver, f"cuDeviceGet({ordinal})", "cuDeviceGet", ordinal)
    raw = _call(driver, "cuDeviceGetName", "cuDeviceGetName", 256, device)
    raw = bytes(raw) if not isinstance(raw, str) else raw.encode()
    return raw.split(b"\0", 1)[0].decode(errors="replace").strip()


def compute_capability(ordinal: int = 0) -> tuple[int, int]:
    """(major, minor) compute capability of GPU `ordinal`; NoCudaDevice where there is none."""
    driver = _initialised()
    count = int(_call(driver, "cuDeviceGetCount", "cuDeviceGetCount"))
    if count <= ordinal:
        raise NoCudaDevice(
            f"the CUDA driver reports {count} GPU(s), so there is no device {ordinal}",
            call="cuDeviceGetCount",
        )
    device = _call(driver, f"cuDeviceGet({ordinal})", "cuDeviceGet", ordinal)
    major, minor = (
        int(
            _call(
                driver,
                f"cuDeviceGetAttribute({name.removeprefix('CU_DEVICE_ATTRIBUTE_')})",
                "cuDeviceGetAttribute",
                getattr(driver.CUdevice_attribute, name),
                device,
            )
        )
        for name in CAPABILITY_ATTRIBUTES
    )
    if major <= 0 or minor < 0:
        raise CudaDriverError(
            f"the CUDA driver gave an impossible compute capability {major}.{minor} "
            f"for device {ordinal}"
        )
    return major, minor
