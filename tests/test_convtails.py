"""The second study's tails on the CPU: the split after a convolution, reference tails, argument
tuples, shapes, workspaces, control layouts and what is refused (kbfuse.tasks.convtails).

The small fixture tasks 4 and 65 (tests/kbrepo.py) have the pinned forward ops at 2 x 3 x 18 x 18
and 2 x 3 x 22 x 22. Bit identity of the split on the GPU (cuDNN's convolution without its bias,
then ATen's add) is a GPU claim: tests/test_gpu_fused2.py checks it.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from kbrepo import CONV_BATCH, CONV_IN, CONV_OUT, FUSED2_TASKS, make_kernelbench_repo
from torch import nn

from kbfuse.errors import KbfuseError
from kbfuse.tasks import baselines
from kbfuse.tasks.convtails import EXP_THRESHOLDS, BiasAdd, meta_input_shape
from kbfuse.tasks.kernelbench import build_model, load_task, pin_kernelbench
from kbfuse.tasks.tailbase import ulp_window
from kbfuse.tasks.tails import TAILS, tail_for


@pytest.fixture(scope="module")
def specs(tmp_path_factory):
    root = tmp_path_factory.mktemp("fused2-pin")
    url, commit = make_kernelbench_repo(root / "kb", tasks=FUSED2_TASKS)
    pin = pin_kernelbench(url, commit, 2, list(FUSED2_TASKS), root / "checkout", root / "pin.json")
    return {task: load_task(root / "checkout", pin, task) for task in FUSED2_TASKS}


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int32)


def model_and_input(specs, task, seed=3, scale=1.0):
    spec = specs[task]
    model = build_model(spec, seed=seed, device="cpu")
    torch.manual_seed(7)
    (x,) = spec.module.get_inputs()
    return model, x * scale


def workspace(tail, y):
    return {
        name: torch.zeros(shape, dtype=dtype) for name, (shape, dtype) in tail.workspace(y).items()
    }


def test_the_registry_splits_tasks_4_and_65_after_their_convolution():
    assert {
        t: (TAILS[t].kernel, TAILS[t].library_attr, TAILS[t].library_kind) for t in (4, 65)
    } == {
        4: ("tail4", "conv", "nn.Conv2d"),
        65: ("tail65", "conv", "nn.Conv2d"),
    }
    assert (TAILS[4].contract, TAILS[4].pointwise, TAILS[4].stage_kernel) == (
        "bit-identical",
        True,
        None,
    )
    assert (TAILS[65].contract, TAILS[65].pointwise, TAILS[65].stage_kernel) == (
        "reduction-float64",
        False,
        "stage65",
    )
    assert TAILS[65].kernels() == ("tail65", "stage65")
    assert (TAILS[4].library_case, TAILS[53].library_case) == (
        "tail/library_output",
        "tail/linear_output",
    )


def test_the_input_shape_comes_from_get_inputs_on_the_meta_device(specs):
    assert meta_input_shape(specs[4]) == (CONV_BATCH, CONV_IN, 18, 18)
    assert tail_for(65).input_shape(specs[65]) == (CONV_BATCH, CONV_IN, 22, 22)
    state = torch.random.get_rng_state()
    meta_input_shape(specs[4])
    assert torch.equal(state, torch.random.get_rng_state())  # no random number drawn


@pytest.mark.parametrize("task", FUSED2_TASKS)
def test_the_library_output_is_the_convolution_without_its_bias(specs, task):
    model, x = model_and_input(specs, task)
    tail = tail_for(task)
    y = tail.library_output(model, x)
    with torch.no_grad():
        expected = nn.functional.conv2d(x, model.conv.weight, None)
        with_bias = model.conv(x)
    assert y.is_contiguous() and torch.equal(bits(y), bits(expected))
    assert y.shape == (CONV_BATCH, CONV_OUT, *with_bias.shape[2:])
    # the bias add is one addition per element: y + bias is the module's own output up to how
    # the CPU's convolution folds its bias in (on CUDA ATen adds it after cuDNN, bit for bit)
    torch.testing.assert_close(y + model.conv.bias.view(1, -1, 1, 1), with_bias)


@pytest.mark.parametrize("scale", [1.0, 100.0, -100.0])
def test_task_4_reference_is_bias_then_mish_twice(specs, scale):
    model, x = model_and_input(specs, 4, scale=scale)
    tail = tail_for(4)
    y = tail.library_output(model, x)
    ref = tail.reference(model, y)
    with torch.no_grad():
        expected = nn.functional.mish(nn.functional.mish(y + model.conv.bias.view(1, -1, 1, 1)))
    assert torch.equal(bits(ref), bits(expected))
    assert tail.output_shape(model, y) == tuple(y.shape) == tuple(ref.shape)
    assert isinstance(model.conv, nn.Conv2d)  # the shallow copy never touches the model


def test_task_65_reference_and_its_element_wise_stage(specs):
    model, x = model_and_input(specs, 65)
    tail = tail_for(65)
    y = tail.library_output(model, x)
    ref = tail.reference(model, y)
    stage = tail.stage_reference(model, y)
    with torch.no_grad():
        expected_stage = torch.sigmoid(model.avg_pool(y + model.conv.bias.view(1, -1, 1, 1)))
    assert torch.equal(bits(stage), bits(expected_stage))
    assert torch.equal(bits(ref), bits(torch.sum(expected_stage, dim=[1, 2, 3])))
    assert tail.stage_shape(model, y) == tuple(stage.shape) == (CONV_BATCH, CONV_OUT, 5, 5)
    assert tail.output_shape(model, y) == (CONV_BATCH,) == tuple(ref.shape)
    assert tail.pool(model) == (4, 4)


def test_the_stage_is_read_off_the_pinned_forward_not_restated():
    class OtherOrder(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(1, 2, 1)
            self.avg_pool = nn.AvgPool2d(2)

        def forward(self, x):
            x = self.avg_pool(self.conv(x))
            return torch.tanh(x).sum(dim=[1, 2, 3])  # a method call, another element-wise op

    model = OtherOrder()
    y = torch.randn(1, 2, 4, 4)
    stage = tail_for(65).stage_reference(model, y)
    assert torch.equal(stage, torch.tanh(model.avg_pool(y + model.conv.bias.view(1, -1, 1, 1))))


def test_bias_add_shares_the_models_bias():
    conv = nn.Conv2d(2, 3, 1)
    add = BiasAdd(conv.bias)
    assert add.bias is conv.bias
    with torch.no_grad():
        conv.bias.add_(1.0)
    y = torch.zeros(1, 3, 2, 2)
    assert torch.equal(add(y), conv.bias.view(1, 3, 1, 1).expand(1, 3, 2, 2))


@pytest.mark.parametrize("task", FUSED2_TASKS)
def test_the_tail_module_is_the_reference_and_shares_the_bias(specs, task):
    model, x = model_and_input(specs, task)
    tail = tail_for(task)
    module = baselines.tail_module(model, tail)
    assert isinstance(module.conv, BiasAdd) and module.conv.bias is model.conv.bias
    assert tail.tail_parameters(model) == {"conv.bias": model.conv.bias}
    assert tail.column_offset(model).shape == (1, CONV_OUT, 1, 1)
    y = tail.library_output(model, x)
    with torch.no_grad():
        assert torch.equal(bits(module(y)), bits(tail.reference(model, y)))
    assert dict(module.named_parameters())["conv.bias"] is model.conv.bias


def test_kernel_args_of_task_4(specs):
    model, x = model_and_input(specs, 4)
    tail = tail_for(4)
    y = tail.library_output(model, x)
    out = torch.empty_like(y)
    args = tail.kernel_args(model, y, out, require_cuda=False)
    assert [type(a) for a in args] == [np.uint64] * 3 + [np.int64] * 3
    assert args == (
        y.data_ptr(),
        model.conv.bias.data_ptr(),
        out.data_ptr(),
        CONV_BATCH * CONV_OUT * 16 * 16,
        16 * 16,
        CONV_OUT,
    )
    assert tail.launch_items(y) == y.numel() and tail.workspace(y) == {}
    assert tail.bytes_moved(y) == 2 * 4 * y.numel() + 4 * CONV_OUT


def test_kernel_args_workspace_and_stage_args_of_task_65(specs):
    model, x = model_and_input(specs, 65)
    tail = tail_for(65)
    y = tail.library_output(model, x)  # 2 x 8 x 20 x 20
    out = torch.empty(CONV_BATCH)
    buffers = workspace(tail, y)
    assert {k: (tuple(v.shape), v.dtype) for k, v in buffers.items()} == {
        "partials": ((CONV_BATCH * CONV_OUT,), torch.float64),
        "counter": ((1,), torch.int32),
    }
    args = tail.kernel_args(model, y, out, require_cuda=False, workspace=buffers)
    assert [type(a) for a in args] == [np.uint64] * 5 + [np.int64] * 8
    assert args[:5] == (
        y.data_ptr(),
        model.conv.bias.data_ptr(),
        out.data_ptr(),
        buffers["partials"].data_ptr(),
        buffers["counter"].data_ptr(),
    )
    assert args[5:] == (CONV_BATCH, CONV_OUT, 20, 20, 5, 5, 4, 4)
    stage = torch.empty(tail.stage_shape(model, y))
    stage_args = tail.stage_args(model, y, stage, require_cuda=False)
    assert stage_args[:3] == (y.data_ptr(), model.conv.bias.data_ptr(), stage.data_ptr())
    assert stage_args[3:] == args[5:]
    assert tail.launch_items(y) == CONV_BATCH * CONV_OUT  # one block per plane
    assert tail.stage_items(model, y) == CONV_BATCH * CONV_OUT * 25
    # the convolution's output read once; bias, partial sums and output besides
    assert tail.bytes_moved(y) == 4 * y.numel() + 4 * CONV_OUT + 8 * 16 + 4 * CONV_BATCH


def test_task_65_refuses_a_missing_or_wrong_workspace(specs):
    model, x = model_and_input(specs, 65)
    tail = tail_for(65)
    y = tail.library_output(model, x)
    out = torch.empty(CONV_BATCH)
    with pytest.raises(KbfuseError, match="task 65: the kernel needs its workspace"):
        tail.kernel_args(model, y, out, require_cuda=False)
    buffers = workspace(tail, y)
    buffers["partials"] = torch.zeros(3, dtype=torch.float64)
    with pytest.raises(KbfuseError, match=r"workspace 'partials' must be a contiguous .* \(16,\)"):
        tail.kernel_args(model, y, out, require_cuda=False, workspace=buffers)


def test_task_65_refuses_a_pool_the_kernel_does_not_implement(specs):
    model, _ = model_and_input(specs, 65)
    tail = tail_for(65)
    for pool, what in (
        (nn.AvgPool2d(4, padding=1), "padding 1"),
        (nn.AvgPool2d(4, ceil_mode=True), "ceil_mode=True"),
        (nn.AvgPool2d(4, divisor_override=3), "divisor_override=3"),
        (nn.AvgPool2d((4, 2)), r"kernel_size \(4, 2\)"),
    ):
        model.avg_pool = pool
        with pytest.raises(KbfuseError, match=f"task 65: avg_pool has {what}"):
            tail.pool(model)
    model.avg_pool = nn.MaxPool2d(4)
    with pytest.raises(KbfuseError, match="'avg_pool' is MaxPool2d, expected nn.AvgPool2d"):
        tail.pool(model)


def test_out_and_y_are_checked(specs):
    model, x = model_and_input(specs, 4)
    tail = tail_for(4)
    y = tail.library_output(model, x)
    with pytest.raises(KbfuseError, match=r"y \(library output\) must be 4-D, got shape"):
        tail.kernel_args(model, y[0], torch.empty_like(y[0]), require_cuda=False)
    with pytest.raises(KbfuseError, match=r"out has shape \(2, 8, 16\), expected the shape of y"):
        tail.kernel_args(model, y, torch.empty(2, 8, 16), require_cuda=False)
    with pytest.raises(KbfuseError, match="must be on a CUDA device"):
        tail.kernel_args(model, y, torch.empty_like(y))
    m65, x65 = model_and_input(specs, 65)
    y65 = tail_for(65).library_output(m65, x65)
    with pytest.raises(KbfuseError, match=r"out has shape \(2, 8\), expected \(2,\)"):
        tail_for(65).kernel_args(m65, y65, torch.empty(2, 8), require_cuda=False)


def test_the_bias_is_checked(specs):
    model, x = model_and_input(specs, 4)
    tail = tail_for(4)
    y = tail.library_output(model, x)
    out = torch.empty_like(y)
    model.conv.bias = nn.Parameter(torch.zeros(CONV_OUT, dtype=torch.float64))
    with pytest.raises(KbfuseError, match="model.conv.bias must be float32, got torch.float64"):
        tail.kernel_args(model, y, out, require_cuda=False)
    model.conv.bias = None
    with pytest.raises(KbfuseError, match="task 4: conv.bias is None; this tail adds"):
        tail.kernel_args(model, y, out, require_cuda=False)
    model.conv = nn.Linear(3, 8)
    with pytest.raises(KbfuseError, match="'conv' is Linear, expected nn.Conv2d"):
        tail.library(model)


def test_control_blocks_become_tail_inputs_every_channel_seeing_every_value(specs):
    model, _ = model_and_input(specs, 4)
    block = torch.arange(2 * CONV_OUT * 4, dtype=torch.float32).reshape(2, -1)
    assert tail_for(4).control_columns(model) == CONV_OUT * 4
    shaped = tail_for(4).control_input(model, block)
    assert shaped.shape == (2, CONV_OUT, 1, 4) and torch.equal(shaped.reshape(2, -1), block)
    m65, _ = model_and_input(specs, 65)
    assert tail_for(65).control_columns(m65) == CONV_OUT * 16
    assert tail_for(65).control_input(m65, torch.zeros(3, CONV_OUT * 16)).shape == (3, 8, 4, 4)


def test_bound_values_are_the_thresholds_of_expf():
    values = tail_for(4).bound_values(None)
    assert values == sorted({v for t in EXP_THRESHOLDS for v in ulp_window(t, 2)})
    assert len(values) == 5 * len(EXP_THRESHOLDS)
    assert float(np.exp(np.float32(88.72283))) < np.inf  # just under ln(FLT_MAX)
    assert tail_for(65).bound_values(None) == sorted(-v for v in values)


def test_small_shape_of_a_convolution_keeps_its_channels(specs):
    model, _ = model_and_input(specs, 65)
    tail = tail_for(65)
    assert tail.small_shape_keys == ("batch", "height", "width")
    shape = {"batch": 3, "height": 12, "width": 14, "seed": 371}
    assert tail.small_input_shape(model, shape) == (3, CONV_IN, 12, 14)
    x = torch.rand(3, CONV_IN, 12, 14)
    y = tail.library_output(model, x)
    assert tail.shape_record(model, x, y) == {
        "input": [3, CONV_IN, 12, 14],
        "library_output": [3, CONV_OUT, 10, 12],
        "output": [3],
    }
