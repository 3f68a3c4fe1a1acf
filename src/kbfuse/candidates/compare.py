"""Comparing a candidate's outputs with the reference's, in the parent process.

Both sides' tensors are read with `torch.load(weights_only=True)` and compared on the device
the check ran on (the pinned evaluator compares its outputs on the GPU; a GPU also compares a
case of hundreds of MB in milliseconds, where the CPU took seconds per case, minutes per check
beside other checks). Per case: the official predicate (kbfuse.checks.official.passes:
`torch.allclose` with the pinned KernelBench's tolerance and argument order, from its
kernelbench_contract), the number of bit-identical elements, the largest absolute error and
the largest error in units in the last place (ULPs: the distance between the two float32
values along the ordered float32 line; 0 for bit-identical, 1 for adjacent floats; NaN
against a number counts as 2^32).

`cached_calls` finds the caching signature: two calls of one model instance whose outputs are
bit-identical while the reference outputs of the same two cases differ (compared through
`fingerprint`s, so that the parent holds one case's tensors at a time).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence

import torch

from kbfuse.checks import official

NAN_ULPS = 2**32


def ordered_bits(t: torch.Tensor) -> torch.Tensor:
    """float32 -> int64 that orders like the floats (-0.0 and +0.0 both map to 0)."""
    bits = t.contiguous().view(torch.int32).to(torch.int64)
    return torch.where(bits < 0, -(bits & 0x7FFFFFFF), bits)


def max_ulps(reference: torch.Tensor, candidate: torch.Tensor) -> int:
    if reference.numel() == 0:
        return 0
    distance = (ordered_bits(reference) - ordered_bits(candidate)).abs()
    either_nan = torch.isnan(reference) | torch.isnan(candidate)
    both_nan = torch.isnan(reference) & torch.isnan(candidate)
    distance = torch.where(either_nan & ~both_nan, torch.full_like(distance, NAN_ULPS), distance)
    distance = torch.where(both_nan, torch.zeros_like(distance), distance)
    return int(distance.max().item())


def compare_case(reference, candidate, contract: Mapping, device: str = "cpu") -> dict:
    """The case record: problem (None when comparable), pass, bits, errors; computed on
    `device`."""
    base = {"numel": int(reference.numel()) if isinstance(reference, torch.Tensor) else 0}
    if not isinstance(candidate, torch.Tensor):
        return {**base, "problem": f"output is {type(candidate).__name__}", "official_pass": False}
    if candidate.shape != reference.shape:
        problem = f"shape {list(candidate.shape)}, expected {list(reference.shape)}"
        return {**base, "problem": problem, "official_pass": False}
    if candidate.dtype != torch.float32 or reference.dtype != torch.float32:
        problem = f"dtype {candidate.dtype}, expected {reference.dtype}"
        return {**base, "problem": problem, "official_pass": False}
    ref, cand = reference.to(device).contiguous(), candidate.to(device).contiguous()
    bit_equal = int((ref.view(torch.int32) == cand.view(torch.int32)).sum().item())
    diff = (ref.double() - cand.double()).abs()
    finite = diff[torch.isfinite(diff)]
    return {
        **base,
        "problem": None,
        "official_pass": official.passes(ref, cand, contract),
        "bit_equal": bit_equal,
        "bit_identical": bit_equal == ref.numel(),
        "max_abs": float(finite.max().item()) if finite.numel() else 0.0,
        "max_ulps": max_ulps(ref, cand),
        "nonfinite_candidate": int((~torch.isfinite(cand)).sum().item()),
    }


def fingerprint(value) -> str | None:
    """sha256 of a tensor's dtype, shape and bytes; None for anything else. Two outputs are
    bit-identical when their fingerprints are equal, so the parent keeps 64 characters per
    case instead of its tensors."""
    if not isinstance(value, torch.Tensor):
        return None
    digest = hashlib.sha256(f"{value.dtype} {list(value.shape)}".encode())
    digest.update(memoryview(value.detach().cpu().contiguous().view(torch.uint8).numpy()))
    return digest.hexdigest()


def cached_calls(
    cases: Sequence[Mapping], references: Mapping[str, str | None], outputs: Mapping
) -> list[list[str]]:
    """Pairs of cases of one instance whose candidate outputs are bit-identical while their
    references are not (`fingerprint`s of both sides, by case name)."""
    pairs = []
    by_instance: dict[str, list[str]] = {}
    for case in cases:
        if case["name"] in outputs:
            by_instance.setdefault(case["instance"], []).append(case["name"])
    for names in by_instance.values():
        for i, first in enumerate(names):
            for second in names[i + 1 :]:
                same_output = outputs[first] is not None and outputs[first] == outputs[second]
                if same_output and references[first] != references[second]:
                    pairs.append([first, second])
    return pairs
