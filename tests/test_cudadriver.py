"""kbfuse.compilation.cudadriver (the compute capability through libcuda, no torch) and `arch:
auto`.

The driver library is replaced by `FakeDriver`, a stand-in whose functions write their results
through the ctypes pointers kbfuse passes, as libcuda does; so every error path (no library, no
device, a failing call) is checked on a machine without a GPU. This module imports no torch,
so a child process can import it to fake the driver (see test_compile.py).
"""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
from pathlib import Path

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
ROOT = Path(__file__).resolve().parents[1]
ADVICE = r"set arch: sm_XY in the config \(e.g. sm_90 for H100/H200\)"


class FakeDriver:
    """A libcuda stand-in: `capabilities[i]` is device i's (major, minor); `fail` maps a function
    name to the CUresult it returns instead of CUDA_SUCCESS."""

    def __init__(self, capabilities=((9, 0),), fail=None, missing=()):
        self.capabilities = list(capabilities)
        self.fail = dict(fail or {})
        self.calls: list[str] = []
        for name in cudadriver._SIGNATURES:
            if name not in missing:
                # plain functions (not bound methods), so kbfuse can set argtypes on them
                setattr(self, name, self._function(name))

    def _function(self, name):
        body = getattr(self, "_" + name)

        def function(*args):
            self.calls.append(name)
            if name in self.fail:
                return self.fail[name]
            return body(*args)

        function.__name__ = name
        return function

    @staticmethod
    def _set(pointer, value) -> None:
        pointer._obj.value = value  # what byref() wraps

    def _cuInit(self, flags):
        assert flags == 0
        return 0 if self.capabilities else 100  # libcuda: no device fails cuInit

    def _cuDeviceGetCount(self, count):
        self._set(count, len(self.capabilities))
        return 0

    def _cuDeviceGet(self, device, ordinal):
        if not 0 <= ordinal < len(self.capabilities):
            return 101
        self._set(device, 1000 + ordinal)  # a handle, not the ordinal itself
        return 0

    def _cuDeviceGetAttribute(self, value, attribute, device):
        major, minor = self.capabilities[device - 1000]
        attributes = {
            cudadriver.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: major,
            cudadriver.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: minor,
        }
        if attribute not in attributes:
            return 1  # CUDA_ERROR_INVALID_VALUE
        self._set(value, attributes[attribute])
        return 0

    def _cuGetErrorName(self, code, name):
        if code not in ERROR_NAMES:
            return 1
        self._set(name, ERROR_NAMES[code].encode())
        return 0


def use(monkeypatch, driver) -> None:
    """Make kbfuse.compilation.cudadriver load `driver` (an object, or an exception to raise)."""

    def load_library(name=cudadriver.LIBRARY):
        assert name == "libcuda.so.1"
        if isinstance(driver, BaseException):
            raise driver
        return driver

    monkeypatch.setattr(cudadriver, "load_library", load_library)


MISSING = OSError("libcuda.so.1: cannot open shared object file: No such file or directory")


def test_compute_capability_reads_major_and_minor_of_device_0(monkeypatch):
    driver = FakeDriver(capabilities=[(9, 0), (8, 6)])
    use(monkeypatch, driver)
    assert cudadriver.compute_capability() == (9, 0)
    assert cudadriver.compute_capability(1) == (8, 6)
    assert driver.calls[:3] == ["cuInit", "cuDeviceGetCount", "cuDeviceGet"]
    assert cudadriver.device_count() == 2
    assert gpu_arch() == resolve_arch("auto") == "sm_90"
    # the argument types kbfuse declares are the driver API's
    assert driver.cuDeviceGetAttribute.argtypes == [
        ctypes.POINTER(ctypes.c_int),
        ctypes.c_int,
        ctypes.c_int,
    ]
    assert driver.cuInit.restype is ctypes.c_int


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
    with pytest.raises(cudadriver.CudaDriverError, match="has no function cuDeviceGetAttribute"):
        cudadriver.compute_capability()


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
