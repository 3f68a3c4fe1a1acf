"""Tolerance blind spots: does a trivial candidate pass the official check on this task?

The official predicate is KernelBench's, `torch.allclose(output, candidate, atol=1e-2,
rtol=1e-2)` (reference first, kbfuse.checks.numerics.official_allclose), on the official inputs,
against eager's output under the task's seed. Candidates: all zeros; the reference's mean as a
constant; the input itself where an input tensor has the output's shape and dtype. A task
where any passes is a blind spot: its correctness check proves little.
"""

from __future__ import annotations

OFFICIAL_ATOL = OFFICIAL_RTOL = 1e-2
COMPARED = "eager output, same seed"


def _passes(reference, candidate) -> bool:
    from kbfuse.checks.numerics import official_allclose

    return official_allclose(reference, candidate, OFFICIAL_ATOL, OFFICIAL_RTOL)


def _same_layout(x, reference) -> bool:
    import torch

    return isinstance(x, torch.Tensor) and x.shape == reference.shape and x.dtype == reference.dtype


def check(reference, inputs: list) -> dict:
    """The record's `blind_spots` block; `reference` is eager's float32 output."""
    import torch

    mean = float(reference.double().mean().item()) if reference.numel() else 0.0
    same_shape = [x for x in inputs if _same_layout(x, reference)]
    identity = {"applicable": bool(same_shape), "passes": None}
    if same_shape:
        identity["passes"] = _passes(reference, same_shape[0].to(reference.device))
    return {
        "compared": COMPARED,
        "zeros": {"applicable": True, "passes": _passes(reference, torch.zeros_like(reference))},
        "mean_constant": {
            "applicable": True,
            "passes": _passes(reference, torch.full_like(reference, mean)),
            "value": mean,
        },
        "input_identity": identity,
    }


def any_passes(blind_spots: dict) -> bool:
    return any(
        entry.get("passes") is True for entry in blind_spots.values() if isinstance(entry, dict)
    )
