"""The per-task registry of fused tails: which `Tail` implements each task of
kbfuse.tasks.registry.TAIL_TASKS, and the helpers every stage uses with them.

A task's *tail* is everything its KernelBench model does after its library op (a linear
layer or a convolution); what a tail is and says (the split, the kernel's arguments, its
output and launch, where its bits are decided, its numerical contract) is in
kbfuse.tasks.tailbase. The first study's tails (a pointwise tail after an `nn.Linear`) are in
kbfuse.tasks.lineartails, the second study's (after an `nn.Conv2d`, the bias included) in
kbfuse.tasks.convtails. Which tasks have a tail, and the kernel names, are in
kbfuse.tasks.registry; per-task facts live in this registry and in the kernel sources only.
"""

from __future__ import annotations

from kbfuse.errors import KbfuseError
from kbfuse.tasks.convtails import ConvBiasAvgPoolSigmoidSumTail, ConvBiasMishMishTail
from kbfuse.tasks.lineartails import (
    AddSwishTanhGeluHardtanhTail,
    ScaleHardtanhGeluTail,
    SwishClampTail,
)
from kbfuse.tasks.registry import STAGED_TASKS, TAIL_TASKS, kernel_name, stage_kernel_name
from kbfuse.tasks.tailbase import (  # noqa: F401 (the helpers stages import from here)
    FLOAT32_BYTES,
    Tail,
    check_tail_input,
    model_float,
    pointer,
    ulp_window,
)

# The implementation of each task of kbfuse.tasks.registry.TAIL_TASKS, with its library
# submodule. Clamp bounds written as literals in the pinned forward bodies (task 53's come
# from the model's nn.Hardtanh): task 81 clamps swish(x)/2 to [-1, 1] and then tanh of that
# again; task 95 applies hardtanh(-1, 1) after GELU(tanh(.)).
_IMPLEMENTATIONS: dict[int, tuple[type[Tail], dict]] = {
    53: (ScaleHardtanhGeluTail, {"library_attr": "gemm"}),
    81: (SwishClampTail, {"library_attr": "gemm", "literal_bounds": (-1.0, 1.0)}),
    95: (AddSwishTanhGeluHardtanhTail, {"library_attr": "matmul", "literal_bounds": (-1.0, 1.0)}),
    4: (ConvBiasMishMishTail, {"library_attr": "conv"}),
    65: (ConvBiasAvgPoolSigmoidSumTail, {"library_attr": "conv"}),
}


def _implementation(task: int) -> Tail:
    cls, fields = _IMPLEMENTATIONS[task]
    stage = stage_kernel_name(task) if task in STAGED_TASKS else None
    return cls(task=task, kernel=kernel_name(task), stage_kernel=stage, **fields)


TAILS: dict[int, Tail] = {task: _implementation(task) for task in TAIL_TASKS}


def tail_for(task: int) -> Tail:
    try:
        return TAILS[int(task)]
    except (KeyError, TypeError, ValueError):
        raise KbfuseError(
            f"task {task!r} has no fused tail; tasks with tails: {sorted(TAILS)}"
        ) from None
