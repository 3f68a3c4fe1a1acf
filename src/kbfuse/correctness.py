"""Correctness of one implementation of a task: a fused-kernel variant or a compiled baseline.

Every check is a case record (`kbfuse.numerics.compare`, reference = PyTorch eager) in one
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
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from kbfuse import baselines
from kbfuse.errors import KbfuseError
from kbfuse.faults import checkpoint
from kbfuse.inputs import check_distributions, make_input
from kbfuse.io import as_float, write_json
from kbfuse.kernelbench import TaskSpec, build_model, load_task, read_pin
from kbfuse.numerics import compare, f32_from_bits, summarize_cases
from kbfuse.stage import Progress, make_record, read_compile_meta, task_provenance, write_all
from kbfuse.tails import Tail, tail_for
from kbfuse.weights import weights_sha256

GROUPS = ("full_program", "timing_input", "tail_control", "graph_replay")
BASELINE_IMPLEMENTATIONS = ("torchscript", "inductor")

# Every tail control is a (CONTROL_ROWS, out_features) tensor, so a compiled tail sees only
# two shapes (the linear output and this one) and recompiles once.
CONTROL_ROWS = 64
# Calls of a compiled baseline on an input before the call that is checked: TorchScript's
# profiling executor optimises a graph after its first runs, and that optimised graph is
# what the timing stage measures.
BASELINE_WARM_CALLS = 2
GRAPH_WARM_CALLS = 3
# Inputs of the CUDA-graph checks: captured with one input, replayed with another.
GRAPH_CAPTURE_SEED = 1000
GRAPH_REPLAY_SEED = 1001
GRAPH_WEIGHT_SEED = 1002
GRAPH_ADD_SEED = 1003
LINEAR_OUTPUT_SEED = 0

GATE_RULE = (
    "official predicate torch.allclose(reference, candidate, atol, rtol, equal_nan=False) on "
    "every case; on cases whose reference holds NaN (where it fails for any implementation) "
    "the same tolerance with equal_nan=True; plus a capturable CUDA graph"
)

_logger = logging.getLogger("kbfuse.correctness")


# --------------------------------------------------------------------------- request checks


def check_request(seeds: Any, distributions: Any, tolerance: Any, input_seed: Any) -> dict:
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
    return {
        "seeds": [int(s) for s in seeds],
        "distributions": check_distributions(distributions),
        "tolerance": checked_tolerance,
        "input_seed": int(input_seed),
    }


# --------------------------------------------------------------------------- control values


def _f32(x: float) -> float:
    return float(np.float32(x))


def tiny_values() -> list[float]:
    """Signed zeros, subnormals (smallest, largest, between) and small normal values."""
    smallest_subnormal = f32_from_bits(0x00000001)
    largest_subnormal = f32_from_bits(0x007FFFFF)
    smallest_normal = f32_from_bits(0x00800000)
    magnitudes = [
        smallest_subnormal,
        _f32(1e-42),
        _f32(1e-40),
        largest_subnormal,
        smallest_normal,
        _f32(1e-37),
        _f32(1e-30),
        _f32(1e-20),
        _f32(1e-10),
        _f32(1e-7),
    ]
    return [0.0, -0.0] + [s * m for m in magnitudes for s in (1.0, -1.0)]


def large_values() -> list[float]:
    """Large magnitudes: where exp() in sigmoid/erf saturates or gives subnormal results."""
    float32_max = f32_from_bits(0x7F7FFFFF)
    magnitudes = [8.0, 10.0, 20.0, 87.5, 88.0, 88.5, 89.0, 100.0, 1e10, 1e30, float32_max]
    return [s * m for m in magnitudes for s in (1.0, -1.0)]


# Non-finite values between finite ones; -inf and NaN give NaN through swish (-inf * 0).
NONFINITE_PATTERN = (math.inf, 1.0, -math.inf, -0.5, math.nan, 0.25, -88.0, 2.5, 0.0, -3.0, -0.0)


def value_rows(values: Sequence[float], cols: int, rows: int = CONTROL_ROWS) -> torch.Tensor:
    """(rows, cols) float32 CPU tensor; row i holds values[i % len(values)] in every column."""
    if not values or len(values) > rows:
        raise KbfuseError(f"need 1..{rows} control values, got {len(values)}")
    column = torch.tensor([values[i % len(values)] for i in range(rows)], dtype=torch.float32)
    return column[:, None].expand(rows, cols).contiguous()


def mixed_rows(pattern: Sequence[float], cols: int, rows: int = CONTROL_ROWS) -> torch.Tensor:
    """(rows, cols) float32 CPU tensor; element (i, j) = pattern[(i + j) % len(pattern)]."""
    values = torch.tensor(list(pattern), dtype=torch.float32)
    index = (torch.arange(rows)[:, None] + torch.arange(cols)[None, :]) % len(pattern)
    return values[index].contiguous()


def control_inputs(tail: Tail, model, cols: int) -> dict[str, torch.Tensor]:
    """The tail-control inputs (CPU tensors, CONTROL_ROWS x cols) by case name."""
    return {
        "tail/bounds": value_rows(tail.bound_values(model), cols),
        "tail/zeros_tiny": value_rows(tiny_values(), cols),
        "tail/large": value_rows(large_values(), cols),
        "tail/nonfinite": mixed_rows(NONFINITE_PATTERN, cols),
    }


# --------------------------------------------------------------------------- case gating


def check_case(
    reference: torch.Tensor,
    candidate: torch.Tensor,
    tolerance: Mapping[str, float],
    name: str,
    group: str,
) -> dict:
    """numerics.compare's record plus `gate` and `gate_pass` (see the module docstring)."""
    atol, rtol = tolerance["atol"], tolerance["rtol"]
    record = compare(reference, candidate, atol, rtol, name=name, group=group)
    nan_in_reference = torch.isnan(reference)
    if not bool(nan_in_reference.any()):
        record["gate"] = "official"
        record["gate_pass"] = record["official_pass"]
        return record
    record["gate"] = "official_equal_nan"
    record["gate_pass"] = bool(
        torch.allclose(reference, candidate, atol=atol, rtol=rtol, equal_nan=True)
    )
    keep = ~nan_in_reference
    record["official_on_non_nan_reference"] = compare(
        reference[keep], candidate[keep], atol, rtol, name=f"{name}[non-NaN reference]", group=group
    )
    return record


def gated_ratio(case: Mapping) -> float:
    """The official error ratio the gate looked at: over the non-NaN reference positions for
    equal-NaN-gated cases (whose own max_ratio_official is inf by the NaN alone)."""
    if case["gate"] == "official_equal_nan":
        return as_float(case["official_on_non_nan_reference"]["max_ratio_official"])
    return as_float(case["max_ratio_official"])


def assemble(cases: list[dict], graph_capture: dict) -> dict:
    """cases, summary, passed and failing_checks of one implementation.

    `gated_max_ratio_official` is the largest official ratio the gate saw: summary's
    max_ratio_official is inf as soon as one reference holds NaN.
    """
    failing = [case["name"] for case in cases if not case["gate_pass"]]
    if not graph_capture["capturable"]:
        failing.append("graph/capture")
    ratios = [gated_ratio(case) for case in cases]
    return {
        "cases": cases,
        "summary": summarize_cases(cases),
        "gated_max_ratio_official": math.nan if any(map(math.isnan, ratios)) else max(ratios),
        "passed": not failing,
        "failing_checks": failing,
        "graph_capture": graph_capture,
    }


# --------------------------------------------------------------------------- GPU checks


@dataclass
class Subject:
    """One implementation under test.

    full(x) and tail(y) return fresh outputs; capture(x) is what a CUDA graph records.
    """

    name: str
    full: Callable[[torch.Tensor], torch.Tensor]
    tail: Callable[[torch.Tensor], torch.Tensor]
    capture: Callable[[torch.Tensor], torch.Tensor]


SubjectMaker = Callable[[Any], Subject]  # a task model -> the implementation built on it


@dataclass
class _Replay:
    graph: torch.cuda.CUDAGraph
    x: torch.Tensor
    out: torch.Tensor


def _repeat_calls(program: Callable, calls: int) -> Callable:
    def steady(x: torch.Tensor) -> torch.Tensor:
        for _ in range(calls):
            program(x)
        return program(x)

    return steady


class TaskChecks:
    """The cases of one task model, checked for one or several implementations at once.

    `run_all(makers)` computes each shared case's input and eager reference once and checks
    every subject against it (full program, timing input, tail controls); the CUDA-graph part
    (capture, replay after changing input and parameters) runs per subject. `run(maker)` is
    `run_all` for one subject. A subject's result is the same whichever others share the run.
    """

    def __init__(self, spec: TaskSpec, model, tail: Tail, request: dict, progress: Progress):
        self.spec = spec
        self.model = model
        self.tail = tail
        self.linear = tail.linear(model)
        self.request = request
        self.tolerance = request["tolerance"]
        self.progress = progress
        self.device = self.linear.weight.device
        self.shape = tuple(spec.input_shape())

    def seed_model(self, seed: int):
        """The task model built right after seeding `seed`, as the study built one per seed."""
        return build_model(self.spec, seed=seed, device=str(self.device))

    def input(self, distribution: str, seed: int) -> torch.Tensor:
        return make_input(distribution, self.shape, seed, self.device)

    def eager(self, x: torch.Tensor, model=None) -> torch.Tensor:
        with torch.no_grad():
            return (self.model if model is None else model)(x)

    def linear_output(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return self.linear(x).contiguous()

    def case(self, reference, candidate, name: str, group: str, subject: Subject) -> dict:
        record = check_case(reference, candidate, self.tolerance, name, group)
        self.progress(
            f"{subject.name} {name}: gate {'pass' if record['gate_pass'] else 'FAIL'}, "
            f"bit_equal {record['bit_equal']}/{record['elements']}, "
            f"max_ratio_official {record['max_ratio_official']:.3g}"
        )
        return record

    def shared_case(
        self,
        reference: torch.Tensor,
        program: str,
        argument: torch.Tensor,
        name: str,
        group: str,
        subjects: Sequence[Subject],
        cases: dict[str, list[dict]],
    ) -> None:
        """Check each subject's `program` ("full" or "tail") on `argument` against `reference`."""
        for subject in subjects:
            candidate = getattr(subject, program)(argument)
            cases[subject.name].append(self.case(reference, candidate, name, group, subject))
            del candidate

    def full_program(
        self, makers: Sequence[SubjectMaker], cases: dict[str, list[dict]]
    ) -> dict[str, str]:
        """Seeds x distributions, each seed on its own model; returns seed -> weights sha256."""
        weights = {}
        for seed in self.request["seeds"]:
            model = self.seed_model(seed)
            weights[str(seed)] = weights_sha256(model)
            self.progress(f"seed {seed}: model weights sha256 {weights[str(seed)][:16]}")
            subjects = [make(model) for make in makers]
            for distribution in self.request["distributions"]:
                checkpoint("correctness", f"seed{seed}/{distribution}")
                x = self.input(distribution, seed)
                reference = self.eager(x, model)
                self.shared_case(
                    reference,
                    "full",
                    x,
                    f"seed{seed}/{distribution}",
                    "full_program",
                    subjects,
                    cases,
                )
                del x, reference
            del subjects, model
            torch.cuda.empty_cache()
        return weights

    def timing_input(self, subjects: Sequence[Subject], cases: dict[str, list[dict]]) -> None:
        seed = self.request["input_seed"]
        x = self.input("uniform", seed)
        self.shared_case(
            self.eager(x),
            "full",
            x,
            f"timing/seed{seed}/uniform",
            "timing_input",
            subjects,
            cases,
        )

    def control_tensors(self) -> dict[str, torch.Tensor]:
        y = self.linear_output(self.input("uniform", LINEAR_OUTPUT_SEED))
        controls = {"tail/linear_output": y}
        cols = self.linear.out_features
        for name, values in control_inputs(self.tail, self.model, cols).items():
            controls[name] = values.to(self.device)
        offset = self.tail.column_offset(self.model)
        if offset is not None:
            # (v - add) + add lands on or next to v: the bound values after the add.
            add = offset.detach()
            with torch.no_grad():
                controls["tail/bounds_minus_add"] = (controls["tail/bounds"] - add).contiguous()
        return controls

    def tail_controls(self, subjects: Sequence[Subject], cases: dict[str, list[dict]]) -> None:
        for name, y in self.control_tensors().items():
            reference = self.tail.reference(self.model, y)
            self.shared_case(reference, "tail", y, name, "tail_control", subjects, cases)

    def _new_linear_parameters(self) -> dict[str, torch.Tensor]:
        # Uniform in +-1/sqrt(in_features), nn.Linear's own initialisation range.
        bound = 1.0 / math.sqrt(self.linear.in_features)
        fresh = {}
        for index, (name, param) in enumerate(self.linear.named_parameters()):
            draw = make_input("uniform", tuple(param.shape), GRAPH_WEIGHT_SEED + index)
            fresh[name] = ((draw * 2 - 1) * bound).to(self.device)
        return fresh

    def graph_replay(self, subject: Subject) -> tuple[list[dict], dict]:
        static_x = self.input("uniform", GRAPH_CAPTURE_SEED)
        try:
            graph, static_out = capture_graph(subject.capture, static_x, GRAPH_WARM_CALLS)
        except Exception as exc:  # recorded as the failing check graph/capture
            torch.cuda.synchronize()
            self.progress(f"{subject.name} graph/capture: FAIL ({type(exc).__name__}: {exc})")
            return [], {"capturable": False, "error": f"{type(exc).__name__}: {exc}"}
        self.progress(f"{subject.name} graph/capture: captured")

        saved = {name: p.detach().clone() for name, p in self.model.named_parameters()}
        replay = _Replay(graph, static_x, static_out)
        cases = []
        try:
            # The study's own mutations first: small in-place nudges ...
            with torch.no_grad():
                static_x.mul_(0.9)
            cases.append(self.replay_case(replay, "graph/input_mul_0.9", subject))
            with torch.no_grad():
                self.linear.weight.add_(1e-5)
            cases.append(self.replay_case(replay, "graph/weight_add_1e-5", subject))
            for name, param in self.tail.tail_parameters(self.model).items():
                with torch.no_grad():
                    param.add_(0.01)
                cases.append(self.replay_case(replay, f"graph/{name}_add_0.01", subject))
            # ... then fresh draws, which a replay of stale data cannot pass by being close.
            with torch.no_grad():
                static_x.copy_(self.input("uniform", GRAPH_REPLAY_SEED))
            cases.append(self.replay_case(replay, "graph/new_input", subject))

            with torch.no_grad():
                for name, value in self._new_linear_parameters().items():
                    getattr(self.linear, name).copy_(value)
            cases.append(self.replay_case(replay, "graph/new_weights", subject))

            for name, param in self.tail.tail_parameters(self.model).items():
                with torch.no_grad():
                    param.copy_(make_input("normal", tuple(param.shape), GRAPH_ADD_SEED).to(param))
                cases.append(self.replay_case(replay, f"graph/new_{name}", subject))
        finally:
            with torch.no_grad():
                for name, param in self.model.named_parameters():
                    param.copy_(saved[name])
            torch.cuda.synchronize()
        return cases, {"capturable": True, "error": None}

    def replay_case(self, replay: _Replay, name: str, subject: Subject) -> dict:
        """Poison the static output, replay, compare with eager on the current values."""
        replay.out.fill_(math.nan)
        replay.graph.replay()
        return self.case(self.eager(replay.x), replay.out, name, "graph_replay", subject)

    def run_all(self, makers: Sequence[SubjectMaker]) -> dict[str, dict]:
        """subject name -> result (`assemble`), in the order of `makers`; each result also
        holds `weights_sha256` (seed -> hash of that seed's model, the timing seed included)."""
        subjects = [make(self.model) for make in makers]
        names = [subject.name for subject in subjects]
        if not names:
            raise KbfuseError(f"task {self.spec.task}: no implementation to check")
        if len(set(names)) != len(names):
            raise KbfuseError(f"task {self.spec.task}: implementation names repeat: {names}")
        self.progress(f"checking {', '.join(names)} on task {self.spec.task}")
        cases: dict[str, list[dict]] = {name: [] for name in names}
        weights = self.full_program(makers, cases)
        weights[str(self.request["input_seed"])] = weights_sha256(self.model)
        self.timing_input(subjects, cases)
        self.tail_controls(subjects, cases)
        torch.cuda.empty_cache()
        results = {}
        for subject in subjects:
            replay_cases, capture = self.graph_replay(subject)
            cases[subject.name] += replay_cases
            torch.cuda.empty_cache()
            result = assemble(cases[subject.name], capture)
            result["weights_sha256"] = dict(weights)
            self.progress(
                f"{subject.name}: {'passed' if result['passed'] else 'FAILED'} "
                f"({result['summary']['bit_identical_cases']}/{len(result['cases'])} cases "
                f"bit-identical; failing: {result['failing_checks']})"
            )
            results[subject.name] = result
        return results

    def run(self, make: SubjectMaker) -> dict:
        return next(iter(self.run_all([make]).values()))


def capture_graph(program: Callable, static_x: torch.Tensor, warm_calls: int):
    """(graph, static output) of program(static_x), warmed up on a side stream as torch asks."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warm_calls):
            program(static_x)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = program(static_x)
    torch.cuda.synchronize()
    return graph, static_out


def variant_subject(name: str, mod, tail: Tail, model) -> Subject:
    """The fused kernel: the model's own linear, then the kernel tail; outputs NaN-poisoned."""
    from kbfuse.launch import FusedProgram, run_tail

    program = FusedProgram(mod, tail, model)
    out_features = tail.linear(model).out_features

    def full(x: torch.Tensor) -> torch.Tensor:
        out = torch.full((x.shape[0], out_features), math.nan, dtype=x.dtype, device=x.device)
        return program(x, out=out)

    def tail_only(y: torch.Tensor) -> torch.Tensor:
        return run_tail(mod, tail, model, y, out=torch.full_like(y, math.nan))

    return Subject(name=name, full=full, tail=tail_only, capture=program)


def baseline_subject(name: str, model, tail: Tail, x_example, y_example) -> Subject:
    """A compiled baseline of the full model and, built on first use, of the tail module (the
    per-seed models of the full-program cases never need the tail)."""
    full = baselines.build(name, model, x_example)

    @functools.cache
    def tail_program() -> Callable[[torch.Tensor], torch.Tensor]:
        built = baselines.build(name, baselines.tail_module(model, tail), y_example)
        return _repeat_calls(built, BASELINE_WARM_CALLS)

    return Subject(
        name=name,
        full=_repeat_calls(full, BASELINE_WARM_CALLS),
        tail=lambda y: tail_program()(y),
        capture=full,
    )


def _baseline_on(name: str, tail: Tail, x_example, y_example, progress, model) -> Subject:
    progress(f"building {name}")
    return baseline_subject(name, model, tail, x_example, y_example)


# --------------------------------------------------------------------------- stage entry points


def _load(task: int, checkout, pin_path, request: dict, progress: Progress):
    tail = tail_for(task)
    spec = load_task(checkout, read_pin(pin_path), task)
    if not torch.cuda.is_available():
        raise KbfuseError(f"correctness of task {task} needs a CUDA GPU, but torch sees none")
    numerics = baselines.set_numerics()
    model = build_model(spec, seed=request["input_seed"], device="cuda")
    progress(
        f"task {task} ({spec.name}, sha256 {spec.sha256[:12]}, pin {spec.pin_commit[:12]}): "
        f"input shape {spec.input_shape()}, model seed {request['input_seed']}"
    )
    return TaskChecks(spec, model, tail, request, progress), numerics


def _shape(checks: TaskChecks) -> dict:
    batch, in_features = checks.shape
    return {
        "batch": batch,
        "in_features": in_features,
        "out_features": checks.linear.out_features,
    }


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
    task: int, name: str, meta: dict, checks: TaskChecks, request: dict, numerics, result
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
        shape=_shape(checks),
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
    seeds,
    distributions,
    tolerance,
    input_seed: int,
    log=None,
) -> dict[str, dict]:
    """Check every compiled variant on one task in one process; write each variant's
    results/correctness/{task}/{variant}.json (`outs[name]`).

    `variants`: name -> (artifact, meta path), checked in this order. The model is built once,
    every module loaded once, and each shared case's input and eager reference computed once
    for all variants (TaskChecks.run_all); every record is what `run_correctness` for that
    variant alone writes. The files are written only after every variant is checked.
    """
    from kbfuse.launch import LoadedModule

    progress = Progress(log, _logger)
    request = check_request(seeds, distributions, tolerance, input_seed)
    names = _check_variant_request(variants, outs)
    metas = {name: read_compile_meta(variants[name][1], name) for name in names}
    checks, numerics = _load(task, checkout, pin_path, request, progress)
    makers = []
    for name in names:
        artifact = variants[name][0]
        mod = LoadedModule.load(artifact, metas[name])
        progress(f"loaded {artifact} (variant {name}, route {metas[name].get('route')})")
        makers.append(functools.partial(variant_subject, name, mod, checks.tail))
    results = checks.run_all(makers)
    records = {
        name: _variant_record(task, name, metas[name], checks, request, numerics, results[name])
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
    seeds,
    distributions,
    tolerance,
    input_seed: int,
    out,
    log=None,
) -> dict:
    """Check one compiled variant on one task; write results/correctness/{task}/{variant}.json.

    `run_correctness_variants` for a single variant.
    """
    return run_correctness_variants(
        task,
        {variant: (artifact, meta_path)},
        {variant: out},
        checkout,
        pin_path,
        seeds,
        distributions,
        tolerance,
        input_seed,
        log,
    )[variant]


def run_baselines(
    task: int,
    checkout,
    pin_path,
    seeds,
    distributions,
    tolerance,
    input_seed: int,
    out,
    log=None,
    implementations: Sequence[str] = BASELINE_IMPLEMENTATIONS,
) -> dict:
    """Check the compiled baselines like a variant; write correctness/{task}/baselines.json."""
    progress = Progress(log, _logger)
    request = check_request(seeds, distributions, tolerance, input_seed)
    for name in implementations:
        if name not in BASELINE_IMPLEMENTATIONS:
            raise KbfuseError(
                f"unknown compiled baseline {name!r}; known: {', '.join(BASELINE_IMPLEMENTATIONS)}"
            )
    checks, numerics = _load(task, checkout, pin_path, request, progress)
    x_example = checks.input("uniform", request["input_seed"])
    y_example = checks.linear_output(x_example)
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
