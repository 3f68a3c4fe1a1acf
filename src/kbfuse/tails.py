"""The per-task registry of fused tails: kernel name, reference tail, kernel arguments.

A task's *tail* is everything its KernelBench model does after the linear layer. The
reference tail is the pinned model's own forward with the linear layer swapped for
`nn.Identity`, so it runs exactly the pinned source's ops. Kernel parameters (task 53's
scaling factor and hardtanh bounds, task 95's add vector) are read from the model
instance, never restated here; constants that live only in a forward body (task 81's
`/ 2.0` and clamp bounds, task 95's hardtanh bounds) are in kernels/*.cu beside the ops.

Validation is plain tensor metadata and runs on CPU tensors too (`require_cuda=False`), so
it is unit-tested without a GPU. Argument tuples carry explicit numpy types (np.uint64
pointers, np.int64 counts, np.float32 scalars) matching the kernel signatures in
docs/contracts.md.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from kbfuse.errors import KbfuseError

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

    def linear(self, model) -> nn.Module:
        layer = getattr(model, self.linear_attr, None)
        if not isinstance(layer, nn.Linear):
            raise KbfuseError(
                f"task {self.task}: model attribute {self.linear_attr!r} is "
                f"{type(layer).__name__}, expected nn.Linear"
            )
        return layer

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


@dataclass(frozen=True)
class ScaleHardtanhGeluTail(Tail):
    """Task 53: x * scaling_factor -> hardtanh(min_val, max_val) -> GELU (erf)."""

    def extra_args(self, model, y) -> tuple:
        scale = model_float(model, "scaling_factor", self.task)
        lo = model_float(model, "hardtanh.min_val", self.task)
        hi = model_float(model, "hardtanh.max_val", self.task)
        return (scale, lo, hi)


@dataclass(frozen=True)
class AddSwishTanhGeluHardtanhTail(Tail):
    """Task 95: x + add_value (one value per column) -> swish -> tanh -> GELU -> hardtanh.

    The kernel signature puts `add` second: (x, add, out, n, cols).
    """

    add_attr: str = "add_value"

    def add_value(self, model) -> torch.Tensor:
        add = getattr(model, self.add_attr, None)
        if not isinstance(add, torch.Tensor):
            raise KbfuseError(
                f"task {self.task}: model attribute {self.add_attr!r} is "
                f"{type(add).__name__}, expected a tensor parameter"
            )
        return add

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


TAILS: dict[int, Tail] = {
    53: ScaleHardtanhGeluTail(task=53, kernel="tail53", linear_attr="gemm"),
    81: Tail(task=81, kernel="tail81", linear_attr="gemm"),
    95: AddSwishTanhGeluHardtanhTail(task=95, kernel="tail95", linear_attr="matmul"),
}


def tail_for(task: int) -> Tail:
    try:
        return TAILS[int(task)]
    except (KeyError, TypeError, ValueError):
        raise KbfuseError(
            f"task {task!r} has no fused tail; tasks with tails: {sorted(TAILS)}"
        ) from None
