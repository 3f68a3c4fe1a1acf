"""torch's process-wide switches that decide a run's numerics or its algorithms, read by name.

A candidate file may set them at import or in its Model (`torch.backends.cudnn.benchmark =
True` is common in published kernels, TF32 less so). They hold for the whole process: the
candidate's calls and the baselines timed beside it in the same process run under them, the
reference (a process of its own) does not. The candidate's process reads them before the
import (the check's numerics mode in force), after the build and right before the timing;
`changes` names what differs, which the verdict reports as the finding `switches_changed`.

Each switch is read on its own: PyTorch refuses to read a legacy TF32 switch (`allow_tf32`,
`get_float32_matmul_precision`) once the new API (`fp32_precision`) has set it, and that
refusal is recorded as the switch's value.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

POINTS = ("before_import", "after_build", "at_timing")
_WHEN = {"after_build": "at build", "at_timing": "at timing"}


def _readers(torch) -> dict[str, Callable[[], Any]]:
    backends = torch.backends
    matmul, cudnn = backends.cuda.matmul, backends.cudnn
    return {
        "cuda.matmul.allow_tf32": lambda: matmul.allow_tf32,
        "cuda.matmul.fp32_precision": lambda: matmul.fp32_precision,
        "cuda.matmul.allow_fp16_reduced_precision_reduction": (
            lambda: matmul.allow_fp16_reduced_precision_reduction
        ),
        "cuda.matmul.allow_bf16_reduced_precision_reduction": (
            lambda: matmul.allow_bf16_reduced_precision_reduction
        ),
        "float32_matmul_precision": torch.get_float32_matmul_precision,
        "cudnn.enabled": lambda: cudnn.enabled,
        "cudnn.allow_tf32": lambda: cudnn.allow_tf32,
        "cudnn.conv.fp32_precision": lambda: cudnn.conv.fp32_precision,
        "cudnn.benchmark": lambda: cudnn.benchmark,
        "cudnn.deterministic": lambda: cudnn.deterministic,
        "deterministic_algorithms": torch.are_deterministic_algorithms_enabled,
    }


def _value(read: Callable[[], Any]) -> bool | str | int | None:
    try:
        value = read()
    except Exception as exc:  # noqa: BLE001 - a refusal to read is the switch's state
        return f"unreadable ({type(exc).__name__})"
    return value if isinstance(value, bool | str | int) or value is None else repr(value)


def read() -> dict[str, bool | str | int | None]:
    """Each switch's value now (see the module docstring)."""
    import torch

    return {name: _value(reader) for name, reader in _readers(torch).items()}


def changes(readings: Mapping[str, Mapping] | None) -> list[str]:
    """What differs from `before_import` at the later points of `readings` (runner.json's
    `switches`), one line per switch at the first point it differs: `cudnn.benchmark: False
    -> True (at build)`, by point and then by name. Empty when nothing changed or nothing was
    read before the import."""
    if not readings or "before_import" not in readings:
        return []
    before = readings["before_import"]
    found: dict[str, str] = {}
    for point in POINTS[1:]:
        for name, value in sorted((readings.get(point) or {}).items()):
            if name not in found and before.get(name) != value:
                found[name] = f"{name}: {before.get(name)} -> {value} ({_WHEN[point]})"
    return list(found.values())
