"""The correctness checks of one task model, for one or several implementations at once.

`TaskChecks` builds the cases of docs/contracts.md (full program per seed and distribution,
the timing input, the tail controls, the CUDA-graph replays) and checks each implementation (a
`Subject`: a compiled kernel variant or a compiled baseline, built on each seed's model by a
`SubjectMaker`) against PyTorch eager, computing each shared case's input and reference once.
Outputs of a kernel are poisoned with NaN before every launch and replay, so an element a
kernel fails to write cannot pass by inheriting a stale correct value.

A kernel variant of a tail that names a contract (kbfuse.checks.contract) gets a `contract`
verdict beside the gate: for a pointwise tail read off its cases' bit-equal counts, for a
reducing tail checked case by case (`ReductionCase`: its stage kernel against eager's
element-wise stage, its result's error against the float64 references against eager's) on
every whole-program case, the timing input and every tail control.
"""

from __future__ import annotations

import copy
import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from kbfuse.checks import contract
from kbfuse.checks.cases import assemble, check_case
from kbfuse.checks.tail_controls import control_inputs
from kbfuse.errors import KbfuseError
from kbfuse.faults import checkpoint
from kbfuse.stage import Progress
from kbfuse.tasks import baselines
from kbfuse.tasks.inputs import make_input
from kbfuse.tasks.kernelbench import TaskSpec, build_model
from kbfuse.tasks.tailbase import fan_in_bound
from kbfuse.tasks.tails import Tail
from kbfuse.tasks.weights import weights_sha256
from kbfuse.workflow.outofmemory import is_out_of_memory

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
    # A kernel variant of a reducing tail: its element-wise stage on a library output (the
    # stage kernel), held to the tail's contract case by case (kbfuse.checks.contract).
    stage: Callable[[torch.Tensor], torch.Tensor] | None = None
    # The contract it is held to (kbfuse.checks.contract; None: the official gate only).
    contract: str | None = None


@dataclass
class CaseInput:
    """What a reducing tail's contract needs of one case besides its outputs: the model it
    ran on, the library output the tail saw, and the program input (None for tail controls)."""

    model: Any
    y: torch.Tensor
    x: torch.Tensor | None = None


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
        self.library = tail.library(model)
        self.request = request
        self.tolerance = request["tolerance"]
        self.progress = progress
        self.device = self.library.weight.device
        self.shape = tuple(tail.input_shape(spec))

    def seed_model(self, seed: int):
        """The task model built right after seeding `seed`, as the study built one per seed."""
        return build_model(self.spec, seed=seed, device=str(self.device))

    def input(self, distribution: str, seed: int) -> torch.Tensor:
        return make_input(distribution, self.shape, seed, self.device)

    def eager(self, x: torch.Tensor, model=None) -> torch.Tensor:
        with torch.no_grad():
            return (self.model if model is None else model)(x)

    def library_output(self, x: torch.Tensor, model=None) -> torch.Tensor:
        return self.tail.library_output(self.model if model is None else model, x)

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
        where: CaseInput | None = None,
    ) -> None:
        """Check each subject's `program` ("full" or "tail") on `argument` against `reference`;
        subjects with a stage also against the reduction contract (`where` says what on)."""
        checker = None
        for subject in subjects:
            candidate = getattr(subject, program)(argument)
            cases[subject.name].append(self.case(reference, candidate, name, group, subject))
            if subject.stage is not None and where is not None:
                checker = checker or ReductionCase(self.tail, where, reference, name, group)
                record = checker.check(subject, candidate)
                self.contract_cases.setdefault(subject.name, []).append(record)
                self.progress(f"{subject.name} {name}: reduction contract {checker.say(record)}")
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
                    self.case_input(subjects, model, x),
                )
                del x, reference
            del subjects, model
            torch.cuda.empty_cache()
        return weights

    def case_input(self, subjects: Sequence[Subject], model, x) -> CaseInput | None:
        """The contract's view of a whole-program case, when a subject is held to it."""
        if not any(subject.stage is not None for subject in subjects):
            return None
        return CaseInput(model=model, y=self.library_output(x, model), x=x)

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
            self.case_input(subjects, self.model, x),
        )

    def control_tensors(self) -> dict[str, torch.Tensor]:
        y = self.library_output(self.input("uniform", LINEAR_OUTPUT_SEED))
        controls = {self.tail.library_case: y}
        cols = self.tail.control_columns(self.model)
        for name, values in control_inputs(self.tail, self.model, cols).items():
            controls[name] = self.tail.control_input(self.model, values).to(self.device)
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
            where = CaseInput(model=self.model, y=y)
            self.shared_case(reference, "tail", y, name, "tail_control", subjects, cases, where)

    def _new_library_parameters(self) -> dict[str, torch.Tensor]:
        # Uniform in +-1/sqrt(fan_in), nn.Linear's (1/sqrt(in_features)) and nn.Conv2d's own
        # initialisation range.
        bound = fan_in_bound(self.library.weight)
        fresh = {}
        for index, (name, param) in enumerate(self.library.named_parameters()):
            draw = make_input("uniform", tuple(param.shape), GRAPH_WEIGHT_SEED + index)
            fresh[name] = ((draw * 2 - 1) * bound).to(self.device)
        return fresh

    def graph_replay(self, subject: Subject) -> tuple[list[dict], dict]:
        static_x = self.input("uniform", GRAPH_CAPTURE_SEED)
        try:
            graph, static_out = capture_graph(subject.capture, static_x, GRAPH_WARM_CALLS)
        except Exception as exc:  # recorded as the failing check graph/capture
            if is_out_of_memory(exc):
                raise  # the device's memory, not the subject: the job runs again, alone
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
                self.library.weight.add_(1e-5)
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
                for name, value in self._new_library_parameters().items():
                    getattr(self.library, name).copy_(value)
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
        self.contract_cases: dict[str, list[dict]] = {}
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
            if subject.contract is not None:
                result["contract"] = contract.verdict(
                    subject.contract, result["cases"], self.contract_cases.get(subject.name, [])
                )
            self.progress(
                f"{subject.name}: {'passed' if result['passed'] else 'FAILED'} "
                f"({result['summary']['bit_identical_cases']}/{len(result['cases'])} cases "
                f"bit-identical; failing: {result['failing_checks']})"
            )
            results[subject.name] = result
        return results

    def run(self, make: SubjectMaker) -> dict:
        return next(iter(self.run_all([make]).values()))


class ReductionCase:
    """One case of a reducing tail's contract (kbfuse.checks.contract), for every subject
    held to it: eager's element-wise stage and the float64 references are computed once, on
    the first subject, then each subject's stage kernel and result are compared with them."""

    def __init__(self, tail: Tail, where: CaseInput, eager: torch.Tensor, name: str, group: str):
        self.tail = tail
        self.where = where
        self.eager = eager
        self.name = name
        self.group = group
        reduction = tail.reduction(where.model, where.y)
        self.stage_reference = reduction.stage
        self.reduction64 = reduction.again(reduction.stage.double())
        model64 = copy.deepcopy(where.model).double()
        with torch.no_grad():
            self.tail64 = tail.reference(model64, where.y.double())
            self.task64 = None if where.x is None else model64(where.x.double())
        del model64

    def check(self, subject: Subject, candidate: torch.Tensor) -> dict:
        stage = contract.stage_comparison(
            self.stage_reference, subject.stage(self.where.y), f"{self.name}/stage"
        )
        compare = functools.partial(
            contract.float64_comparison, eager=self.eager, candidate=candidate
        )
        reduction = compare(self.reduction64, name="float64_reduction")
        tail = compare(self.tail64, name="float64_tail")
        task = None if self.task64 is None else compare(self.task64, name="float64_task")
        return contract.reduction_case(self.name, self.group, stage, reduction, tail, task)

    @staticmethod
    def say(record: dict) -> str:
        parts = [f"stage bit_equal {record['stage']['bit_equal']}/{record['stage']['elements']}"]
        for key in ("float64_reduction", "float64_tail", "float64_task"):
            if record[key] is not None:
                parts.append(
                    f"{key} error {record[key]['candidate_max_abs_error']:.3g} "
                    f"(eager {record[key]['eager_max_abs_error']:.3g})"
                )
        return ("holds" if record["holds"] else "FAILS") + ": " + ", ".join(parts)


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
    """The fused kernel: the model's own library op, then the kernel tail (and, for a reducing
    tail, its stage kernel); outputs NaN-poisoned."""
    from kbfuse.compilation.launch import FusedProgram, run_stage, run_tail

    program = FusedProgram(mod, tail, model)

    def poisoned_output(y: torch.Tensor) -> torch.Tensor:
        return torch.full(tail.output_shape(model, y), math.nan, dtype=y.dtype, device=y.device)

    def full(x: torch.Tensor) -> torch.Tensor:
        y = tail.library_output(model, x)
        return run_tail(mod, tail, model, y, out=poisoned_output(y))

    def tail_only(y: torch.Tensor) -> torch.Tensor:
        return run_tail(mod, tail, model, y, out=poisoned_output(y))

    def stage(y: torch.Tensor) -> torch.Tensor:
        out = torch.full(tail.stage_shape(model, y), math.nan, dtype=y.dtype, device=y.device)
        return run_stage(mod, tail, model, y, out=out)

    return Subject(
        name=name,
        full=full,
        tail=tail_only,
        capture=program,
        stage=stage if tail.stage_kernel is not None else None,
        contract=tail.contract,
    )


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
