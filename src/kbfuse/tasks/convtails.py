"""The second study's tails: what follows a convolution (tasks 4 and 65).

The split. ATen runs an `nn.Conv2d` with a bias on CUDA as cuDNN's convolution *without*
the bias, then one elementwise add (aten/src/ATen/native/Convolution.cpp, `_convolution`,
ConvBackend::Cudnn: `at::cudnn_convolution(...)` then `output.add_(reshape_bias(input.dim(),
bias))`). So the library op that stays is that bias-free convolution (`library_output`: the
module's own `_conv_forward` with `bias=None`, the same cuDNN call), and the tail starts with
the bias add, one IEEE addition per element as in ATen's add kernel (`a + alpha * b`,
alpha = 1). The fused kernel reads the convolution's output once and adds the bias itself; a
split that kept the module whole would leave that add as a kernel of its own, a full read and
write of the output the fused tail exists to avoid.

The reference tail is the pinned model's own forward with the convolution swapped for
`BiasAdd` (the same bias parameter, added as ATen adds it), so it runs the pinned source's ops
after the convolution, in order. Kernel parameters (the bias, the pool's window) are read from
the model; what only the forward body says (mish twice, sigmoid, the sum over dims 1-3) is in
the kernels (kernels/fused2_*.cu) beside the ops.

- Task 4, `Conv2d_Mish_Mish`: pointwise (bias, mish, mish), held to bit identity with eager
  (contract "bit-identical"), all 2^32 float32 inputs included.
- Task 65, `Conv2d_AvgPool_Sigmoid_Sum`: bias, average pool, sigmoid (the element-wise stage,
  bit-identical, written by the stage kernel `stage65`), then a sum over channels and the
  pooled plane (contract "reduction-float64": kbfuse.checks.contract). The fast kernel sums in
  float64, one partial per (sample, channel) plane, and the last block to finish adds each
  sample's partials in a fixed order, so the result does not depend on block scheduling.

Control layout: a block of (rows, channels * h * w) control values becomes a tail input of
shape (rows, channels, h, w): every channel (and so every bias value) sees every value.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import torch
from torch import nn

from kbfuse.errors import KbfuseError
from kbfuse.tasks.tailbase import (
    FLOAT32_BYTES,
    ReductionCall,
    Tail,
    check_dense_float32,
    check_per_channel,
    check_same_device,
    pointer,
    reduction_call,
    shape_list,
    ulp_window,
)

FLOAT64_BYTES = 8
# The calls that start task 65's reduction (the pinned forward writes torch.sum(x, dim=...)).
REDUCTIONS = (torch.sum, torch.Tensor.sum)
# float32 thresholds of expf, where mish's bits change branch (softplus of a huge x is x, of
# a very negative x a subnormal, then zero): ln(FLT_MAX), ln(2^-126), ln(2^-149), ln(2^-150).
EXP_THRESHOLDS = (88.72283905206835, -87.33654475055310, -103.27892990343184, -103.97207708399179)


class BiasAdd(nn.Module):
    """What ATen adds after cuDNN's convolution: y + bias, the bias broadcast over the
    channel dimension. It holds the model's own bias parameter (shared, so changing it in
    place reaches the model and this module alike)."""

    def __init__(self, bias: nn.Parameter):
        super().__init__()
        self.bias = bias

    def forward(self, y: torch.Tensor) -> torch.Tensor:
        return y + self.bias.view(1, -1, *([1] * (y.dim() - 2)))


def meta_input_shape(spec) -> tuple[int, ...]:
    """The shape of the one tensor a task's `get_inputs()` returns, drawn on torch's meta
    device: nothing is allocated and no random number is drawn."""
    with torch.device("meta"):
        inputs = spec.module.get_inputs()
    if len(inputs) != 1 or not isinstance(inputs[0], torch.Tensor):
        raise KbfuseError(f"task {spec.task}: get_inputs() must return one tensor, got {inputs!r}")
    return tuple(int(d) for d in inputs[0].shape)


@dataclass(frozen=True)
class ConvBiasTail(Tail):
    """A tail after an `nn.Conv2d` whose bias the tail adds (see the module docstring)."""

    library_types: ClassVar[tuple[type, ...]] = (nn.Conv2d,)
    library_kind: ClassVar[str] = "nn.Conv2d"
    input_dims: ClassVar[int] = 4
    contract: ClassVar[str | None] = "bit-identical"
    library_case: ClassVar[str] = "tail/library_output"
    small_shape_keys: ClassVar[tuple[str, ...]] = ("batch", "height", "width")
    # The spatial size (h, w) of a control block's tail input.
    control_hw: ClassVar[tuple[int, int]] = (1, 4)

    def library_output(self, model, x: torch.Tensor) -> torch.Tensor:
        conv = self.library(model)
        with torch.no_grad():
            return conv._conv_forward(x, conv.weight, None).contiguous()

    def conv_bias(self, model) -> nn.Parameter:
        conv = self.library(model)
        if not isinstance(conv.bias, torch.Tensor):
            raise KbfuseError(
                f"task {self.task}: {self.library_attr}.bias is {conv.bias!r}; this tail adds "
                "the convolution's bias, so the convolution must have one"
            )
        return conv.bias

    def stand_in(self, model) -> nn.Module:
        return BiasAdd(self.conv_bias(model))

    def tail_parameters(self, model) -> dict[str, torch.Tensor]:
        return {f"{self.library_attr}.bias": self.conv_bias(model)}

    def column_offset(self, model) -> torch.Tensor:
        return self.conv_bias(model).view(1, -1, 1, 1)

    def channels(self, model) -> int:
        return int(self.library(model).out_channels)

    def check_bias(self, model, y, *, require_cuda: bool) -> torch.Tensor:
        bias = self.conv_bias(model)
        name = f"model.{self.library_attr}.bias"
        check_per_channel(bias, name, y, "channel", require_cuda=require_cuda)
        return bias

    def validate(self, model, y, out, *, require_cuda: bool = True) -> None:
        super().validate(model, y, out, require_cuda=require_cuda)
        self.check_bias(model, y, require_cuda=require_cuda)

    def control_columns(self, model) -> int:
        h, w = self.control_hw
        return self.channels(model) * h * w

    def control_input(self, model, block: torch.Tensor) -> torch.Tensor:
        h, w = self.control_hw
        return block.reshape(block.shape[0], self.channels(model), h, w)

    def input_shape(self, spec) -> tuple[int, ...]:
        return meta_input_shape(spec)

    def small_input_shape(self, model, shape) -> tuple[int, ...]:
        """The convolution's own input channels at the small batch and spatial size."""
        channels = int(self.library(model).in_channels)
        return (int(shape["batch"]), channels, int(shape["height"]), int(shape["width"]))

    def shape_record(self, model, x: torch.Tensor, y: torch.Tensor) -> dict:
        return {
            "input": shape_list(x.shape),
            "library_output": shape_list(y.shape),
            "output": shape_list(self.output_shape(model, y)),
        }

    def bound_values(self, model) -> list[float]:
        """The float32 thresholds of expf (overflow, subnormal results, zero) and neighbours:
        where the exp inside mish, softplus and sigmoid changes what it returns."""
        return sorted({v for t in EXP_THRESHOLDS for v in ulp_window(t, 2)})


@dataclass(frozen=True)
class ConvBiasMishMishTail(ConvBiasTail):
    """Task 4: conv -> + bias -> mish -> mish. Kernel (y, bias, out, n, hw, channels)."""

    def kernel_args(self, model, y, out, *, require_cuda: bool = True, workspace=None) -> tuple:
        self.validate(model, y, out, require_cuda=require_cuda)
        bias = self.conv_bias(model)
        _, channels, height, width = y.shape
        return (
            pointer(y),
            pointer(bias),
            pointer(out),
            np.int64(y.numel()),
            np.int64(height * width),
            np.int64(channels),
        )

    def bytes_moved(self, y) -> int:
        return super().bytes_moved(y) + FLOAT32_BYTES * int(y.shape[1])


@dataclass(frozen=True)
class ConvBiasAvgPoolSigmoidSumTail(ConvBiasTail):
    """Task 65: conv -> + bias -> avg_pool2d(k) -> sigmoid -> sum over dims 1, 2, 3.

    Kernel (y, bias, out, partials, counter, batch, channels, height, width, pooled_h,
    pooled_w, k, stride); one work item per (sample, channel) plane. Stage kernel (y, bias,
    stage, batch, channels, height, width, pooled_h, pooled_w, k, stride): the sigmoid of the
    pooled values, one work item per pooled value.
    """

    pool_attr: str = "avg_pool"
    contract: ClassVar[str | None] = "reduction-float64"
    pointwise: ClassVar[bool] = False
    control_hw: ClassVar[tuple[int, int]] = (4, 4)

    def pool(self, model) -> tuple[int, int]:
        """(kernel, stride) of the model's nn.AvgPool2d; KbfuseError for what the kernel does
        not implement (padding, ceil mode, a divisor override, unequal sides)."""
        pool = self.attribute(model, self.pool_attr, nn.AvgPool2d, "nn.AvgPool2d")
        kernel, stride = _square(pool.kernel_size), _square(pool.stride or pool.kernel_size)
        problems = []
        if kernel is None or stride is None:
            problems.append(f"kernel_size {pool.kernel_size!r} and stride {pool.stride!r}")
        if _square(pool.padding) != 0:
            problems.append(f"padding {pool.padding!r}")
        if pool.ceil_mode:
            problems.append("ceil_mode=True")
        if pool.divisor_override is not None:
            problems.append(f"divisor_override={pool.divisor_override!r}")
        if problems:
            raise KbfuseError(
                f"task {self.task}: {self.pool_attr} has {', '.join(problems)}; the kernel "
                "pools square windows with equal strides, no padding, floor mode, divisor k*k"
            )
        return kernel, stride

    def pooled_shape(self, model, y) -> tuple[int, int, int, int]:
        kernel, stride = self.pool(model)
        batch, channels, height, width = y.shape
        pooled = ((height - kernel) // stride + 1, (width - kernel) // stride + 1)
        if min(pooled) < 1:
            raise KbfuseError(
                f"y {tuple(y.shape)} is smaller than the {kernel}x{kernel} pooling window"
            )
        return (int(batch), int(channels), *pooled)

    def output_shape(self, model, y) -> tuple[int, ...]:
        return (int(y.shape[0]),)

    def stage_shape(self, model, y) -> tuple[int, ...]:
        return self.pooled_shape(model, y)

    def _dims(self, model, y) -> tuple:
        kernel, stride = self.pool(model)
        batch, channels, height, width = y.shape
        _, _, pooled_h, pooled_w = self.pooled_shape(model, y)
        values = (batch, channels, height, width, pooled_h, pooled_w, kernel, stride)
        return tuple(np.int64(v) for v in values)

    def kernel_args(self, model, y, out, *, require_cuda: bool = True, workspace=None) -> tuple:
        self.validate(model, y, out, require_cuda=require_cuda)
        buffers = self.check_workspace(y, workspace)
        bias = self.conv_bias(model)
        return (
            pointer(y),
            pointer(bias),
            pointer(out),
            pointer(buffers["partials"]),
            pointer(buffers["counter"]),
            *self._dims(model, y),
        )

    def stage_args(self, model, y, stage, *, require_cuda: bool = True) -> tuple:
        check_dense_float32(y, self.y_name, require_cuda=require_cuda)
        expected = self.stage_shape(model, y)
        if tuple(stage.shape) != expected:
            raise KbfuseError(f"stage has shape {tuple(stage.shape)}, expected {expected}")
        check_dense_float32(stage, "stage", require_cuda=require_cuda)
        bias = self.check_bias(model, y, require_cuda=require_cuda)
        check_same_device({"y": y, "stage": stage})
        return (pointer(y), pointer(bias), pointer(stage), *self._dims(model, y))

    def workspace(self, y) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        """One float64 partial sum per (sample, channel) plane, and the count of planes done
        (the last block to finish adds each sample's partials; it resets the count)."""
        return {
            "partials": ((int(y.shape[0]) * int(y.shape[1]),), torch.float64),
            "counter": ((1,), torch.int32),
        }

    def check_workspace(self, y, workspace) -> dict[str, torch.Tensor]:
        if not isinstance(workspace, dict):
            raise KbfuseError(
                f"task {self.task}: the kernel needs its workspace {self.workspace(y)}"
            )
        for name, (shape, dtype) in self.workspace(y).items():
            buffer = workspace.get(name)
            if (
                not isinstance(buffer, torch.Tensor)
                or tuple(buffer.shape) != shape
                or buffer.dtype != dtype
                or not buffer.is_contiguous()
                or buffer.device != y.device
            ):
                raise KbfuseError(
                    f"task {self.task}: workspace {name!r} must be a contiguous {dtype} tensor "
                    f"of shape {shape} on {y.device}"
                )
        return workspace

    def launch_items(self, y) -> int:
        return int(y.shape[0]) * int(y.shape[1])

    def reduction(self, model, y: torch.Tensor) -> ReductionCall:
        """The pinned forward's sum on `y`, as it calls it (its stage and its dims)."""
        return reduction_call(self.tail_module(model), y, REDUCTIONS)

    def stage_reference(self, model, y: torch.Tensor) -> torch.Tensor:
        """Eager's element-wise stage on `y`: the tensor the pinned forward hands its sum."""
        return self.reduction(model, y).stage

    def stage_items(self, model, y) -> int:
        return int(np.prod(self.stage_shape(model, y)))

    def bytes_moved(self, y) -> int:
        """y read once; the bias, the partial sums and the output are a rounding error."""
        batch, channels = int(y.shape[0]), int(y.shape[1])
        return (
            FLOAT32_BYTES * int(y.numel())
            + FLOAT32_BYTES * channels
            + FLOAT64_BYTES * batch * channels
            + FLOAT32_BYTES * batch
        )

    def bound_values(self, model) -> list[float]:
        """Sigmoid's expf thresholds (-x, so they are met after negation) and neighbours."""
        return sorted({v for t in EXP_THRESHOLDS for v in ulp_window(-t, 2)})


def _square(value) -> int | None:
    """An int, or a pair of equal ints, as one int; None otherwise."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, tuple | list) and len(value) == 2 and value[0] == value[1]:
        return _square(value[0])
    return None
