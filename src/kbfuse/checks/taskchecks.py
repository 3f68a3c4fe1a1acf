"""The correctness checks of one task model, for one or several implementations at once.

`TaskChecks` builds the cases of docs/contracts.md (full program per seed and distribution,
the timing input, the tail controls, the CUDA-graph replays) and checks each implementation (a
`Subject`: a compiled kernel variant or a compiled baseline, built on each seed's model by a
`SubjectMaker`) against PyTorch eager, computing each shared case's input and reference once.
Outputs of a kernel are poisoned with NaN before every launch and replay, so an element a
kernel fails to write cannot pass by inheriting a stale correct value.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from kbfuse.checks.cases import assemble, check_case
from kbfuse.checks.tail_controls import control_inputs
from kbfuse.errors import KbfuseError
from kbfuse.faults import checkpoint
from kbfuse.stage import Progress
from kbfuse.tasks import baselines
from kbfuse.tasks.inputs import make_input
from kbfuse.tasks.kernelbench import TaskSpec, build_model
from kbfuse.tasks.tails import Tail
from kbfuse.tasks.weights import weights_sha256

GROUPS = ("full_program", "timing_input", "tail_control", "graph_replay")
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
    from kbfuse.compilation.launch import FusedProgram, run_tail

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
