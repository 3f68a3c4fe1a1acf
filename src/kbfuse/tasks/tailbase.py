"""What every fused tail is: a task's forward split into a library op and the tail after it.

A KernelBench task's `Model.forward` starts with one library op (a linear layer, a
convolution, a transposed convolution) that stays as PyTorch runs it, and continues with ops
that one hand-written kernel replaces: the *tail*. A `Tail` says where the split is and what
the kernel needs:

- `library_attr` names the model's submodule of that op. `library_output(model, x)` is what
  the fused program computes with the library (the module itself, or, for a convolution whose
  bias the tail adds, the same convolution without its bias);
- `tail_module(model)` is the pinned model itself with that submodule swapped for its
  stand-in (`nn.Identity`, or a module adding the bias): its forward is the eager reference of
  the tail, op for op as the pinned source writes it (`reference`), and what the compiled
  baselines compile for the tail alone;
- the kernel's argument tuple (`kernel_args`, signatures in docs/contracts.md), its output's
  shape, the buffers it needs besides its output (`workspace`), how many work items its
  launch covers (`launch_items`, read with the source's kbfuse-launch line), the bytes it
  must move (`bytes_moved`, the copy floor's numerator);
- where its bits are decided (`bound_values`, `column_offset`, `tail_parameters`) and how a
  (rows, columns) block of control values becomes a valid tail input (`control_input`);
- its numerical `contract` (kbfuse.checks.contract): None for the first study's tails, whose
  bit identity the records show as counts, "bit-identical" for a pointwise tail of the second
  study, "reduction-float64" for a tail that reduces.

Validation is plain tensor metadata and runs on CPU tensors too (`require_cuda=False`), so it
is unit-tested without a GPU. Argument tuples carry explicit numpy types (np.uint64 pointers,
np.int64 counts, np.float32 scalars) matching the kernel signatures.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch
from torch import nn

from kbfuse.errors import KbfuseError

FLOAT32_BYTES = 4
CONTRACTS = ("bit-identical", "reduction-float64")


def check_tail_input(t, name: str, *, require_cuda: bool = True, dims: int = 2) -> None:
    """KbfuseError (a ValueError) unless `t` is a `dims`-D, contiguous, float32 (CUDA) tensor."""
    if not isinstance(t, torch.Tensor):
        raise KbfuseError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != dims:
        raise KbfuseError(f"{name} must be {dims}-D, got shape {tuple(t.shape)}")
    check_dense_float32(t, name, require_cuda=require_cuda)


def check_dense_float32(t: torch.Tensor, name: str, *, require_cuda: bool) -> None:
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


def check_per_channel(
    t: torch.Tensor, name: str, y: torch.Tensor, what: str, *, require_cuda: bool
) -> None:
    """`t` is a parameter with one value per `what` of y (y's dimension 1): 1-D of that
    length, dense float32, on y's device."""
    if t.dim() != 1 or t.shape[0] != y.shape[1]:
        raise KbfuseError(
            f"{name} must be 1-D with one value per {what} of y ({y.shape[1]}), "
            f"got shape {tuple(t.shape)}"
        )
    check_dense_float32(t, name, require_cuda=require_cuda)
    check_same_device({"y": y, name: t})


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


def model_value(model, attr_path: str, task: int) -> Any:
    """The model's attribute at a dotted path; KbfuseError naming the task when absent."""
    value = model
    for part in attr_path.split("."):
        if not hasattr(value, part):
            raise KbfuseError(
                f"task {task}: the model has no attribute {attr_path!r} "
                f"({type(model).__name__} is not the expected KernelBench module)"
            )
        value = getattr(value, part)
    return value


def model_float(model, attr_path: str, task: int) -> np.float32:
    """A scalar attribute of the model (dotted path), converted to float32 as ATen does.

    ATen converts a Python-scalar operand to the op's float math type with a C cast
    (`Scalar::to<float>`), which is numpy's round-to-nearest float64 -> float32.
    """
    value = model_value(model, attr_path, task)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise KbfuseError(
            f"task {task}: model attribute {attr_path!r} is {value!r}, expected a number"
        )
    return np.float32(float(value))


def with_submodule(model: nn.Module, attr: str, replacement: nn.Module) -> nn.Module:
    """A shallow copy of `model` whose submodule `attr` is `replacement`: parameters, buffers
    and attributes are shared with `model`, which is left untouched."""
    copied = copy.copy(model)
    copied._modules = type(model._modules)(model._modules)
    copied._modules[attr] = replacement
    return copied


@dataclass(frozen=True)
class Tail:
    """One task's fused tail. Subclasses say what the library op is and what the kernel needs;
    the defaults are those of a pointwise tail after an `nn.Linear` (output shaped like its
    input, one work item per element, no workspace)."""

    task: int
    kernel: str
    library_attr: str
    # Clamp bounds written as literals in the pinned forward body (None: read from the model).
    literal_bounds: tuple[float, float] | None = None
    # The kernel that writes the tail's element-wise stage (the input of its reduction), for
    # tails that reduce; None for pointwise tails.
    stage_kernel: str | None = None

    library_types: ClassVar[tuple[type, ...]] = (nn.Linear,)
    library_kind: ClassVar[str] = "nn.Linear"
    input_dims: ClassVar[int] = 2
    contract: ClassVar[str | None] = None
    pointwise: ClassVar[bool] = True
    # The name of the tail control that runs the tail on the library op's real output.
    library_case: ClassVar[str] = "tail/linear_output"
    # The sizes of the small-shape control (config controls.small_shape, besides its seed).
    small_shape_keys: ClassVar[tuple[str, ...]] = ("batch", "in_features", "out_features")

    # -- the split ------------------------------------------------------------------------

    def attribute(self, model, name: str, kind: type | tuple[type, ...], expected: str):
        """`model.<name>`, a KbfuseError naming the task unless it is a `kind`."""
        value = getattr(model, name, None)
        if not isinstance(value, kind):
            raise KbfuseError(
                f"task {self.task}: model attribute {name!r} is "
                f"{type(value).__name__}, expected {expected}"
            )
        return value

    def library(self, model) -> nn.Module:
        """The model's library op (the submodule that stays)."""
        return self.attribute(model, self.library_attr, self.library_types, self.library_kind)

    def library_output(self, model, x: torch.Tensor) -> torch.Tensor:
        """What the fused program computes with the library before the kernel, contiguous."""
        with torch.no_grad():
            return self.library(model)(x).contiguous()

    def stand_in(self, model) -> nn.Module:
        """What replaces the library op in the tail module."""
        return nn.Identity()

    def tail_module(self, model) -> nn.Module:
        """The pinned model with its library op swapped for `stand_in`, in eval mode."""
        self.library(model)  # the attribute must be the library op the split replaces
        stand_in = self.stand_in(model)
        return with_submodule(model, self.library_attr, stand_in).eval()

    def reference(self, model, y: torch.Tensor) -> torch.Tensor:
        """The model's own tail on library output `y` (its forward after the library op)."""
        with torch.no_grad():
            return self.tail_module(model)(y)

    # -- the kernel -----------------------------------------------------------------------

    def kernels(self) -> tuple[str, ...]:
        """Every kernel of this tail that a compiled source must define."""
        return (self.kernel,) if self.stage_kernel is None else (self.kernel, self.stage_kernel)

    def output_shape(self, model, y: torch.Tensor) -> tuple[int, ...]:
        """The shape of the tail's output for library output `y`."""
        return tuple(y.shape)

    def validate(self, model, y, out, *, require_cuda: bool = True) -> None:
        """Check y, out and the model's tensor parameters; KbfuseError naming the problem."""
        check_tail_input(y, self.y_name, require_cuda=require_cuda, dims=self.input_dims)
        check_dense_float32_tensor(out, "out", require_cuda=require_cuda)
        expected = self.output_shape(model, y)
        if tuple(out.shape) != expected:
            raise KbfuseError(
                f"out has shape {tuple(out.shape)}, expected the shape of y {expected}"
                if expected == tuple(y.shape)
                else f"out has shape {tuple(out.shape)}, expected {expected}"
            )
        check_same_device({"y": y, "out": out})

    @property
    def y_name(self) -> str:
        return "y (linear output)" if self.library_kind == "nn.Linear" else "y (library output)"

    def kernel_args(self, model, y, out, *, require_cuda: bool = True, workspace=None) -> tuple:
        """Validate, then return the kernel's argument tuple (contracts.md signatures)."""
        self.validate(model, y, out, require_cuda=require_cuda)
        return (pointer(y), pointer(out), np.int64(y.numel()), *self.extra_args(model, y))

    def extra_args(self, model, y) -> tuple:
        """Kernel arguments after (x, out, n); none by default."""
        return ()

    def workspace(self, y: torch.Tensor) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        """Buffers the kernel needs besides its output, by name: (shape, dtype), zeroed
        before each launch by `kbfuse.compilation.launch.run_tail`; none by default."""
        return {}

    def launch_items(self, y: torch.Tensor) -> int:
        """The work items the kernel's launch covers (elements for a pointwise tail)."""
        return int(y.numel())

    def bytes_moved(self, y) -> int:
        """Bytes the fused tail reads and writes: y once, out once."""
        return 2 * FLOAT32_BYTES * int(y.numel())

    # -- where the bits are decided -------------------------------------------------------

    def bound_values(self, model) -> list[float]:
        """Tail inputs at and next to the clamp bounds (and neighbours), sorted."""
        if self.literal_bounds is None:
            raise KbfuseError(f"task {self.task} has no boundary controls")
        return sorted({v for b in self.literal_bounds for v in ulp_window(b, 1)})

    def column_offset(self, model) -> torch.Tensor | None:
        """The per-column value the tail adds first, shaped to broadcast against a tail input;
        None when it adds none."""
        return None

    def tail_parameters(self, model) -> dict[str, torch.Tensor]:
        """The model tensors the kernel reads besides y, by attribute name; none by default."""
        return {}

    def control_columns(self, model) -> int:
        """Columns of a block of control values (kbfuse.checks.tail_controls)."""
        return int(self.library(model).out_features)

    def control_input(self, model, block: torch.Tensor) -> torch.Tensor:
        """A (rows, control_columns) block of values as a valid tail input."""
        return block

    # -- shapes of a task -----------------------------------------------------------------

    def input_shape(self, spec) -> tuple[int, ...]:
        """The task's input shape (the pinned file's own constants)."""
        return tuple(spec.input_shape())

    def small_input_shape(self, model, shape) -> tuple[int, ...]:
        """The input shape of the small-shape control (`small_shape_keys` of `shape`)."""
        return (int(shape["batch"]), int(shape["in_features"]))

    def shape_record(self, model, x: torch.Tensor, y: torch.Tensor) -> dict:
        """The `shape` block of the task's records."""
        batch, in_features = x.shape
        return {
            "batch": int(batch),
            "in_features": int(in_features),
            "out_features": int(self.library(model).out_features),
        }


class _FirstCallCapture(torch.overrides.TorchFunctionMode):
    """Records the first call to one of `functions` with a tensor first argument."""

    def __init__(self, functions: tuple):
        super().__init__()
        self.functions = functions
        self.call: tuple | None = None

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.call is None and func in self.functions and args:
            self.call = (func, args, kwargs)
        return func(*args, **kwargs)


@dataclass(frozen=True)
class ReductionCall:
    """The reduction a forward starts (e.g. `torch.sum(x, dim=[1, 2, 3])`): its function, the
    tensor it was handed (the element-wise stage, as eager computed it) and its other
    arguments, so that the same reduction can run again on another tensor."""

    function: Any
    stage: torch.Tensor
    args: tuple
    kwargs: dict

    def again(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return self.function(x, *self.args, **self.kwargs)


def reduction_call(module: nn.Module, y: torch.Tensor, functions: tuple) -> ReductionCall:
    """The first call to one of `functions` (e.g. torch.sum) that `module`'s forward makes on
    `y`: a reducing tail's element-wise stage and its reduction exactly as the pinned forward
    writes them, read off the forward itself rather than restated."""
    capture = _FirstCallCapture(functions)
    with torch.no_grad(), capture:
        module(y)
    if capture.call is None or not isinstance(capture.call[1][0], torch.Tensor):
        names = ", ".join(getattr(f, "__name__", str(f)) for f in functions)
        raise KbfuseError(f"the tail's forward called none of {names} on a tensor")
    function, args, kwargs = capture.call
    return ReductionCall(function, args[0], tuple(args[1:]), dict(kwargs))


def check_dense_float32_tensor(t, name: str, *, require_cuda: bool) -> None:
    """`check_dense_float32` after checking `t` is a tensor at all."""
    if not isinstance(t, torch.Tensor):
        raise KbfuseError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    check_dense_float32(t, name, require_cuda=require_cuda)


def shape_list(shape: Sequence[int]) -> list[int]:
    return [int(d) for d in shape]


def fan_in_bound(weight: torch.Tensor) -> float:
    """1/sqrt(fan_in) of a library weight: nn.Linear's and nn.Conv*'s initialisation range
    (for nn.Linear, 1/sqrt(in_features))."""
    fan_in, _ = nn.init._calculate_fan_in_and_fan_out(weight)
    return 1.0 / math.sqrt(fan_in)
