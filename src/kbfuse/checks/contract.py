"""The numerical contract a fused tail is held to, named in its records and in the tables.

The official check (the pinned KernelBench's `allclose`, kbfuse.checks.official) gates timing
for every implementation; it is not the contract. On task 65 a constant output passes it (the
survey's blind spot), so the second study states what its kernels promise and checks it case
by case (kbfuse.tasks.tailbase.Tail.contract names each tail's):

- `bit-identical` (a pointwise tail): every correctness case is bit-identical to eager, and
  so are all 2^32 float32 inputs through the exhaustive control (the controls record; the
  summary's `contract` table joins the two).
- `reduction-float64` (a tail that reduces). Bit identity with PyTorch's own reduction order is
  not the goal. On every case:
  1. every element-wise stage stays bit-identical: the stage kernel's output (the tensor the
     kernel feeds its reduction) against eager's own, captured while the pinned forward runs
     (`stage`);
  2. the result's error against a float64 evaluation is no worse than eager's own float32
     error against the same reference (the largest absolute error over the finite positions
     of the reference; non-finite values exactly where eager has them). The reference that
     decides, `float64_reduction`, is the pinned forward's own reduction run in float64 on
     eager's element-wise stage: with the stage bit-identical (clause 1), that reduction is
     all the kernel changes, and a kernel that sums in float64 and rounds once is then no
     worse than any float32 result by construction, whatever the data;
  3. the official check passes (the record's gate; not repeated here).

Two wider references are measured on every case too and recorded beside it, as the issue
asked: the pinned tail in float64 on the case's library output (`float64_tail`), and for
whole-program cases the whole task in float64 from the float32 input and weights
(`float64_task`). They do not decide: both implementations share the float32 rounding of the
element-wise stage (and, for the task, the library op's own float32 or TF32 error), and where
eager's reduction error is no larger than that shared error, which of the two lands closer is
chance. tests/test_fused2_stages.py shows it on the CPU fixture: a float64 sum of eager's own
stage, no worse than eager against `float64_reduction` on every case, is worse than eager
against `float64_task` on two of its eight whole-program cases. The `contract` table counts
the cases where each wider comparison holds.

A case fails the contract when clause 1 or 2 does; `contract.passed` is true when no case
fails. The first study's tails name no contract (their records predate this one; their bit
identity is in the bit-equal counts of every case).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import torch

from kbfuse.checks.numerics import bit_equal_count
from kbfuse.errors import KbfuseError
from kbfuse.io import as_float

BIT_IDENTICAL = "bit-identical"
REDUCTION_FLOAT64 = "reduction-float64"
DESCRIPTIONS = {
    BIT_IDENTICAL: "bit-identical to eager on every case and on all 2^32 float32 inputs",
    REDUCTION_FLOAT64: (
        "element-wise stages bit-identical; error against the reduction in float64 of eager's "
        "stage no worse than eager's, per case; official check passes (error against the "
        "tail and the whole task in float64 measured beside it)"
    ),
}
# The float64 references of a reducing tail's case: the one that decides, then those reported.
DECIDING_REFERENCE = "float64_reduction"
REPORTED_REFERENCES = ("float64_tail", "float64_task")
CONTRACT_GROUPS = ("full_program", "timing_input", "tail_control")


def describe(name: str) -> str:
    try:
        return DESCRIPTIONS[name]
    except KeyError:
        raise KbfuseError(f"unknown contract {name!r}; known: {sorted(DESCRIPTIONS)}") from None


def max_abs_error(reference: torch.Tensor, result: torch.Tensor) -> float:
    """The largest |result - reference| over the finite positions of `reference`, in float64
    (0.0 when there are none); inf where `result` is not finite (NaN included) there."""
    ref = reference.detach().to(torch.float64)
    res = result.detach().to(torch.float64)
    finite = torch.isfinite(ref)
    if not bool(finite.any()):
        return 0.0
    error = (res[finite] - ref[finite]).abs()
    return float(torch.where(torch.isnan(error), math.inf, error).max())


def nonfinite_positions_match(eager: torch.Tensor, candidate: torch.Tensor) -> bool:
    """NaN where eager has NaN, the same infinity where eager has one, finite elsewhere."""
    eager_nan, cand_nan = torch.isnan(eager), torch.isnan(candidate)
    if not torch.equal(eager_nan, cand_nan):
        return False
    eager_inf, cand_inf = torch.isinf(eager), torch.isinf(candidate)
    if not torch.equal(eager_inf, cand_inf):
        return False
    return bool(torch.equal(eager[eager_inf], candidate[cand_inf]))


def float64_comparison(
    reference64: torch.Tensor, eager: torch.Tensor, candidate: torch.Tensor, name: str
) -> dict:
    """Eager's and the candidate's largest error against `reference64`, and whether the
    candidate's is no worse (the contract's second clause)."""
    if not (reference64.shape == eager.shape == candidate.shape):
        raise KbfuseError(
            f"float64 comparison {name}: shapes differ (reference {tuple(reference64.shape)}, "
            f"eager {tuple(eager.shape)}, candidate {tuple(candidate.shape)})"
        )
    eager_error = max_abs_error(reference64, eager)
    candidate_error = max_abs_error(reference64, candidate)
    nonfinite = nonfinite_positions_match(eager, candidate)
    return {
        "reference": name,
        "eager_max_abs_error": eager_error,
        "candidate_max_abs_error": candidate_error,
        "nonfinite_match": nonfinite,
        "no_worse": nonfinite and candidate_error <= eager_error,
    }


def stage_comparison(eager_stage: torch.Tensor, kernel_stage: torch.Tensor, name: str) -> dict:
    """The stage kernel's output against eager's stage, bit for bit (no tolerance: the margin
    audit, which reads every error ratio of a record, finds none here)."""
    if eager_stage.shape != kernel_stage.shape:
        raise KbfuseError(
            f"stage {name}: eager's stage has shape {tuple(eager_stage.shape)}, the kernel's "
            f"{tuple(kernel_stage.shape)}"
        )
    elements = int(eager_stage.numel())
    equal = bit_equal_count(eager_stage, kernel_stage)
    return {
        "name": name,
        "elements": elements,
        "bit_equal": equal,
        "bit_identical": equal == elements,
        "max_abs_diff": max_abs_error(eager_stage, kernel_stage),
        "nonfinite_match": nonfinite_positions_match(eager_stage, kernel_stage),
    }


def reduction_case(
    name: str,
    group: str,
    stage: dict,
    float64_reduction: dict,
    float64_tail: dict,
    float64_task: dict | None,
) -> dict:
    """One case's contract record: its comparisons and whether it holds (the stage's bits and
    the deciding reference; the wider references are recorded, not decisive)."""
    holds = bool(stage["bit_identical"]) and bool(float64_reduction["no_worse"])
    return {
        "name": name,
        "group": group,
        "stage": stage,
        "float64_reduction": float64_reduction,
        "float64_tail": float64_tail,
        "float64_task": float64_task,
        "holds": holds,
    }


def no_worse_count(contract_cases: Sequence[Mapping], reference: str) -> tuple[int, int]:
    """(cases where the candidate is no worse than eager against `reference`, cases that have
    that reference)."""
    compared = [case[reference] for case in contract_cases if case.get(reference)]
    return sum(bool(c["no_worse"]) for c in compared), len(compared)


def verdict(name: str | None, cases: Sequence[Mapping], contract_cases: Sequence[Mapping]) -> dict:
    """The `contract` block of a correctness record: the contract's name, whether it holds on
    every case of the record, the failing cases by name, and the per-case comparisons (a
    reducing tail's; a pointwise tail's contract is read off the cases' bit-equal counts)."""
    describe(name)
    if name == BIT_IDENTICAL:
        checked = [c for c in cases if c["group"] in CONTRACT_GROUPS]
        failing = [c["name"] for c in checked if int(c["bit_equal"]) != int(c["elements"])]
    else:
        checked = list(contract_cases)
        failing = [c["name"] for c in checked if not c["holds"]]
    if not checked:
        raise KbfuseError(f"contract {name}: no case to hold it on")
    return {
        "name": name,
        "description": DESCRIPTIONS[name],
        "passed": not failing,
        "cases_checked": len(checked),
        "failing": failing,
        "cases": list(contract_cases),
    }


def worst_margin(contract_cases: Sequence[Mapping], reference: str) -> float:
    """The largest candidate error over eager's, over the cases' `reference` comparisons
    (< 1: the kernel closer to float64 everywhere; nan when no case has that reference)."""
    ratios = []
    for case in contract_cases:
        comparison = case.get(reference)
        if not comparison:
            continue
        # as written to JSON too: non-finite errors are the strings "inf" and "nan"
        eager = as_float(comparison["eager_max_abs_error"])
        cand = as_float(comparison["candidate_max_abs_error"])
        if eager > 0:
            ratios.append(cand / eager if math.isfinite(eager) else float(math.isinf(cand)))
        elif cand > 0:
            ratios.append(math.inf)
    return max(ratios) if ratios else math.nan
