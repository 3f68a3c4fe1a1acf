"""The PyTorch implementations every fused kernel is checked and timed against.

Each builder returns a callable `x -> output` that runs under `torch.no_grad()`:

- `eager(model)`: the KernelBench module as written.
- `torchscript(model, example)`: a frozen trace, `torch.jit.freeze(torch.jit.trace(...))`.
  Freezing turns parameters into graph constants, so whether in-place parameter updates
  reach it depends on the optimisations freezing applied; correctness measures that.
- `inductor(model)`: `torch.compile(model, dynamic=False)` in the default mode; it compiles
  on the first call, so call it once before timing or CUDA-graph capture.
- `inductor(model, MAX_AUTOTUNE)`, the baseline `inductor-max-autotune-no-cudagraphs`: the
  same in mode `max-autotune-no-cudagraphs` (plain `max-autotune` would bring CUDA graphs of
  its own; the study captures its own). Its first call also benchmarks candidate kernels on
  the GPU (`AUTOTUNED`): the jobs that build it hold the GPU alone.

`tail_module(model, tail)` is the model with its library op replaced by the tail's stand-in
(`nn.Identity`, or the convolution's bias add: kbfuse.tasks.tailbase.Tail.tail_module),
sharing every other parameter, so the same builders give the tail alone.
`set_numerics()` fixes the float32 contract (no TF32) for every GPU stage of the first study;
`set_numerics(mode)` puts a named numerics mode in force (the survey's modes,
kbfuse.survey.settings.NUMERICS: `strict`, or `kernelbench-defaults` with cuDNN's TF32 on),
for a study that names one (the second fused study: config `fused2.numerics`).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from kbfuse.errors import KbfuseError
from kbfuse.tasks import registry

MAX_AUTOTUNE = "max-autotune-no-cudagraphs"
IMPLEMENTATIONS = registry.BASELINES
# Baselines whose build times kernels on the GPU: never beside another job's timing.
AUTOTUNED = registry.AUTOTUNED_BASELINES
# Dynamo compiles Model.forward again for each model (a seed's, the tail's) and each compiled
# baseline: two Inductor modes over the correctness stage's models pass its default limit (8).
RECOMPILE_LIMIT = 64

Program = Callable[[torch.Tensor], torch.Tensor]


def set_numerics(mode: str | None = None) -> dict:
    """Put a numerics mode in force and return the settings now in force (for result files).

    None (the first study): TF32 off everywhere, recorded as the three switches. A named mode
    (kbfuse.survey.settings.NUMERICS) sets matmul's and cuDNN's TF32 as the survey does and
    is recorded with its name. Only the legacy switches are used: PyTorch >= 2.9 raises when
    the legacy and the new `fp32_precision` APIs are mixed, and Inductor still reads the
    legacy ones.
    """
    if mode is None:
        matmul = cudnn = False
    else:
        from kbfuse.survey.settings import tf32_flags

        matmul, cudnn = tf32_flags(mode)
    torch.backends.cuda.matmul.allow_tf32 = matmul
    torch.backends.cudnn.allow_tf32 = cudnn
    torch.set_float32_matmul_precision("high" if matmul else "highest")
    settings = numerics_in_force()
    return settings if mode is None else {"mode": mode, **settings}


def numerics_in_force() -> dict:
    return {
        "cuda_matmul_allow_tf32": bool(torch.backends.cuda.matmul.allow_tf32),
        "cudnn_allow_tf32": bool(torch.backends.cudnn.allow_tf32),
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
    }


def _without_grad(fn: Callable, name: str) -> Program:
    def program(x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return fn(x)

    program.__name__ = program.__qualname__ = name
    return program


def eager(model: nn.Module) -> Program:
    return _without_grad(model.eval(), "eager")


def torchscript(model: nn.Module, example: torch.Tensor) -> Program:
    with torch.no_grad():
        frozen = torch.jit.freeze(torch.jit.trace(model.eval(), example))
    return _without_grad(frozen, "torchscript")


def inductor(model: nn.Module, mode: str | None = None) -> Program:
    # Past its recompile limit Dynamo would quietly run the eager code under this baseline's
    # name (the correctness stage compiles one model per seed): make that an error instead.
    torch._dynamo.config.fail_on_recompile_limit_hit = True
    limit = getattr(torch._dynamo.config, "recompile_limit", None)
    if limit is not None and limit < RECOMPILE_LIMIT:
        torch._dynamo.config.recompile_limit = RECOMPILE_LIMIT
    compiled = torch.compile(model.eval(), dynamic=False, mode=mode)
    return _without_grad(compiled, "inductor" if mode is None else f"inductor-{mode}")


def build(name: str, module: nn.Module, example: torch.Tensor) -> Program:
    """Implementation `name` (one of IMPLEMENTATIONS) of `module`; `example`: a valid input."""
    if name == "eager":
        return eager(module)
    if name == "torchscript":
        return torchscript(module, example)
    if name == "inductor":
        return inductor(module)
    if name == f"inductor-{MAX_AUTOTUNE}":
        return inductor(module, MAX_AUTOTUNE)
    raise KbfuseError(f"unknown baseline {name!r}; known: {', '.join(IMPLEMENTATIONS)}")


def tail_module(model: nn.Module, tail) -> nn.Module:
    """A shallow copy of `model` whose library op (`tail.library_attr`) is the tail's stand-in
    (kbfuse.tasks.tailbase.Tail.tail_module), in eval mode.

    Parameters and buffers are shared with `model` (task 95's add parameter, a convolution's
    bias included), so in-place updates reach both; `model` itself is left unchanged.
    """
    attr = tail.library_attr
    if attr not in model._modules:
        raise KbfuseError(
            f"task {tail.task}: model {type(model).__name__} has no submodule {attr!r}"
        )
    return tail.tail_module(model)
