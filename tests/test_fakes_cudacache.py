"""kbfuse.compilation.cudacache's CUDA-initialised check, both ways, against a fake driver library.

`driver_initialised` asks libcuda only if the process has already loaded it (RTLD_NOLOAD) and
reads cuDeviceGetCount's answer: CUDA_SUCCESS once cuInit has run, CUDA_ERROR_NOT_INITIALIZED
(3) before. The fake stands in for `ctypes.CDLL`, so both answers are checked without a GPU.
"""

from __future__ import annotations

import os
import sys
import types

import pytest

from kbfuse.compilation import cudacache

CUDA_ERROR_NOT_INITIALIZED = 3


class FakeLibcuda:
    """libcuda.so.1 as ctypes sees it: cuDeviceGetCount answers `code` and writes `count`."""

    def __init__(self, code: int, count: int = 1):
        self.code, self.count, self.calls = code, count, 0

    def cuDeviceGetCount(self, ref) -> int:  # noqa: N802 (the driver's name)
        self.calls += 1
        if self.code == cudacache.CUDA_SUCCESS:
            ref._obj.value = self.count
        return self.code


@pytest.fixture
def fake_cdll(monkeypatch):
    """install(library or OSError) -> the list of (name, mode) that CDLL was asked for."""
    asked: list[tuple[str, int]] = []

    def install(library):
        def cdll(name, mode=0):
            asked.append((name, mode))
            if isinstance(library, OSError):
                raise library
            return library

        monkeypatch.setattr(cudacache.ctypes, "CDLL", cdll)
        return asked

    return install


def test_a_process_without_libcuda_loaded_is_not_initialised(fake_cdll):
    asked = fake_cdll(OSError("libcuda.so.1: cannot open shared object file"))
    assert cudacache.driver_initialised() is False
    assert asked == [("libcuda.so.1", getattr(os, "RTLD_NOLOAD", 4))]


def test_a_loaded_driver_before_cuinit_is_not_initialised(fake_cdll):
    library = FakeLibcuda(CUDA_ERROR_NOT_INITIALIZED)
    fake_cdll(library)
    assert cudacache.driver_initialised() is False
    assert library.calls == 1


@pytest.mark.parametrize("count", [0, 1, 8])
def test_a_driver_that_answers_is_initialised(fake_cdll, count):
    library = FakeLibcuda(cudacache.CUDA_SUCCESS, count=count)
    fake_cdll(library)
    assert cudacache.driver_initialised() is True
    assert library.calls == 1


@pytest.fixture
def no_cuda_modules(monkeypatch):
    """cupy not imported, torch replaced by a module whose CUDA is not initialised."""
    monkeypatch.delitem(sys.modules, "cupy", raising=False)
    fake_torch = types.ModuleType("torch")
    fake_torch.cuda = types.SimpleNamespace(is_initialized=lambda: False)
    monkeypatch.setitem(sys.modules, "torch", fake_torch)
    return fake_torch


def test_cuda_initialised_is_none_while_nothing_started_cuda(fake_cdll, no_cuda_modules):
    fake_cdll(FakeLibcuda(CUDA_ERROR_NOT_INITIALIZED))
    assert cudacache.cuda_initialised() is None
    del no_cuda_modules.cuda  # a torch without a cuda submodule has not started CUDA either
    assert cudacache.cuda_initialised() is None


def test_cuda_initialised_names_the_driver(fake_cdll, no_cuda_modules):
    fake_cdll(FakeLibcuda(cudacache.CUDA_SUCCESS))
    assert cudacache.cuda_initialised() == (
        "the CUDA driver is already initialised in this process (cuInit has run)"
    )


def test_cuda_initialised_names_cupy(fake_cdll, no_cuda_modules, monkeypatch):
    fake_cdll(OSError("not loaded"))
    monkeypatch.setitem(sys.modules, "cupy", types.ModuleType("cupy"))
    assert cudacache.cuda_initialised() == "cupy is already imported"


def test_cuda_initialised_names_torch(fake_cdll, no_cuda_modules):
    fake_cdll(OSError("not loaded"))
    no_cuda_modules.cuda = types.SimpleNamespace(is_initialized=lambda: True)
    assert cudacache.cuda_initialised() == "torch.cuda is already initialised"


def test_cuda_initialised_without_torch_imported(fake_cdll, no_cuda_modules, monkeypatch):
    fake_cdll(OSError("not loaded"))
    monkeypatch.delitem(sys.modules, "torch")
    assert cudacache.cuda_initialised() is None
