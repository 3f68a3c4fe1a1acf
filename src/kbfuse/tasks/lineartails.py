"""The first study's tails: a pointwise tail after an `nn.Linear` (tasks 53, 81, 95).

The reference tail is the pinned model's own forward with the linear layer swapped for
`nn.Identity`, so it runs exactly the pinned source's ops. Kernel parameters (task 53's
scaling factor and hardtanh bounds, task 95's add vector) are read from the model instance,
never restated here; constants that live only in a forward body (task 81's `/ 2.0` and clamp
bounds, task 95's hardtanh bounds) are in kernels/naive.cu and kernels/fast.cu beside the ops.
Their records keep the shape they had before kbfuse knew other library ops (no `contract`
field: their bit identity is in the records' bit-equal counts).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from kbfuse.tasks.tailbase import (
    FLOAT32_BYTES,
    Tail,
    check_per_channel,
    model_float,
    pointer,
    ulp_window,
)


def _swish_half_crossing(level: float) -> float:
    """x > 0 with x * sigmoid(x) / 2 == level, in float64 (bisection; monotonic for x > 0)."""
    lo, hi = 0.0, 64.0
    for _ in range(200):
        mid = (lo + hi) / 2
        if mid / (1 + math.exp(-mid)) / 2 < level:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


@dataclass(frozen=True)
class ScaleHardtanhGeluTail(Tail):
    """Task 53: x * scaling_factor -> hardtanh(min_val, max_val) -> GELU (erf)."""

    def extra_args(self, model, y) -> tuple:
        scale = model_float(model, "scaling_factor", self.task)
        lo = model_float(model, "hardtanh.min_val", self.task)
        hi = model_float(model, "hardtanh.max_val", self.task)
        return (scale, lo, hi)

    def bound_values(self, model) -> list[float]:
        """The hardtanh bounds from the model, their neighbours, and the pre-scale values
        bound / scaling_factor (+- 2 ulps) that the scale maps onto them."""
        scale = model_float(model, "scaling_factor", self.task)
        bounds = [
            model_float(model, "hardtanh.min_val", self.task),
            model_float(model, "hardtanh.max_val", self.task),
        ]
        values = [v for b in bounds for v in ulp_window(float(b), 1)]
        for b in bounds:
            values += ulp_window(float(np.float32(b) / scale), 2)
        return sorted(set(values))


@dataclass(frozen=True)
class SwishClampTail(Tail):
    """Task 81: swish -> / 2 -> clamp(-1, 1) -> tanh -> clamp(-1, 1)."""

    def bound_values(self, model) -> list[float]:
        """The clamp bounds +-1 and neighbours, and +-4 ulps around the input whose
        swish(x)/2 reaches the upper clamp (the lower one, -1, is below swish's minimum)."""
        values = [v for b in self.literal_bounds for v in ulp_window(b, 1)]
        values += ulp_window(_swish_half_crossing(self.literal_bounds[1]), 4)
        return sorted(set(values))


@dataclass(frozen=True)
class AddSwishTanhGeluHardtanhTail(Tail):
    """Task 95: x + add_value (one value per column) -> swish -> tanh -> GELU -> hardtanh.

    The kernel signature puts `add` second: (x, add, out, n, cols).
    """

    add_attr: str = "add_value"

    def add_value(self, model) -> torch.Tensor:
        return self.attribute(model, self.add_attr, torch.Tensor, "a tensor parameter")

    def validate(self, model, y, out, *, require_cuda: bool = True) -> None:
        super().validate(model, y, out, require_cuda=require_cuda)
        add = self.add_value(model)
        check_per_channel(add, f"model.{self.add_attr}", y, "column", require_cuda=require_cuda)

    def kernel_args(self, model, y, out, *, require_cuda: bool = True, workspace=None) -> tuple:
        self.validate(model, y, out, require_cuda=require_cuda)
        add = self.add_value(model)
        return (pointer(y), pointer(add), pointer(out), np.int64(y.numel()), np.int64(y.shape[1]))

    def bytes_moved(self, y) -> int:
        return super().bytes_moved(y) + FLOAT32_BYTES * int(y.shape[1])

    def column_offset(self, model) -> torch.Tensor:
        return self.add_value(model)

    def tail_parameters(self, model) -> dict[str, torch.Tensor]:
        return {self.add_attr: self.add_value(model)}
