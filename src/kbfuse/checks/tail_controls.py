"""The tail-control inputs of the correctness stage: values where the tail's bits are decided.

Each control is a (CONTROL_ROWS, out_features) float32 tensor fed to the tail alone: the
tail's clamp bounds and their float32 neighbours (`Tail.bound_values`), signed zeros,
subnormals and tiny normals (where flush-to-zero decides the bits), large magnitudes (where
exp() saturates or gives subnormals), and non-finite values mixed with finite ones. Every
control has the same shape, so a compiled tail sees only two shapes (the linear output and
this one) and recompiles once.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

from kbfuse.checks.numerics import f32_from_bits
from kbfuse.errors import KbfuseError
from kbfuse.tasks.tails import Tail

CONTROL_ROWS = 64


def _f32(x: float) -> float:
    return float(np.float32(x))


def tiny_values() -> list[float]:
    """Signed zeros, subnormals (smallest, largest, between) and small normal values."""
    smallest_subnormal = f32_from_bits(0x00000001)
    largest_subnormal = f32_from_bits(0x007FFFFF)
    smallest_normal = f32_from_bits(0x00800000)
    magnitudes = [
        smallest_subnormal,
        _f32(1e-42),
        _f32(1e-40),
        largest_subnormal,
        smallest_normal,
        _f32(1e-37),
        _f32(1e-30),
        _f32(1e-20),
        _f32(1e-10),
        _f32(1e-7),
    ]
    return [0.0, -0.0] + [s * m for m in magnitudes for s in (1.0, -1.0)]


def large_values() -> list[float]:
    """Large magnitudes: where exp() in sigmoid/erf saturates or gives subnormal results."""
    float32_max = f32_from_bits(0x7F7FFFFF)
    magnitudes = [8.0, 10.0, 20.0, 87.5, 88.0, 88.5, 89.0, 100.0, 1e10, 1e30, float32_max]
    return [s * m for m in magnitudes for s in (1.0, -1.0)]


# Non-finite values between finite ones; -inf and NaN give NaN through swish (-inf * 0).
NONFINITE_PATTERN = (math.inf, 1.0, -math.inf, -0.5, math.nan, 0.25, -88.0, 2.5, 0.0, -3.0, -0.0)


def value_rows(values: Sequence[float], cols: int, rows: int = CONTROL_ROWS) -> torch.Tensor:
    """(rows, cols) float32 CPU tensor; row i holds values[i % len(values)] in every column."""
    if not values or len(values) > rows:
        raise KbfuseError(f"need 1..{rows} control values, got {len(values)}")
    column = torch.tensor([values[i % len(values)] for i in range(rows)], dtype=torch.float32)
    return column[:, None].expand(rows, cols).contiguous()


def mixed_rows(pattern: Sequence[float], cols: int, rows: int = CONTROL_ROWS) -> torch.Tensor:
    """(rows, cols) float32 CPU tensor; element (i, j) = pattern[(i + j) % len(pattern)]."""
    values = torch.tensor(list(pattern), dtype=torch.float32)
    index = (torch.arange(rows)[:, None] + torch.arange(cols)[None, :]) % len(pattern)
    return values[index].contiguous()


def control_inputs(tail: Tail, model, cols: int) -> dict[str, torch.Tensor]:
    """The tail-control inputs (CPU tensors, CONTROL_ROWS x cols) by case name."""
    return {
        "tail/bounds": value_rows(tail.bound_values(model), cols),
        "tail/zeros_tiny": value_rows(tiny_values(), cols),
        "tail/large": value_rows(large_values(), cols),
        "tail/nonfinite": mixed_rows(NONFINITE_PATTERN, cols),
    }
