"""How a correctness case passes: the official predicate, and where it cannot apply.

A case is a `kbfuse.checks.numerics.compare` record of an implementation's output against PyTorch
eager. It passes on the official predicate, torch.allclose(reference, candidate, atol, rtol)
with equal_nan=False, except where the reference itself holds NaN: there allclose fails for
every implementation, PyTorch included, so the same tolerance with equal_nan=True decides
(`gate: "official_equal_nan"`), and the official comparison of the non-NaN positions is kept.
`assemble` sums one implementation's cases into its result (`passed`, failing checks).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch

from kbfuse.checks.numerics import compare, summarize_cases
from kbfuse.io import as_float

GATE_RULE = (
    "official predicate torch.allclose(reference, candidate, atol, rtol, equal_nan=False) on "
    "every case; on cases whose reference holds NaN (where it fails for any implementation) "
    "the same tolerance with equal_nan=True; plus a capturable CUDA graph"
)


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
