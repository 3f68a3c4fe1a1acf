"""Correctness of one baseline's output against eager's, as KernelBench would judge it.

`official_pass` is the pinned KernelBench predicate in its argument order, reference first:
`torch.allclose(reference, candidate, atol=1e-2, rtol=1e-2)`, whose relative term is scaled
by |candidate| (kbfuse.checks.numerics.official_allclose). The direction audit of the study records
both readings: `candidate_scaled_pass` (the official one) and `reference_scaled_pass` (the
arguments swapped, kbfuse.checks.numerics.historical_allclose); a baseline whose verdict depends on
the direction sits on the tolerance's edge. Beside the verdicts: how many elements are not
bit-equal, the largest absolute difference and the largest relative difference
|ref - cand| / |ref| over the elements where ref != 0 (non-finite values are written as the
strings "nan"/"inf", kbfuse.io.jsonable).
"""

from __future__ import annotations

from kbfuse.errors import KbfuseError
from kbfuse.survey.blindspots import OFFICIAL_ATOL, OFFICIAL_RTOL


def _check_output(reference, candidate) -> None:
    import torch

    if not isinstance(candidate, torch.Tensor):
        raise KbfuseError(f"the output is a {type(candidate).__name__}, not a tensor")
    if candidate.dtype != torch.float32 or reference.dtype != torch.float32:
        raise KbfuseError(
            f"outputs must be float32 (reference {reference.dtype}, candidate {candidate.dtype})"
        )
    if candidate.shape != reference.shape:
        raise KbfuseError(
            f"output shape {tuple(candidate.shape)} differs from eager's {tuple(reference.shape)}"
        )


def compare(reference, candidate) -> dict:
    """The record's `correctness` block of one baseline (`candidate`) against eager."""
    import torch

    from kbfuse.checks.numerics import bit_equal_count, historical_allclose, official_allclose

    _check_output(reference, candidate)
    candidate = candidate.to(reference.device)
    with torch.no_grad():
        diff = (reference.double() - candidate.double()).abs()
        nonzero = reference != 0
        rel = diff[nonzero] / reference.double().abs()[nonzero]
        max_abs = float(diff.max().item()) if diff.numel() else 0.0
        max_rel = float(rel.max().item()) if rel.numel() else 0.0
    official = official_allclose(reference, candidate, OFFICIAL_ATOL, OFFICIAL_RTOL)
    return {
        "official_pass": official,
        "atol": OFFICIAL_ATOL,
        "rtol": OFFICIAL_RTOL,
        "numel": int(reference.numel()),
        "not_bit_equal": int(reference.numel()) - bit_equal_count(reference, candidate),
        "max_abs": max_abs,
        "max_rel": max_rel,
        "direction": {
            "candidate_scaled_pass": official,
            "reference_scaled_pass": historical_allclose(
                reference, candidate, OFFICIAL_ATOL, OFFICIAL_RTOL
            ),
        },
    }


def output_stats(output) -> dict:
    """The record's `output` block: shape, dtype and magnitude statistics of eager's output."""
    import torch

    if not isinstance(output, torch.Tensor):
        raise KbfuseError(f"the task's forward returns a {type(output).__name__}, not a tensor")
    values = output.detach().double()
    empty = values.numel() == 0
    return {
        "shape": list(output.shape),
        "dtype": str(output.dtype).removeprefix("torch."),
        "mean": 0.0 if empty else float(values.mean().item()),
        "std": 0.0 if values.numel() < 2 else float(values.std().item()),
        "abs_mean": 0.0 if empty else float(values.abs().mean().item()),
        "abs_max": 0.0 if empty else float(values.abs().max().item()),
    }
