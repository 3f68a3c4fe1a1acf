"""Is the task's reference deterministic? Eager run twice under one seed, once under another.

The inputs stay the same; only the RNG seed set before `forward` changes. A reference that
differs between two runs under the same seed (atomics, nondeterministic algorithms) or that
follows the seed (Dropout in training mode) is `nondeterministic`: its baselines' correctness
can only be judged against eager under the same seed, and the record says so.
"""

from __future__ import annotations

from collections.abc import Callable


def same_bits(a, b) -> bool:
    """Identical shape, dtype and bit patterns (so 0.0 != -0.0 and NaN payloads count)."""
    import torch

    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
        return False
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.is_complex():  # its real and imaginary parts, bit for bit
        a, b = torch.view_as_real(a.contiguous()), torch.view_as_real(b.contiguous())
    if a.dtype.is_floating_point:  # float8 too: 0.0 != -0.0 and a NaN equals its own copy
        view = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
        return bool(torch.equal(a.contiguous().view(view), b.contiguous().view(view)))
    return bool(torch.equal(a, b))


def seeded_call(run: Callable[[], object], seed: int):
    import torch

    torch.manual_seed(seed)
    with torch.no_grad():
        return run()


def check(run: Callable[[], object], seed: int) -> dict:
    """The record's `determinism` block for the zero-argument forward `run`."""
    first = seeded_call(run, seed)
    again = seeded_call(run, seed)
    other = seeded_call(run, seed + 1)
    same_seed = same_bits(first, again)
    different_seed = same_bits(first, other)
    return {
        "same_seed_equal": same_seed,
        "different_seed_equal": different_seed,
        "verdict": "deterministic" if same_seed and different_seed else "nondeterministic",
    }
