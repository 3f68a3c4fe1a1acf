"""kbfuse.cudadriver (the compute capability through libcuda, no torch) and `arch: auto`.

The driver library is replaced by `FakeDriver`, a stand-in whose functions write their results
through the ctypes pointers kbfuse passes, as libcuda does; so every error path (no library, no
device, a failing call) is checked on a machine without a GPU. This module imports no torch,
so a child process can import it to fake the driver (see test_compile.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from kbfuse.compilation import cudadriver
from kbfuse.compilation.compile import gpu_arch, resolve_arch
from kbfuse.errors import KbfuseError

ERROR_NAMES = {
    0: "CUDA_SUCCESS",
    3: "CUDA_ERROR_NOT_INITIALIZED",
    34: "CUDA_ERROR_STUB_LIBRARY",
    35: "CUDA_ERROR_INSUFFICIENT_DRIVER",
    100: "CUDA_ERROR_NO_DEVICE",
    101: "CUDA_ERROR_INVALID_DEVICE",
}
FUNCTIONS = (
    "cuInit",
    "cuDeviceGetCount",
    "cuDeviceGet",
    "cuDeviceGetAttribute",
    "cuDeviceGetUuid",
    "cuDeviceGetName",
    "cuGetErrorName",
)
ROOT = Path(__file__).resolve().parents[1]
ADVICE = r"set arch: sm_XY in the config \(e.g. sm_90 for H100/H200\)"


class FakeDriver:
    """A `cuda.bindings.driver` stand-in: each function returns (CUresult, value...) as the
    binding does; `capabilities[i]` is device i's (major, minor); `fail` maps a function name
    to the CUresult it returns instead of CUDA_SUCCESS."""

    CUdevice_attribute = SimpleNamespace(
        CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR=75,
        CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR=76,
    )

    def __init__(self, capabilities=((9, 0),), fail=None, missing=()):
        self.capabilities = list(capabilities)
        self.fail = dict(fail or {})
        self.calls: list[str] = []
        for name in FUNCTIONS:
            if name not in missing:
                setattr(self, name, self._function(name))

    def _function(self, name):
        body = getattr(self, "_" + name)

        def function(*args):
            self.calls.append(name)
            if name in self.fail:
                return (self.fail[name], None)
            return body(*args)

        return function

    def _cuInit(self, flags):
        assert flags == 0
        return (0,) if self.capabilities else (100,)  # libcuda: no device fails cuInit

    def _cuDeviceGetCount(self):
        return (0, len(self.capabilities))

    def _cuDeviceGet(self, ordinal):
        if not 0 <= ordinal < len(self.capabilities):
            return (101, None)
        return (0, 1000 + ordinal)  # a handle, not the ordinal itself

    def _cuDeviceGetAttribute(self, attribute, device):
        major, minor = self.capabilities[device - 1000]
        attributes = {75: major, 76: minor}
        if attribute not in attributes:
            return (1, None)  # CUDA_ERROR_INVALID_VALUE
        return (0, attributes[attribute])

    def _cuDeviceGetUuid(self, device):
        return (0, SimpleNamespace(bytes=bytes(range(16 * (device - 1000), 16 * (device - 999)))))

    def _cuDeviceGetName(self, length, device):
        assert length >= 64
        return (0, f"Fake GPU {device - 1000}".encode() + b"\0" * 8)

    def _cuGetErrorName(self, code):
        if code not in ERROR_NAMES:
            return (1, None)
        return (0, ERROR_NAMES[code].encode())


def use(monkeypatch, driver) -> None:
    """Make kbfuse.cudadriver ask `driver` (an object, or an exception its first call raises)."""
    if isinstance(driver, BaseException):
        failing = FakeDriver()
        for name in FUNCTIONS:
            setattr(failing, name, lambda *args, error=driver: (_ for _ in ()).throw(error))
        driver = failing
    monkeypatch.setattr(cudadriver, "load_driver", lambda: driver)


MISSING = RuntimeError("Failed to dlopen libcuda.so.1")  # what cuda-bindings raises


def test_compute_capability_reads_major_and_minor_of_device_0(monkeypatch):
    driver = FakeDriver(capabilities=[(9, 0), (8, 6)])
    use(monkeypatch, driver)
    assert cudadriver.compute_capability() == (9, 0)
    assert cudadriver.compute_capability(1) == (8, 6)
    assert driver.calls[:3] == ["cuInit", "cuDeviceGetCount", "cuDeviceGet"]
    assert cudadriver.device_count() == 2


def test_device_uuid_is_written_as_nvidia_smi_writes_it(monkeypatch):
    use(monkeypatch, FakeDriver(capabilities=[(9, 0), (8, 6)]))
    assert cudadriver.device_uuid() == "GPU-00010203-0405-0607-0809-0a0b0c0d0e0f"
    assert cudadriver.device_uuid(1) == "GPU-10111213-1415-1617-1819-1a1b1c1d1e1f"
    use(monkeypatch, FakeDriver(fail={"cuDeviceGetUuid": 101}))
    with pytest.raises(cudadriver.CudaDriverError, match="cuDeviceGetUuid failed with CUDA_ERR"):
        cudadriver.device_uuid()
    assert gpu_arch() == resolve_arch("auto") == "sm_90"


def test_device_name_is_the_drivers_up_to_its_nul(monkeypatch):
    use(monkeypatch, FakeDriver(capabilities=[(9, 0), (9, 0)]))
    assert cudadriver.device_name() == "Fake GPU 0"
    assert cudadriver.device_name(1) == "Fake GPU 1"
    use(monkeypatch, FakeDriver(fail={"cuDeviceGetName": 101}))
    with pytest.raises(cudadriver.CudaDriverError, match="cuDeviceGetName failed"):
        cudadriver.device_name()


@pytest.mark.parametrize(("capability", "arch"), [((8, 0), "sm_80"), ((10, 0), "sm_100")])
def test_gpu_arch_is_sm_major_minor(monkeypatch, capability, arch):
    use(monkeypatch, FakeDriver(capabilities=[capability]))
    assert gpu_arch() == arch


def test_missing_library_names_it_and_says_what_to_set(monkeypatch):
    use(monkeypatch, MISSING)
    with pytest.raises(cudadriver.NoCudaDriver, match=r"libcuda\.so\.1 .* cannot be loaded"):
        cudadriver.compute_capability()
    with pytest.raises(cudadriver.NoCudaDriver, match=r"libcuda\.so\.1 .* cannot be loaded"):
        cudadriver.device_count()
    with pytest.raises(KbfuseError, match=r"arch: auto needs a GPU.*libcuda\.so\.1.*" + ADVICE):
        gpu_arch()


def test_driver_without_a_device(monkeypatch):
    use(monkeypatch, FakeDriver(capabilities=[]))
    assert cudadriver.device_count() == 0
    with pytest.raises(cudadriver.NoCudaDevice, match=r"no GPU \(cuInit\(0\): CUDA_ERROR_NO_DEV"):
        cudadriver.compute_capability()
    with pytest.raises(KbfuseError, match="arch: auto needs a GPU, but the CUDA driver reports no"):
        gpu_arch()
    with pytest.raises(KbfuseError, match=ADVICE):
        gpu_arch()


def test_device_count_zero_after_a_successful_init(monkeypatch):
    driver = FakeDriver(capabilities=[])
    driver.fail["cuInit"] = 0  # an initialised driver that then counts no device
    use(monkeypatch, driver)
    with pytest.raises(cudadriver.NoCudaDevice, match="reports 0 GPU"):
        cudadriver.compute_capability()
    with pytest.raises(KbfuseError, match="arch: auto needs a GPU, but .*reports 0 GPU.*" + ADVICE):
        gpu_arch()


def test_device_beyond_the_count(monkeypatch):
    use(monkeypatch, FakeDriver(capabilities=[(9, 0)]))
    with pytest.raises(cudadriver.NoCudaDevice, match="reports 1 GPU.*no device 1"):
        cudadriver.compute_capability(1)


@pytest.mark.parametrize(
    ("fail", "message"),
    [
        ({"cuInit": 35}, r"cuInit\(0\) failed with CUDA_ERROR_INSUFFICIENT_DRIVER \(35\)"),
        ({"cuInit": 34}, r"cuInit\(0\) failed with CUDA_ERROR_STUB_LIBRARY \(34\)"),
        ({"cuDeviceGet": 101}, r"cuDeviceGet\(0\) failed with CUDA_ERROR_INVALID_DEVICE"),
        ({"cuDeviceGetAttribute": 999}, r"COMPUTE_CAPABILITY_MAJOR\) failed with CUresult 999"),
    ],
)
def test_a_failing_driver_call_is_named_with_the_drivers_error(monkeypatch, fail, message):
    use(monkeypatch, FakeDriver(fail=fail))
    with pytest.raises(cudadriver.CudaDriverError, match=message) as caught:
        cudadriver.compute_capability()
    assert not isinstance(caught.value, cudadriver.NoCudaDevice | cudadriver.NoCudaDriver)
    assert caught.value.code == next(iter(fail.values()))
    with pytest.raises(KbfuseError, match="arch: auto needs a GPU's compute capability, but "):
        gpu_arch()


def test_error_name_falls_back_to_the_code(monkeypatch):
    driver = FakeDriver(fail={"cuGetErrorName": 1})
    assert cudadriver.error_name(driver, 100) == "CUresult 100"
    assert cudadriver.error_name(FakeDriver(), 100) == "CUDA_ERROR_NO_DEVICE"


def test_library_without_a_function(monkeypatch):
    use(monkeypatch, FakeDriver(missing=("cuDeviceGetAttribute",)))
    with pytest.raises(cudadriver.CudaDriverError, match="has no driver function cuDeviceGetAtt"):
        cudadriver.compute_capability()


def test_missing_cuda_bindings_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "cuda.bindings", None)  # import fails as if not installed
    monkeypatch.setitem(sys.modules, "cuda.bindings.driver", None)
    with pytest.raises(
        cudadriver.NoCudaDriver, match=r"cuda-bindings.*not installed.*kbfuse\[cuda13\]"
    ):
        cudadriver.load_driver()
    with pytest.raises(KbfuseError, match=r"arch: auto needs a GPU.*cuda-bindings"):
        gpu_arch()


def test_the_fake_speaks_the_real_bindings_api():
    """FakeDriver stands in for `cuda.bindings.driver` (a `test` extra): the functions and
    attribute members kbfuse uses exist there, with the driver API's values, and a CUresult
    converts to the int kbfuse compares."""
    from cuda.bindings import driver

    for name in FUNCTIONS:
        assert callable(getattr(driver, name)), name
    for name in cudadriver.CAPABILITY_ATTRIBUTES:
        assert int(getattr(driver.CUdevice_attribute, name)) == getattr(
            FakeDriver.CUdevice_attribute, name
        )
    assert int(driver.CUresult.CUDA_ERROR_NO_DEVICE) == cudadriver.CUDA_ERROR_NO_DEVICE == 100
    assert int(driver.CUresult.CUDA_SUCCESS) == cudadriver.CUDA_SUCCESS
    assert cudadriver.load_driver() is driver


def test_impossible_capability_is_refused(monkeypatch):
    use(monkeypatch, FakeDriver(capabilities=[(0, 0)]))
    with pytest.raises(cudadriver.CudaDriverError, match="impossible compute capability 0.0"):
        cudadriver.compute_capability()


_REAL_DRIVER = """
import json, sys, tempfile
from kbfuse.compilation import cudacache, cudadriver
cudacache.isolate(tempfile.mkdtemp())  # as every job does before cuInit
try:
    answer = {"capability": list(cudadriver.compute_capability())}
except (cudadriver.NoCudaDriver, cudadriver.NoCudaDevice) as exc:
    answer = {"error": type(exc).__name__, "message": str(exc)}
answer["torch_imported"] = "torch" in sys.modules
print(json.dumps(answer))
"""


def test_this_machines_driver_answers_or_is_named():
    """The real libcuda, in a child process (cuInit here would make later cache isolation in
    this process impossible): a capability where a GPU is, a named error everywhere else."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "src"), env.get("PYTHONPATH")]))
    proc = subprocess.run(
        [sys.executable, "-c", _REAL_DRIVER], env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    answer = json.loads(proc.stdout)
    assert answer["torch_imported"] is False
    if "error" in answer:
        assert "CUDA driver" in answer["message"], answer
    else:
        major, minor = answer["capability"]
        assert major >= 1 and minor >= 0
