"""The survey's baselines of one task: how each is built, and its failure recorded.

- `eager`: the task's module as written.
- `torchscript`: `torch.jit.trace` on the timing inputs; frozen (`torch.jit.freeze`) only
  in eval semantics, since freezing needs a module in eval mode. A trace records the cuDNN
  switches in force as constants of each convolution (`aten::_convolution(..., benchmark,
  deterministic, cudnn_enabled, allow_tf32)`), so it must be traced in the numerics mode it
  runs in (`MODE_BOUND`): traced once under strict FP32 it ran at strict speed in TF32 mode.
- `inductor`: `torch.compile(model, dynamic=False)`, default mode.
- `inductor-max-autotune-no-cudagraphs`: the same with that mode (plain `max-autotune` would
  bring CUDA graphs of its own, and the survey times graphs itself).

Each is a forward taking the task's inputs, under `torch.no_grad()` (the official trials
call it on their own inputs; `bind` gives the zero-argument run the timing calls). `build`
also makes the first call, on the timing inputs (where Inductor compiles), so `build_s` is the
time to a first output. Past its recompile limit Dynamo would quietly run eager code
under Inductor's name: that is made an error. `failure(stage, exc)` is the record's failure
block: the stage, the exception's type and the first line of its message.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from kbfuse.errors import KbfuseError
from kbfuse.survey.settings import BASELINES

Run = Callable[[], object]
Forward = Callable[..., object]
# Baselines whose build captures the numerics mode in force: built again in each mode.
MODE_BOUND = ("torchscript",)


def _no_grad(fn: Callable) -> Forward:
    import torch

    def forward(*inputs):
        with torch.no_grad():
            return fn(*inputs)

    return forward


def bind(forward: Forward, inputs: list) -> Run:
    """The zero-argument run of `forward` on `inputs` (what the timing and profile call)."""

    def run():
        return forward(*inputs)

    return run


def _torchscript(model, inputs: list, semantics: str) -> Callable:
    import torch

    with torch.no_grad():
        traced = torch.jit.trace(model, tuple(inputs))
        return torch.jit.freeze(traced) if semantics == "eval" else traced


def _inductor(model, mode: str | None) -> Callable:
    import torch

    torch._dynamo.config.fail_on_recompile_limit_hit = True
    return torch.compile(model, dynamic=False, mode=mode)


def make(name: str, model, inputs: list, semantics: str) -> Forward:
    """The forward of baseline `name` (not yet called; `inputs`: the example a trace needs)."""
    if name == "eager":
        return _no_grad(model)
    if name == "torchscript":
        return _no_grad(_torchscript(model, inputs, semantics))
    if name == "inductor":
        return _no_grad(_inductor(model, None))
    if name == "inductor-max-autotune-no-cudagraphs":
        return _no_grad(_inductor(model, "max-autotune-no-cudagraphs"))
    raise KbfuseError(f"unknown survey baseline {name!r}; known: {list(BASELINES)}")


def build(name: str, model, inputs: list, semantics: str, sync: Callable[[], None]) -> tuple:
    """(forward, build_s): the baseline built and called once on `inputs`; `sync` waits for
    the device."""
    start = time.perf_counter()
    forward = make(name, model, inputs, semantics)
    forward(*inputs)
    sync()
    return forward, time.perf_counter() - start


CACHE_COUNTERS = (
    ("inductor", "fxgraph_cache_hit"),
    ("inductor", "fxgraph_cache_miss"),
    ("aot_autograd", "autograd_cache_hit"),
    ("aot_autograd", "autograd_cache_miss"),
)


def compile_cache_counts() -> dict[str, int]:
    """Inductor's FX-graph and AOTAutograd cache hits and misses so far in this process: did
    the shared cache (an earlier job's compile of the same graph) spare this job a compile?"""
    from torch._dynamo.utils import counters

    return {key: int(counters[group][key]) for group, key in CACHE_COUNTERS}


def first_line(text: str) -> str:
    lines = [line.strip() for line in str(text).splitlines() if line.strip()]
    return lines[0][:500] if lines else ""


def failure(stage: str, exc: BaseException) -> dict:
    return {"stage": stage, "error": type(exc).__name__, "message": first_line(exc)}
