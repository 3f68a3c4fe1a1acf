"""The timing stage: eager, TorchScript, Inductor (default, and max-autotune when configured)
and every kernel variant, interleaved.

Every implementation is compiled and warmed up before the timed region (each baseline's build
seconds, to its first output, in `build_s` per scope); the samples follow the
protocol of `kbfuse.timing.measure` (a synchronisation before every CUDA event pair, balanced round
orders seeded per block and task, each sample's round position recorded). A sample is the time
between a CUDA event pair around `invocations_per_pair` back-to-back calls (method "events")
or CUDA-graph replays (method "graph"), divided by that count. Ratios are paired per round:
baseline_ms / variant_ms of the same round, so > 1 means the variant is faster.

Every timed implementation is gated on its own correctness record (`kbfuse.timing.gate`): what fails
is never loaded or timed and gets a `skipped` entry naming the reason and the failing checks.
`kbfuse.stage.measure_program` times both scopes (the whole program, the tail alone) with both
methods; the controls stage times its small-shape control with it too.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any

from kbfuse import stage
from kbfuse.io import write_json
from kbfuse.tasks import kernelbench
from kbfuse.tasks.inputs import make_input
from kbfuse.tasks.weights import weights_sha256
from kbfuse.timing.gate import TimedTask
from kbfuse.timing.measure import check_protocol

_logger = logging.getLogger("kbfuse.timing.timing")


def run_timing(
    inputs: TimedTask,
    protocol: Mapping[str, Any],
    out: str | os.PathLike,
    log: str | os.PathLike | None = None,
) -> dict:
    """Gate, then time eager and every baseline and variant that passed correctness; write
    the timing JSON. Skipped variants are never loaded."""
    import torch

    say = stage.Progress(log, _logger)
    protocol = check_protocol(protocol)
    task = inputs.task
    gated = inputs.gate(say)
    metas, eligible, baseline_names = gated["metas"], gated["variants"], gated["baselines"]

    spec, tail, numerics = inputs.load()
    model = kernelbench.build_model(spec, seed=protocol["input_seed"])
    x = make_input("uniform", tail.input_shape(spec), protocol["input_seed"], "cuda")
    modules = stage.load_modules(inputs.variants, eligible, metas, tail.kernels())
    say(f"task {task}: timing {baseline_names + eligible}, input {tuple(x.shape)}")

    timed = stage.measure_program(
        stage.Program(model, x, tail, baseline_names, modules), protocol, say, (task,)
    )
    result = stage.make_record(
        "timing",
        task=task,
        provenance=stage.task_provenance(
            spec,
            weights_sha256=weights_sha256(model),
            artifacts={v: metas[v]["artifact_sha256"] for v in eligible},
            kernels={v: metas[v]["kernel"] for v in eligible},
        ),
        protocol=protocol,
        numerics=numerics,
        shape=tail.shape_record(model, x, tail.library_output(model, x)),
        timed=baseline_names + eligible,
        skipped=gated["skipped"],
        measurements=timed["measurements"],
        ratios=timed["ratios"],
        tail_bytes=timed["tail_bytes"],
        build_s=timed.get("build_s", {}),
    )
    write_json(out, result)
    say(f"task {task}: wrote {out}")
    del modules, model, x
    torch.cuda.empty_cache()
    return result
