"""The survey's baselines of one task: how each is built, and its failure recorded.

- `eager`: the task's module as written.
- `torchscript`: `torch.jit.trace` on the timing inputs; frozen (`torch.jit.freeze`) only
  in eval semantics, since freezing needs a module in eval mode. A trace records the cuDNN
  switches in force as constants of each convolution (`aten::_convolution(..., benchmark,
  deterministic, cudnn_enabled, allow_tf32)`), so it must be traced in the numerics mode it
  runs in (`MODE_BOUND`): traced once under strict FP32 it ran at strict speed in TF32 mode.
- `inductor`: `torch.compile(model, dynamic=False)`, default mode.
- `inductor-max-autotune-no-cudagraphs`: the same with that mode (plain `max-autotune` would
  bring CUDA graphs of its own, and the survey times graphs itself). Its compile benchmarks
  candidate kernels (Triton templates against cuBLAS/cuDNN, tile configurations) on the GPU,
  so the job builds it while it holds the GPU alone (`AUTOTUNED`). It is built in each
  numerics mode (`MODE_BOUND`): its choices are timed under the mode's TF32 switches, and its
  convolution templates bake cuDNN's switch in as a constant. Inductor's FX-graph cache key
  leaves that switch out (it holds the matmul precision, the same in both modes), so the build
  tags the cache key with it (`torch.compiler.config.cache_key_tag`) and keeps Inductor's
  local autotune cache off, whose timings are keyed by the matmul precision alone: the second
  mode's build neither reuses the first mode's graph nor its benchmark results. The tagged
  FX-graph cache still serves a rerun of the same mode. Before that build, while the job
  still shares the GPU, `warm` compiles the same baseline once and throws it away: the kernels
  autotuning compiles (Triton templates, tile configurations) land in Triton's on-disk cache,
  so the build alone on the GPU mostly loads them and spends its hold on the benchmarks. The
  warm-up's own choices, timed beside other jobs, are never used: its cache entries carry a
  tag of their own (`WARM_TAG`) that the real build's key never has. Alone, the build
  precompiles on every core (`precompile_threads`): the other jobs wait meanwhile.
  `survey.max_autotune_conv_backends` (Inductor's `max_autotune_conv_backends`, "ATEN,TRITON"
  by default) narrows the convolution choices: "ATEN" leaves cuDNN alone, without Inductor's
  Triton convolution templates. On a level-3 depthwise convolution those templates ran
  2,800-4,000 times slower than cuDNN, and benchmarking them took 337 s of one warm-up
  (docs/survey.md, "Convolution backends"). The record says which backends a build had
  (`conv_backends`).

Each is a forward taking the task's inputs, under `torch.no_grad()` (the official trials
call it on their own inputs; `bind` gives the zero-argument run the timing calls). `build`
also makes the first call, on the timing inputs (where Inductor compiles), so `build_s` is the
time to a first output. Past its recompile limit Dynamo would quietly run eager code
under Inductor's name: that is made an error. `failure(stage, exc)` is the record's failure
block: the stage, the exception's type and the first line of its message.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable

from kbfuse.errors import KbfuseError
from kbfuse.survey.settings import BASELINES

Run = Callable[[], object]
Forward = Callable[..., object]
# Baselines whose build captures the numerics mode in force: built again in each mode.
MODE_BOUND = ("torchscript", "inductor-max-autotune-no-cudagraphs")
# Baselines whose build times kernels on the GPU: built while the job holds the GPU alone.
AUTOTUNED = ("inductor-max-autotune-no-cudagraphs",)


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


def _fresh_frame(model):
    """`model` behind a forward whose code object is new. Dynamo keeps compiled code on the
    code object it starts tracing from and reuses an entry made under an equal backend, and
    torch.compile's backends for one mode compare equal: two max-autotune builds of one model
    (the warm-up and the build alone, or one mode and the next) would otherwise both run the
    first one's compiled code, the later one compiling nothing."""
    import torch

    namespace: dict = {}
    exec("def forward(self, *inputs):\n    return self.inner(*inputs)\n", namespace)  # noqa: S102
    fresh = type("FreshFrame", (torch.nn.Module,), {"forward": namespace["forward"]})()
    fresh.inner = model
    fresh.training = model.training  # the wrapper's own flag only: the model keeps its mode
    return fresh


def make(name: str, model, inputs: list, semantics: str) -> Forward:
    """The forward of baseline `name` (not yet called; `inputs`: the example a trace needs)."""
    if name == "eager":
        return _no_grad(model)
    if name == "torchscript":
        return _no_grad(_torchscript(model, inputs, semantics))
    if name == "inductor":
        return _no_grad(_inductor(model, None))
    if name == "inductor-max-autotune-no-cudagraphs":
        return _no_grad(_inductor(_fresh_frame(model), "max-autotune-no-cudagraphs"))
    raise KbfuseError(f"unknown survey baseline {name!r}; known: {list(BASELINES)}")


def autotune_cache_settings() -> dict:
    """The Inductor settings an AUTOTUNED build runs under, for the numerics mode in force."""
    import torch

    return {
        "cache_key_tag": f"kbfuse cudnn_tf32={bool(torch.backends.cudnn.allow_tf32)}",
        "autotune_local_cache": False,
    }


WARM_TAG = " warm-up"


def conv_backends(setting: str | None) -> str:
    """The convolution backends an AUTOTUNED build chooses from: `setting` (the config's
    `survey.max_autotune_conv_backends`) or, when it is None, Inductor's own default."""
    if setting is not None:
        return setting
    import torch._inductor.config as inductor_config

    return inductor_config.max_autotune_conv_backends


@contextlib.contextmanager
def _build_settings(name: str, tag: str, conv: str | None):
    if name not in AUTOTUNED:
        yield
        return
    import torch._inductor.config as inductor_config
    import torch.compiler.config as compiler_config

    settings = autotune_cache_settings()
    with (
        compiler_config.patch(cache_key_tag=settings["cache_key_tag"] + tag),
        inductor_config.patch(
            autotune_local_cache=settings["autotune_local_cache"],
            max_autotune_conv_backends=conv_backends(conv),
        ),
    ):
        yield


def _built(name: str, model, inputs: list, semantics: str, sync, tag: str, conv) -> tuple:
    start = time.perf_counter()
    with _build_settings(name, tag, conv):
        forward = make(name, model, inputs, semantics)
        forward(*inputs)
        sync()
    return forward, time.perf_counter() - start


def build(
    name: str,
    model,
    inputs: list,
    semantics: str,
    sync: Callable[[], None],
    conv: str | None = None,
) -> tuple:
    """(forward, build_s): the baseline built and called once on `inputs` (where Inductor
    compiles, under `autotune_cache_settings` and the convolution backends `conv` for an
    AUTOTUNED one: `conv_backends`); `sync` waits for the device."""
    return _built(name, model, inputs, semantics, sync, "", conv)


def warm(
    name: str,
    model,
    inputs: list,
    semantics: str,
    sync: Callable[[], None],
    conv: str | None = None,
) -> float:
    """Compile AUTOTUNED baseline `name` once (with `build`'s settings) and throw it away
    (its cache entries tagged WARM_TAG, never read by `build`); returns its seconds, what a
    cold compile costs."""
    if name not in AUTOTUNED:
        raise KbfuseError(f"baseline {name!r} is not autotuned: nothing to warm up")
    return _built(name, model, inputs, semantics, sync, WARM_TAG, conv)[1]


@contextlib.contextmanager
def precompile_threads(threads: int):
    """Inductor's autotuning precompiles its candidate kernels on `threads` threads (it reads
    TORCHINDUCTOR_COMPILE_THREADS at each autotuning); the variable is put back after."""
    import os

    key = "TORCHINDUCTOR_COMPILE_THREADS"
    before = os.environ.get(key)
    os.environ[key] = str(threads)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = before


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
