"""Correctness of one implementation of a task: a fused-kernel variant or a compiled baseline.

Every check is a case record (`kbfuse.checks.numerics.compare`, reference = PyTorch eager) in one
of four groups:

- `full_program`: seeds x distributions, the whole program (model's linear + tail). As in the
  study, each seed builds its own model (seeding the generator first, so every seed has its own
  weights) and its distributions reuse that model; the record names each model's weights by
  sha256 (`weights_sha256`, seed -> hash);
- `timing_input`: the input the timing stage uses (uniform, seed = timing.input_seed) on the
  model the timing stage builds (seeded timing.input_seed too); the tail controls and the
  CUDA-graph checks use that model as well;
- `tail_control`: the tail alone on the real linear output, on boundary values (clamp
  bounds and their float32 neighbours, the inputs that land on them, zeros, subnormals,
  large values) and on non-finite values mixed with finite ones;
- `graph_replay`: the program captured in a CUDA graph, replayed after changing in place, as
  the study did, the input (`mul_(0.9)`), the linear weight (`add_(1e-5)`) and task 95's add
  parameter (`add_(0.01)`), then after replacing each by a fresh draw.

The gate (`passed`) is the official predicate, torch.allclose(reference, candidate, atol,
rtol) with equal_nan=False, on every case. One exception is forced by that predicate: where
the reference itself holds NaN (the non-finite controls), allclose(reference, reference) is
False, so no implementation, PyTorch included, could pass. Those cases are gated by the same
tolerance with equal_nan=True (NaN exactly where the reference has NaN, the official
predicate everywhere else); the record says so under `gate`, keeps `official_pass` as torch
returns it, and carries the official comparison of the non-NaN positions. A program that
cannot be captured in a CUDA graph fails the check `graph/capture`.

Outputs of the kernel are poisoned with NaN before every launch and replay, so an element
a kernel fails to write cannot pass by inheriting a stale correct value.

An implementation is given as a `SubjectMaker` (model -> Subject), so that it can be built on
each seed's model. One job checks every variant of a task (`run_correctness_variants`; the
workflow's rule `correctness_variants`): each model is built and every module loaded once, and
each case's input and eager reference are computed once and compared with every variant's
output. Each
variant still gets its own record, the one `run_correctness` (that variant alone) writes. The
compiled baselines share their cases the same way, in their own job (`run_baselines`).

The parts: `kbfuse.checks.tail_controls` (the control inputs), `kbfuse.checks.cases` (how a case
passes),
`kbfuse.checks.taskchecks` (the checks of one task model); this module checks the request and runs
the stage.
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from kbfuse.checks.cases import GATE_RULE
from kbfuse.checks.taskchecks import Subject, TaskChecks, baseline_subject, variant_subject
from kbfuse.errors import KbfuseError
from kbfuse.io import write_json
from kbfuse.stage import Progress, make_record, read_compile_meta, task_provenance, write_all
from kbfuse.tasks import baselines
from kbfuse.tasks.inputs import check_distributions
from kbfuse.tasks.kernelbench import build_model, load_task, read_pin
from kbfuse.tasks.tails import Tail, tail_for

# The compiled baselines a correctness_baselines job can check (the configured ones, eager
# aside); by default the two the study always had.
BASELINE_IMPLEMENTATIONS = tuple(n for n in baselines.IMPLEMENTATIONS if n != "eager")
DEFAULT_BASELINES = ("torchscript", "inductor")

_logger = logging.getLogger("kbfuse.checks.correctness")


# --------------------------------------------------------------------------- request checks


REQUEST_KEYS = ("seeds", "distributions", "tolerance", "input_seed")
# A request may also name the numerics mode (the second study's; None: the first study's
# strict FP32, kbfuse.tasks.baselines.set_numerics).
OPTIONAL_REQUEST_KEYS = ("numerics",)


def checked_request(request: Any) -> dict:
    """`check_request` of a mapping with exactly the keys REQUEST_KEYS, and optionally those
    of OPTIONAL_REQUEST_KEYS (how the stage entry points take what to check)."""
    if not isinstance(request, Mapping):
        raise KbfuseError(f"a correctness request must be a mapping, got {request!r}")
    missing = [key for key in REQUEST_KEYS if key not in request]
    known = REQUEST_KEYS + OPTIONAL_REQUEST_KEYS
    extra = sorted(str(key) for key in request if key not in known)
    if missing or extra:
        raise KbfuseError(
            f"correctness request: missing {missing}, unknown {extra}; keys: {list(known)}"
        )
    return check_request(**request)


def check_request(
    seeds: Any, distributions: Any, tolerance: Any, input_seed: Any, numerics: Any = None
) -> dict:
    """Validate the study parameters before any work; returns them normalised."""
    if not isinstance(seeds, Sequence) or isinstance(seeds, str) or not seeds:
        raise KbfuseError(f"seeds must be a non-empty list of integers, got {seeds!r}")
    for seed in seeds:
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise KbfuseError(f"seeds: {seed!r} is not a non-negative integer")
    if len(set(seeds)) != len(seeds):
        raise KbfuseError(f"seeds repeat: {list(seeds)}")
    if isinstance(distributions, str) or not isinstance(distributions, Sequence):
        raise KbfuseError(f"distributions must be a list of names, got {distributions!r}")
    if not distributions:
        raise KbfuseError("distributions is empty")
    if len(set(distributions)) != len(distributions):
        raise KbfuseError(f"distributions repeat: {list(distributions)}")
    if not isinstance(tolerance, Mapping):
        raise KbfuseError(f"tolerance must be a mapping with atol and rtol, got {tolerance!r}")
    checked_tolerance = {}
    for key in ("atol", "rtol"):
        value = tolerance.get(key)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise KbfuseError(f"tolerance.{key} must be a number, got {value!r}")
        if not math.isfinite(value) or value < 0:
            raise KbfuseError(f"tolerance.{key} must be finite and >= 0, got {value!r}")
        checked_tolerance[key] = float(value)
    if isinstance(input_seed, bool) or not isinstance(input_seed, int) or input_seed < 0:
        raise KbfuseError(f"input_seed must be a non-negative integer, got {input_seed!r}")
    request = {
        "seeds": [int(s) for s in seeds],
        "distributions": check_distributions(distributions),
        "tolerance": checked_tolerance,
        "input_seed": int(input_seed),
    }
    if numerics is not None:
        request["numerics"] = check_numerics_mode(numerics)
    return request


def check_numerics_mode(mode: Any) -> str | None:
    """A numerics mode of kbfuse.survey.settings.NUMERICS, or None; KbfuseError otherwise."""
    if mode is None:
        return None
    from kbfuse.survey.settings import NUMERICS

    if not isinstance(mode, str) or mode not in NUMERICS:
        raise KbfuseError(f"numerics mode {mode!r} is unknown; known: {list(NUMERICS)}")
    return mode


# --------------------------------------------------------------------------- stage entry points


def _baseline_on(name: str, tail: Tail, x_example, y_example, progress, model) -> Subject:
    progress(f"building {name}")
    return baseline_subject(name, model, tail, x_example, y_example)


def _load(task: int, checkout, pin_path, request: dict, progress: Progress):
    tail = tail_for(task)
    spec = load_task(checkout, read_pin(pin_path), task)
    if not torch.cuda.is_available():
        raise KbfuseError(f"correctness of task {task} needs a CUDA GPU, but torch sees none")
    numerics = baselines.set_numerics(request.get("numerics"))
    model = build_model(spec, seed=request["input_seed"], device="cuda")
    progress(
        f"task {task} ({spec.name}, sha256 {spec.sha256[:12]}, pin {spec.pin_commit[:12]}): "
        f"input shape {tail.input_shape(spec)}, model seed {request['input_seed']}, "
        f"numerics {numerics}"
    )
    return TaskChecks(spec, model, tail, request, progress), numerics


def _shape(checks: TaskChecks) -> dict:
    """The record's `shape` block (kbfuse.tasks.tailbase.Tail.shape_record): input, library
    output and output shapes, on a draw of the input's shape."""
    x = checks.input("uniform", checks.request["input_seed"])
    y = checks.library_output(x)
    record = checks.tail.shape_record(checks.model, x, y)
    del x, y
    return record


def _check_variant_request(variants: Any, outs: Any) -> list[str]:
    """The variant names, in order, after checking `variants` and `outs` name the same ones."""
    if not isinstance(variants, Mapping) or not variants:
        raise KbfuseError(
            f"variants must be a non-empty mapping name -> (artifact, meta), got {variants!r}"
        )
    if not isinstance(outs, Mapping):
        raise KbfuseError(f"outs must be a mapping variant name -> output path, got {outs!r}")
    names = [str(name) for name in variants]
    missing = [name for name in names if name not in outs]
    extra = [str(name) for name in outs if name not in variants]
    if missing or extra:
        raise KbfuseError(
            f"variants and outs disagree: no output path for {missing}, "
            f"an output path but no artifact for {extra}"
        )
    paths = [str(Path(outs[name])) for name in names]
    if len(set(paths)) != len(paths):
        shared = dict(zip(names, paths, strict=True))
        raise KbfuseError(f"two variants share an output path: {shared}")
    for name in names:
        pair = variants[name]
        if not isinstance(pair, Sequence) or isinstance(pair, str | bytes) or len(pair) != 2:
            raise KbfuseError(f"variant {name!r}: expected (artifact, meta path), got {pair!r}")
    return names


def _variant_record(
    task: int, name: str, meta: dict, checks: TaskChecks, request: dict, numerics, result, shape
) -> dict:
    return make_record(
        "correctness",
        task=int(task),
        implementation=name,
        provenance=task_provenance(
            checks.spec,
            variant=name,
            kernel=meta.get("kernel"),
            route=meta.get("route"),
            actual_options=meta.get("actual_options"),
            artifact_sha256=meta.get("artifact_sha256"),
        ),
        tolerance=request["tolerance"],
        shape=shape,
        gate=GATE_RULE,
        numerics=numerics,
        **result,
    )


def run_correctness_variants(
    task: int,
    variants: Mapping[str, tuple],
    outs: Mapping[str, Any],
    checkout,
    pin_path,
    request: Mapping[str, Any],
    log=None,
) -> dict[str, dict]:
    """Check every compiled variant on one task in one process; write each variant's
    results/correctness/{task}/{variant}.json (`outs[name]`).

    `variants`: name -> (artifact, meta path), checked in this order. The model is built once,
    every module loaded once, and each shared case's input and eager reference computed once
    for all variants (TaskChecks.run_all); every record is what `run_correctness` for that
    variant alone writes. The files are written only after every variant is checked.
    `request`: seeds, distributions, tolerance and input_seed (`checked_request`).
    """
    from kbfuse.compilation.launch import LoadedModule

    progress = Progress(log, _logger)
    request = checked_request(request)
    names = _check_variant_request(variants, outs)
    metas = {name: read_compile_meta(variants[name][1], name) for name in names}
    checks, numerics = _load(task, checkout, pin_path, request, progress)
    makers = []
    for name in names:
        artifact = variants[name][0]
        mod = LoadedModule.load(artifact, metas[name], checks.tail.kernels())
        progress(f"loaded {artifact} (variant {name}, route {metas[name].get('route')})")
        makers.append(functools.partial(variant_subject, name, mod, checks.tail))
    results = checks.run_all(makers)
    shape = _shape(checks)
    records = {
        name: _variant_record(
            task, name, metas[name], checks, request, numerics, results[name], shape
        )
        for name in names
    }
    write_all({outs[name]: records[name] for name in names})
    for name in names:
        progress(f"wrote {outs[name]}")
    return records


def run_correctness(
    task: int,
    variant: str,
    artifact,
    meta_path,
    checkout,
    pin_path,
    request: Mapping[str, Any],
    out,
    log=None,
) -> dict:
    """Check one compiled variant on one task; write results/correctness/{task}/{variant}.json.

    `run_correctness_variants` for a single variant.
    """
    return run_correctness_variants(
        task, {variant: (artifact, meta_path)}, {variant: out}, checkout, pin_path, request, log
    )[variant]


def run_baselines(
    task: int,
    checkout,
    pin_path,
    request: Mapping[str, Any],
    out,
    log=None,
    implementations: Sequence[str] = DEFAULT_BASELINES,
) -> dict:
    """Check the compiled baselines like a variant; write correctness/{task}/baselines.json."""
    progress = Progress(log, _logger)
    request = checked_request(request)
    for name in implementations:
        if name not in BASELINE_IMPLEMENTATIONS:
            raise KbfuseError(
                f"unknown compiled baseline {name!r}; known: {', '.join(BASELINE_IMPLEMENTATIONS)}"
            )
    checks, numerics = _load(task, checkout, pin_path, request, progress)
    x_example = checks.input("uniform", request["input_seed"])
    y_example = checks.library_output(x_example)
    makers = [
        functools.partial(_baseline_on, name, checks.tail, x_example, y_example, progress)
        for name in implementations
    ]
    results = checks.run_all(makers)
    del makers
    torch.cuda.empty_cache()
    result = make_record(
        "correctness_baselines",
        task=int(task),
        provenance=task_provenance(checks.spec),
        tolerance=request["tolerance"],
        shape=_shape(checks),
        gate=GATE_RULE,
        numerics=numerics,
        implementations=results,
    )
    write_json(out, result)
    progress(f"wrote {out}")
    return result
