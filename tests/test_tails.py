"""The tails registry on the CPU: reference tails, argument tuples, validation, bytes moved."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from kbfuse.errors import KbfuseError
from kbfuse.tasks.kernelbench import build_model, load_task, pin_kernelbench
from kbfuse.tasks.tails import TAILS, check_tail_input, tail_for

TASKS = (53, 81, 95)


@pytest.fixture(scope="module")
def specs(kb_repo, tmp_path_factory):
    url, commit = kb_repo
    root = tmp_path_factory.mktemp("pin")
    pin = pin_kernelbench(url, commit, 2, list(TASKS), root / "checkout", root / "pin.json")
    return {task: load_task(root / "checkout", pin, task) for task in TASKS}


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int32)


def test_registry_names_kernels_and_library_layers():
    assert sorted(TAILS) == [4, 53, 65, 81, 95]
    assert {t: (TAILS[t].kernel, TAILS[t].library_attr) for t in TASKS} == {
        53: ("tail53", "gemm"),
        81: ("tail81", "gemm"),
        95: ("tail95", "matmul"),
    }
    assert {t: TAILS[t].library_kind for t in TAILS} == {
        53: "nn.Linear",
        81: "nn.Linear",
        95: "nn.Linear",
        4: "nn.Conv2d",
        65: "nn.Conv2d",
    }
    assert tail_for(81) is TAILS[81]
    assert tail_for("95") is TAILS[95]


def test_unknown_task_is_named():
    with pytest.raises(KbfuseError, match=r"task 12 has no fused tail.*\[4, 53, 65, 81, 95\]"):
        tail_for(12)


@pytest.mark.parametrize("task", TASKS)
@pytest.mark.parametrize("scale", [1.0, 100.0, -100.0, 1e-3])
def test_reference_tail_reproduces_model_forward_bitwise(specs, task, scale):
    spec = specs[task]
    model = build_model(spec, seed=3, device="cpu")
    tail = tail_for(task)
    torch.manual_seed(7)
    (x,) = spec.module.get_inputs()
    x = x * scale
    with torch.no_grad():
        full = model(x)
        y = tail.library(model)(x)
    assert torch.equal(tail.library_output(model, x), y)
    ref = tail.reference(model, y)
    assert ref.dtype == torch.float32 and ref.shape == full.shape
    assert torch.equal(bits(ref), bits(full))
    # the shallow copy's Identity never leaks into the model itself
    assert isinstance(getattr(model, tail.library_attr), nn.Linear)


def test_reference_tail_propagates_nan_and_keeps_clamp_values(specs):
    model = build_model(specs[81], seed=0, device="cpu")
    y = torch.tensor([[float("nan"), -88.0, 1e4, -1e4, 0.0]])
    ref = TAILS[81].reference(model, y)
    assert torch.isnan(ref[0, 0])
    # sigmoid(-88) is subnormal on the CPU too: the product survives, tiny and negative
    assert ref[0, 1].item() == pytest.approx(-2.6640246534862188e-37, rel=1e-6)
    assert ref[0, 2].item() == pytest.approx(np.tanh(1.0), rel=1e-6)
    assert ref[0, 3].item() == 0.0 and ref[0, 4].item() == 0.0


def test_linear_must_be_an_nn_linear(specs):
    model = build_model(specs[53], seed=0, device="cpu")
    model.gemm = nn.Identity()
    with pytest.raises(KbfuseError, match="'gemm' is Identity, expected nn.Linear"):
        TAILS[53].library(model)


def test_kernel_args_53_read_parameters_from_the_model(specs):
    model = build_model(specs[53], seed=0, device="cpu")
    y = torch.zeros(4, 64)
    out = torch.empty_like(y)
    args = TAILS[53].kernel_args(model, y, out, require_cuda=False)
    assert [type(a) for a in args] == [np.uint64, np.uint64, np.int64] + [np.float32] * 3
    assert args[:3] == (y.data_ptr(), out.data_ptr(), 256)
    assert args[3:] == (np.float32(0.5), np.float32(-2.0), np.float32(2.0))
    model.scaling_factor = 0.1  # not a constant in the registry: whatever the model holds
    model.hardtanh.min_val, model.hardtanh.max_val = -3, 1.5
    args = TAILS[53].kernel_args(model, y, out, require_cuda=False)
    assert args[3:] == (np.float32(0.1), np.float32(-3.0), np.float32(1.5))
    assert args[3].tobytes() == np.array(0.1, dtype=np.float32).tobytes()


def test_kernel_args_53_missing_parameter_is_named(specs):
    model = build_model(specs[53], seed=0, device="cpu")
    del model.scaling_factor
    y = torch.zeros(2, 64)
    with pytest.raises(KbfuseError, match="task 53: the model has no attribute 'scaling_factor'"):
        TAILS[53].kernel_args(model, y, torch.empty_like(y), require_cuda=False)


def test_kernel_args_81_and_95(specs):
    y = torch.zeros(3, 64)
    out = torch.empty_like(y)
    m81 = build_model(specs[81], seed=0, device="cpu")
    args = TAILS[81].kernel_args(m81, y, out, require_cuda=False)
    assert [type(a) for a in args] == [np.uint64, np.uint64, np.int64]
    assert args == (y.data_ptr(), out.data_ptr(), 192)
    m95 = build_model(specs[95], seed=0, device="cpu")
    args = TAILS[95].kernel_args(m95, y, out, require_cuda=False)
    assert [type(a) for a in args] == [np.uint64] * 3 + [np.int64] * 2
    assert args == (y.data_ptr(), m95.add_value.data_ptr(), out.data_ptr(), 192, 64)


@pytest.mark.parametrize(
    ("y", "message"),
    [
        (torch.zeros(64), r"y \(linear output\) must be 2-D, got shape \(64,\)"),
        (torch.zeros(2, 4, 64), r"must be 2-D, got shape \(2, 4, 64\)"),
        (torch.zeros(64, 4).t(), r"must be contiguous, got strides \(1, 4\)"),
        (torch.zeros(4, 64, dtype=torch.float64), "must be float32, got torch.float64"),
        (torch.zeros(4, 64, dtype=torch.float16), "must be float32, got torch.float16"),
        (torch.zeros(0, 64), r"is empty \(shape \(0, 64\)\)"),
        ([[0.0]], "must be a torch.Tensor, got list"),
    ],
)
def test_bad_y_is_rejected_on_cpu(specs, y, message):
    model = build_model(specs[81], seed=0, device="cpu")
    with pytest.raises(ValueError, match=message):
        TAILS[81].kernel_args(model, y, torch.zeros(4, 64), require_cuda=False)


def test_cpu_tensors_are_rejected_when_cuda_is_required(specs):
    model = build_model(specs[81], seed=0, device="cpu")
    y = torch.zeros(4, 64)
    with pytest.raises(
        KbfuseError, match="y \\(linear output\\) must be on a CUDA device, got cpu"
    ):
        TAILS[81].kernel_args(model, y, torch.empty_like(y))
    with pytest.raises(KbfuseError, match="x must be on a CUDA device"):
        check_tail_input(y, "x")
    check_tail_input(y, "x", require_cuda=False)  # passes


def test_out_must_match_y(specs):
    model = build_model(specs[53], seed=0, device="cpu")
    y = torch.zeros(4, 64)
    with pytest.raises(KbfuseError, match=r"out has shape \(4, 32\), expected .* \(4, 64\)"):
        TAILS[53].kernel_args(model, y, torch.zeros(4, 32), require_cuda=False)
    with pytest.raises(KbfuseError, match="out must be float32"):
        TAILS[53].kernel_args(model, y, torch.zeros(4, 64, dtype=torch.float64), require_cuda=False)
    with pytest.raises(KbfuseError, match="out must be contiguous"):
        TAILS[53].kernel_args(model, y, torch.zeros(64, 4).t(), require_cuda=False)
    with pytest.raises(KbfuseError, match="share one device: y on cpu, out on meta"):
        TAILS[53].kernel_args(model, y, torch.empty(4, 64, device="meta"), require_cuda=False)


def test_add_value_of_95_is_checked(specs):
    model = build_model(specs[95], seed=0, device="cpu")
    y = torch.zeros(4, 64)
    out = torch.empty_like(y)
    with pytest.raises(KbfuseError, match=r"one value per column of y \(48\), got shape \(64,\)"):
        TAILS[95].kernel_args(model, torch.zeros(4, 48), torch.zeros(4, 48), require_cuda=False)
    with torch.no_grad():
        model.add_value = nn.Parameter(torch.zeros(1, 64))
        with pytest.raises(KbfuseError, match=r"must be 1-D .* got shape \(1, 64\)"):
            TAILS[95].kernel_args(model, y, out, require_cuda=False)
        model.add_value = nn.Parameter(torch.zeros(64, dtype=torch.float64))
        with pytest.raises(KbfuseError, match="model.add_value must be float32, got torch.float64"):
            TAILS[95].kernel_args(model, y, out, require_cuda=False)
        model.add_value = nn.Parameter(torch.zeros(64))
        TAILS[95].kernel_args(model, y, out, require_cuda=False)  # passes
    meta_y = torch.empty(4, 64, device="meta")
    with pytest.raises(KbfuseError, match="y on meta, model.add_value on cpu"):
        TAILS[95].kernel_args(model, meta_y, torch.empty_like(meta_y), require_cuda=False)
    model.add_value = None
    with pytest.raises(KbfuseError, match="'add_value' is NoneType, expected a tensor"):
        TAILS[95].kernel_args(model, y, out, require_cuda=False)


def test_bytes_moved():
    y = torch.empty(16, 64, device="meta")
    assert TAILS[53].bytes_moved(y) == 2 * 4 * 16 * 64
    assert TAILS[81].bytes_moved(y) == 2 * 4 * 16 * 64
    assert TAILS[95].bytes_moved(y) == 2 * 4 * 16 * 64 + 4 * 64
    # the largest pinned task: 2048 x 8192 float32 read once and written once
    assert TAILS[53].bytes_moved(torch.empty(2048, 8192, device="meta")) == 134_217_728
