"""kbfuse.checks.contract on the CPU: errors against float64, non-finite positions, verdicts."""

from __future__ import annotations

import math

import pytest
import torch

from kbfuse.checks import contract
from kbfuse.errors import KbfuseError

NAN, INF = math.nan, math.inf


def test_max_abs_error_reads_the_finite_positions_of_the_reference():
    reference = torch.tensor([1.0, 2.0, NAN, INF], dtype=torch.float64)
    assert contract.max_abs_error(reference, torch.tensor([1.5, 2.0, 7.0, 3.0])) == 0.5
    assert contract.max_abs_error(reference, torch.tensor([NAN, 2.0, NAN, INF])) == INF
    assert contract.max_abs_error(torch.tensor([NAN]), torch.tensor([1.0])) == 0.0


def test_nonfinite_positions_must_be_eagers():
    eager = torch.tensor([NAN, INF, -INF, 1.0])
    assert contract.nonfinite_positions_match(eager, torch.tensor([NAN, INF, -INF, 2.0]))
    assert not contract.nonfinite_positions_match(eager, torch.tensor([1.0, INF, -INF, 2.0]))
    assert not contract.nonfinite_positions_match(eager, torch.tensor([NAN, -INF, -INF, 2.0]))
    assert not contract.nonfinite_positions_match(eager, torch.tensor([NAN, INF, -INF, INF]))


def test_a_candidate_is_no_worse_when_its_error_is_at_most_eagers():
    reference = torch.tensor([10.0, 20.0], dtype=torch.float64)
    eager = torch.tensor([10.25, 20.0])
    close = contract.float64_comparison(reference, eager, torch.tensor([10.0, 20.25]), "r")
    assert close == {
        "reference": "r",
        "eager_max_abs_error": 0.25,
        "candidate_max_abs_error": 0.25,
        "nonfinite_match": True,
        "no_worse": True,
    }
    worse = contract.float64_comparison(reference, eager, torch.tensor([10.0, 20.5]), "r")
    assert not worse["no_worse"]
    with pytest.raises(KbfuseError, match=r"shapes differ \(reference \(2,\), eager \(2,\)"):
        contract.float64_comparison(reference, eager, torch.tensor([1.0]), "r")


def test_the_stage_is_compared_bit_for_bit():
    eager = torch.tensor([0.5, -0.0, NAN])
    same = contract.stage_comparison(eager, eager.clone(), "s")
    assert same["bit_identical"] and same["bit_equal"] == 3 and same["nonfinite_match"]
    signed = contract.stage_comparison(eager, torch.tensor([0.5, 0.0, NAN]), "s")
    assert not signed["bit_identical"] and signed["bit_equal"] == 2 and signed["max_abs_diff"] == 0


def comparison(no_worse: bool) -> dict:
    return {"eager_max_abs_error": 1.0, "candidate_max_abs_error": 0.5 if no_worse else 2.0,
            "nonfinite_match": True, "no_worse": no_worse}  # fmt: skip


def test_a_reduction_case_holds_on_the_stage_and_the_deciding_reference_only():
    stage = {"bit_identical": True}
    holds = contract.reduction_case("c", "g", stage, comparison(True), comparison(False), None)
    assert holds["holds"]  # the wider references are measured, not decisive
    fails = contract.reduction_case("c", "g", stage, comparison(False), comparison(True), None)
    assert not fails["holds"]
    off = contract.reduction_case("c", "g", {"bit_identical": False}, *[comparison(True)] * 2, None)
    assert not off["holds"]
    cases = [holds, fails]
    assert contract.no_worse_count(cases, "float64_tail") == (1, 2)
    assert contract.no_worse_count(cases, "float64_task") == (0, 0)
    assert contract.worst_margin(cases, "float64_reduction") == 2.0
    assert math.isnan(contract.worst_margin(cases, "float64_task"))


def test_verdicts_name_the_failing_cases():
    cases = [
        {"name": "a", "group": "full_program", "bit_equal": 4, "elements": 4},
        {"name": "b", "group": "tail_control", "bit_equal": 3, "elements": 4},
        {"name": "graph/new_input", "group": "graph_replay", "bit_equal": 0, "elements": 4},
    ]
    verdict = contract.verdict("bit-identical", cases, [])
    assert (verdict["passed"], verdict["failing"], verdict["cases_checked"]) == (False, ["b"], 2)
    with pytest.raises(KbfuseError, match="unknown contract 'other'"):
        contract.verdict("other", cases, [])
    with pytest.raises(KbfuseError, match="contract reduction-float64: no case to hold it on"):
        contract.verdict("reduction-float64", cases, [])
