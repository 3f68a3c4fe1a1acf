"""kbfuse.workflow.jobs.require_gpu: the driver is asked first; torch only for stages that use
it."""

from __future__ import annotations

import sys

import pytest

from kbfuse.compilation import cudadriver
from kbfuse.workflow import jobs


def test_no_driver_is_named_with_the_advice(monkeypatch):
    def no_driver():
        raise cudadriver.NoCudaDriver("the CUDA driver library libcuda.so.1 cannot be loaded")

    monkeypatch.setattr(cudadriver, "device_count", no_driver)
    with pytest.raises(jobs.NoGPUError, match="the CUDA driver sees none") as info:
        jobs.require_gpu("compile", torch=False)
    message = str(info.value)
    assert "stage 'compile' needs a CUDA GPU, but the CUDA driver sees none" in message
    assert "libcuda.so.1 cannot be loaded" in message
    assert message.endswith(jobs.ADVICE)


def test_zero_devices_is_named(monkeypatch):
    monkeypatch.setattr(cudadriver, "device_count", lambda: 0)
    with pytest.raises(jobs.NoGPUError, match=r"driver sees none \(it reports 0 devices\)"):
        jobs.require_gpu("verify")


def test_a_driver_only_stage_never_imports_torch(monkeypatch):
    monkeypatch.setattr(cudadriver, "device_count", lambda: 1)
    monkeypatch.setitem(sys.modules, "torch", None)  # importing torch would now fail
    jobs.require_gpu("compile", torch=False)
    with pytest.raises(ImportError, match="torch"):
        jobs.require_gpu("correctness", torch=True)


def test_torch_without_cuda_is_named(monkeypatch):
    import torch

    monkeypatch.setattr(cudadriver, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(jobs.NoGPUError, match="stage 'timing' needs a CUDA GPU, but torch sees"):
        jobs.require_gpu("timing")
