"""The per-task registry of fused tails: kernel name, reference tail, kernel arguments.

A task's *tail* is everything its KernelBench model does after the linear layer. The
reference tail is the pinned model's own forward with the linear layer swapped for
`nn.Identity`, so it runs exactly the pinned source's ops. Kernel parameters (task 53's
scaling factor and hardtanh bounds, task 95's add vector) are read from the model
instance, never restated here; constants that live only in a forward body (task 81's
`/ 2.0` and clamp bounds, task 95's hardtanh bounds) are in kernels/*.cu beside the ops.

The registry also says where each tail's bits are decided: `bound_values` (the inputs at and
next to its clamp bounds, for the correctness stage's boundary controls), `column_offset`
(a per-column value added before the bounds: task 95's add vector) and `tail_parameters`
(the model parameters the kernel reads besides the linear output, which the CUDA-graph checks
change between replays). Which tasks have a tail, and the kernel names, are in
kbfuse.tasks.registry.

Validation is plain tensor metadata and runs on CPU tensors too (`require_cuda=False`), so
it is unit-tested without a GPU. Argument tuples carry explicit numpy types (np.uint64
pointers, np.int64 counts, np.float32 scalars) matching the kernel signatures in
docs/contracts.md.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from kbfuse.errors import KbfuseError
from kbfuse.tasks.registry import TAIL_TASKS, kernel_name

FLOAT32_BYTES = 4


def check_tail_input(t, name: str, *, require_cuda: bool = True) -> None:
    """KbfuseError (a ValueError) unless `t` is a 2-D, contiguous, float32 (CUDA) tensor."""
    if not isinstance(t, torch.Tensor):
        raise KbfuseError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != 2:
        raise KbfuseError(f"{name} must be 2-D, got shape {tuple(t.shape)}")
    _check_dense_float32(t, name, require_cuda=require_cuda)


def _check_dense_float32(t: torch.Tensor, name: str, *, require_cuda: bool) -> None:
    if t.dtype != torch.float32:
        raise KbfuseError(f"{name} must be float32, got {t.dtype}")
    if not t.is_contiguous():
        raise KbfuseError(f"{name} must be contiguous, got strides {tuple(t.stride())}")
    if require_cuda and not t.is_cuda:
        raise KbfuseError(f"{name} must be on a CUDA device, got {t.device}")
    if t.numel() == 0:
        raise KbfuseError(f"{name} is empty (shape {tuple(t.shape)}): nothing to launch")


def check_same_device(tensors: dict[str, torch.Tensor]) -> None:
    devices = {name: t.device for name, t in tensors.items()}
    if len(set(devices.values())) > 1:
        listed = ", ".join(f"{name} on {device}" for name, device in devices.items())
        raise KbfuseError(f"tensors must share one device: {listed}")


def pointer(t: torch.Tensor) -> np.uint64:
    return np.uint64(t.data_ptr())


def ulp_window(x: float, steps: int) -> list[float]:
    """float32(x) and its `steps` float32 neighbours on each side, ascending."""
    centre = np.float32(x)
    below, above = [], []
    lo = hi = centre
    for _ in range(steps):
        lo = np.nextafter(lo, np.float32(-np.inf))
        hi = np.nextafter(hi, np.float32(np.inf))
        below.append(float(lo))
        above.append(float(hi))
    return below[::-1] + [float(centre)] + above


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


def model_float(model, attr_path: str, task: int) -> np.float32:
    """A scalar attribute of the model (dotted path), converted to float32 as ATen does.

    ATen converts a Python-scalar operand to the op's float math type with a C cast
    (`Scalar::to<float>`), which is numpy's round-to-nearest float64 -> float32.
    """
    value = model
    for part in attr_path.split("."):
        if not hasattr(value, part):
            raise KbfuseError(
                f"task {task}: the model has no attribute {attr_path!r} "
                f"({type(model).__name__} is not the expected KernelBench module)"
            )
        value = getattr(value, part)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise KbfuseError(
            f"task {task}: model attribute {attr_path!r} is {value!r}, expected a number"
        )
    return np.float32(float(value))


@dataclass(frozen=True)
class Tail:
    """One task's fused tail. Subclasses supply the parameters the kernel needs."""

    task: int
    kernel: str
    linear_attr: str
    # Clamp bounds written as literals in the pinned forward body (None: read from the model).
    literal_bounds: tuple[float, float] | None = None

    def attribute(self, model, name: str, kind: type, expected: str):
        """`model.<name>`, a KbfuseError naming the task unless it is a `kind`."""
        value = getattr(model, name, None)
        if not isinstance(value, kind):
            raise KbfuseError(
                f"task {self.task}: model attribute {name!r} is "
                f"{type(value).__name__}, expected {expected}"
            )
        return value

    def linear(self, model) -> nn.Module:
        return self.attribute(model, self.linear_attr, nn.Linear, "nn.Linear")

    def reference(self, model, y: torch.Tensor) -> torch.Tensor:
        """The model's own tail on linear output `y`: its forward with the linear -> Identity.

        A shallow copy with its own submodule table: the original model is left untouched
        and shares every parameter and attribute with the copy.
        """
        self.linear(model)  # the attribute must be the linear layer we replace
        tail_model = copy.copy(model)
        tail_model._modules = dict(model._modules)
        tail_model._modules[self.linear_attr] = nn.Identity()
        with torch.no_grad():
            return tail_model(y)

    def validate(self, model, y, out, *, require_cuda: bool = True) -> None:
        """Check y, out and the model's tensor parameters; KbfuseError naming the problem."""
        check_tail_input(y, "y (linear output)", require_cuda=require_cuda)
        check_tail_input(out, "out", require_cuda=require_cuda)
        if out.shape != y.shape:
            raise KbfuseError(
                f"out has shape {tuple(out.shape)}, expected the shape of y {tuple(y.shape)}"
            )
        check_same_device({"y": y, "out": out})

    def kernel_args(self, model, y, out, *, require_cuda: bool = True) -> tuple:
        """Validate, then return the kernel's argument tuple (contracts.md signatures)."""
        self.validate(model, y, out, require_cuda=require_cuda)
        return (pointer(y), pointer(out), np.int64(y.numel()), *self.extra_args(model, y))

    def extra_args(self, model, y) -> tuple:
        """Kernel arguments after (x, out, n); none by default."""
        return ()

    def bytes_moved(self, y) -> int:
        """Bytes the fused tail reads and writes: y once, out once."""
        return 2 * FLOAT32_BYTES * int(y.numel())

    def bound_values(self, model) -> list[float]:
        """Tail inputs at and next to the clamp bounds (and neighbours), sorted."""
        if self.literal_bounds is None:
            raise KbfuseError(f"task {self.task} has no boundary controls")
        return sorted({v for b in self.literal_bounds for v in ulp_window(b, 1)})

    def column_offset(self, model) -> torch.Tensor | None:
        """The per-column value the tail adds before its bounds; None when it adds none."""
        return None

    def tail_parameters(self, model) -> dict[str, torch.Tensor]:
        """The model tensors the kernel reads besides y, by attribute name; none by default."""
        return {}


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
        name = f"model.{self.add_attr}"
        if add.dim() != 1 or add.shape[0] != y.shape[1]:
            raise KbfuseError(
                f"{name} must be 1-D with one value per column of y ({y.shape[1]}), "
                f"got shape {tuple(add.shape)}"
            )
        _check_dense_float32(add, name, require_cuda=require_cuda)
        check_same_device({"y": y, name: add})

    def kernel_args(self, model, y, out, *, require_cuda: bool = True) -> tuple:
        self.validate(model, y, out, require_cuda=require_cuda)
        add = self.add_value(model)
        return (pointer(y), pointer(add), pointer(out), np.int64(y.numel()), np.int64(y.shape[1]))

    def bytes_moved(self, y) -> int:
        return super().bytes_moved(y) + FLOAT32_BYTES * int(y.shape[1])

    def column_offset(self, model) -> torch.Tensor:
        return self.add_value(model)

    def tail_parameters(self, model) -> dict[str, torch.Tensor]:
        return {self.add_attr: self.add_value(model)}


# The implementation of each task of kbfuse.tasks.registry.TAIL_TASKS. Clamp bounds written as
# literals
# in the pinned forward bodies (task 53's come from the model's nn.Hardtanh): task 81 clamps
# swish(x)/2 to [-1, 1] and then tanh of that again; task 95 applies hardtanh(-1, 1) after
# GELU(tanh(.)).
_IMPLEMENTATIONS: dict[int, tuple[type[Tail], dict]] = {
    53: (ScaleHardtanhGeluTail, {"linear_attr": "gemm"}),
    81: (SwishClampTail, {"linear_attr": "gemm", "literal_bounds": (-1.0, 1.0)}),
    95: (AddSwishTanhGeluHardtanhTail, {"linear_attr": "matmul", "literal_bounds": (-1.0, 1.0)}),
}


def _implementation(task: int) -> Tail:
    cls, fields = _IMPLEMENTATIONS[task]
    return cls(task=task, kernel=kernel_name(task), **fields)


TAILS: dict[int, Tail] = {task: _implementation(task) for task in TAIL_TASKS}


def tail_for(task: int) -> Tail:
    try:
        return TAILS[int(task)]
    except (KeyError, TypeError, ValueError):
        raise KbfuseError(
            f"task {task!r} has no fused tail; tasks with tails: {sorted(TAILS)}"
        ) from None
