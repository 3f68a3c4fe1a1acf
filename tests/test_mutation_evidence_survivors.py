"""What the verdict says about the judge (kbfuse.candidates.evidence.official_block) and one
implementation's gated ratio (kbfuse.checks.cases.assemble), in the details mutation testing
found open (docs/mutation.md, "Survivors")."""

from __future__ import annotations

import math

import torch
from contracts import contract

from kbfuse.candidates import evidence
from kbfuse.checks.cases import assemble, check_case

TOLERANCE = {"atol": 1e-2, "rtol": 1e-2}
CAPTURABLE = {"capturable": True}
COMMIT = "423217d9fda91e0c2d67e4a43bf62f96f6d104f1"


def test_official_block_names_the_contracts_commit():
    judged = {**contract(atol=1e-3, rtol=2e-3, seed=7, trials=3), "commit": COMMIT}
    assert evidence.official_block(judged) == {
        "atol": 1e-3,
        "rtol": 2e-3,
        "source": "eval.py:1 test",
        "argument_order": ["reference", "candidate"],
        "seed": 7,
        "trials": 3,
        "contract_commit": COMMIT,
    }


def test_official_block_without_a_commit_says_none():
    judged = contract()
    del judged["commit"]
    assert evidence.official_block(judged)["contract_commit"] is None


def _case(name: str, candidate: list[float]) -> dict:
    return check_case(torch.tensor([1.0, 2.0]), torch.tensor(candidate), TOLERANCE, name, "g")


def test_gated_max_ratio_is_nan_when_a_later_case_ratio_is_nan():
    # max() keeps the first of (0.5, nan): the NaN must be looked for, wherever it is
    close = _case("close", [1.0, 2.015])  # |diff| 0.015 / (0.01 + 0.01 * 2.015)
    read_back = {**_case("read back", [1.0, 2.0]), "max_ratio_official": "nan"}
    result = assemble([close, read_back], CAPTURABLE)
    assert math.isnan(result["gated_max_ratio_official"])
    assert result["passed"] is True and result["failing_checks"] == []
    first_nan = assemble([read_back, close], CAPTURABLE)
    assert math.isnan(first_nan["gated_max_ratio_official"])


def test_gated_max_ratio_is_the_largest_without_nan():
    close = _case("close", [1.0, 2.015])
    exact = _case("exact", [1.0, 2.0])
    result = assemble([exact, close], CAPTURABLE)
    assert result["gated_max_ratio_official"] == close["max_ratio_official"]
    assert 0.49 < result["gated_max_ratio_official"] < 0.5
