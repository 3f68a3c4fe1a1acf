"""The numerical contract: closeness predicates, bit counts and the per-case record.

`torch.allclose(input, other)` tests `|input - other| <= atol + rtol * |other|` *in the
tensors' dtype*: for float32 the error, the product `rtol * other` and the sum with `atol`
are each rounded to float32. The official predicate (reference first, candidate second) is
therefore delegated to torch itself, and the error ratios are built from the same float32
quantities torch compares, divided in float64. This makes `ratio <= 1` (with no non-finite
mismatch) hold exactly when torch says "close", also at the rounding boundary, where an
exact float64 evaluation of the formula disagrees with torch for a few elements in 10^4.

The historical predicate is the same with the roles swapped (`|reference|` scales the
relative term); `|a - b|` and `a == b` are symmetric in IEEE arithmetic, so it equals
`torch.allclose(candidate, reference)` exactly.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Iterable, Mapping
from numbers import Real

import torch

from kbfuse.errors import KbfuseError
from kbfuse.io import number_field

CASE_RECORD_KEYS = (
    "name",
    "group",
    "elements",
    "bit_equal",
    "bit_equal_fraction",
    "official_pass",
    "historical_pass",
    "equal_nan_pass",
    "max_abs_diff",
    "max_ratio_official",
    "max_ratio_historical",
    "nonfinite_reference",
    "nonfinite_candidate",
    "nonfinite_mismatch",
)

SCALES = ("candidate", "reference")


def check_tolerance(atol: float, rtol: float) -> None:
    """KbfuseError unless atol and rtol are finite real numbers >= 0 (as torch requires)."""
    for key, value in (("atol", atol), ("rtol", rtol)):
        if isinstance(value, bool) or not isinstance(value, Real):
            raise KbfuseError(f"tolerance {key} must be a real number, got {value!r}")
        if not math.isfinite(value) or value < 0:
            raise KbfuseError(f"tolerance {key} must be finite and >= 0, got {value!r}")


def _check_pair(reference: torch.Tensor, candidate: torch.Tensor) -> None:
    for label, t in (("reference", reference), ("candidate", candidate)):
        if not isinstance(t, torch.Tensor):
            raise KbfuseError(f"{label} must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype != torch.float32:
            raise KbfuseError(f"{label} must be float32, got {t.dtype}")
    if reference.shape != candidate.shape:
        raise KbfuseError(
            f"shape mismatch: reference {tuple(reference.shape)} "
            f"vs candidate {tuple(candidate.shape)}"
        )
    if reference.device != candidate.device:
        raise KbfuseError(
            f"device mismatch: reference on {reference.device}, candidate on {candidate.device}"
        )


def _allclose(
    reference: torch.Tensor,
    candidate: torch.Tensor,
    atol: float,
    rtol: float,
    scaled_by_reference: bool,
) -> bool:
    """`torch.allclose(input, other)` holds where |input - other| <= atol + rtol * |other|: its
    second argument scales the relative term, so the argument order decides the predicate."""
    _check_pair(reference, candidate)
    check_tolerance(atol, rtol)
    first, second = (candidate, reference) if scaled_by_reference else (reference, candidate)
    with torch.no_grad():
        return bool(torch.allclose(first, second, atol=atol, rtol=rtol))


def official_allclose(
    reference: torch.Tensor, candidate: torch.Tensor, atol: float, rtol: float
) -> bool:
    """The pinned KernelBench predicate: `torch.allclose(reference, candidate, atol, rtol)`
    (`|candidate|` scales the relative term)."""
    return _allclose(reference, candidate, atol, rtol, scaled_by_reference=False)


def historical_allclose(
    reference: torch.Tensor, candidate: torch.Tensor, atol: float, rtol: float
) -> bool:
    """Same as official with `|reference|` scaling the relative term:
    `torch.allclose(candidate, reference, atol, rtol)`."""
    return _allclose(reference, candidate, atol, rtol, scaled_by_reference=True)


def _nonfinite_masks(
    reference: torch.Tensor, candidate: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(positions where either value is non-finite, those among them not matched exactly).

    Matched: NaN with NaN (any payload), +inf with +inf, -inf with -inf.
    """
    nonfinite = ~(torch.isfinite(reference) & torch.isfinite(candidate))
    matched = (torch.isnan(reference) & torch.isnan(candidate)) | (reference == candidate)
    return nonfinite, nonfinite & ~matched


def equal_nan_stress(reference: torch.Tensor, candidate: torch.Tensor) -> bool:
    """Non-finite positions match exactly (NaN with NaN, inf with same-sign inf).

    A separate stress check: finite values are not looked at, and the result is never
    merged into the official pass.
    """
    _check_pair(reference, candidate)
    with torch.no_grad():
        _, mismatch = _nonfinite_masks(reference, candidate)
        return not bool(mismatch.any())


def bit_equal_count(a: torch.Tensor, b: torch.Tensor) -> int:
    """Number of positions whose 32-bit patterns are identical (so 0.0 != -0.0)."""
    _check_pair(a, b)
    with torch.no_grad():
        return int((a.view(torch.int32) == b.view(torch.int32)).sum().item())


def error_ratio_map(
    reference: torch.Tensor,
    candidate: torch.Tensor,
    atol: float,
    rtol: float,
    scale: str = "candidate",
) -> torch.Tensor:
    """Per-element float64 ratio |ref - cand| / (atol + rtol * |scale|), torch's float32 terms.

    scale="candidate" is the official predicate, "reference" the historical one. Element i
    is close under the predicate exactly when ratio[i] <= 1: equal values (equal infinities
    included) give 0; NaN anywhere, an unmatched non-finite value, or a difference that
    overflows float32 give inf.
    """
    _check_pair(reference, candidate)
    check_tolerance(atol, rtol)
    if scale not in SCALES:
        raise KbfuseError(f"scale must be one of {SCALES}, got {scale!r}")
    scale_tensor = candidate if scale == "candidate" else reference
    with torch.no_grad():
        # The same operations, in the same order and dtype, as ATen's isclose.
        allowed = atol + (rtol * scale_tensor).abs()
        actual = (reference - candidate).abs()
        ratio = actual.double() / allowed.double()
        ratio = torch.where(actual == 0, torch.zeros_like(ratio), ratio)
        ratio = torch.where(torch.isinf(actual), torch.full_like(ratio, math.inf), ratio)
        nonfinite, _ = _nonfinite_masks(reference, candidate)
        equal = reference == candidate  # false for NaN
        nonfinite_ratio = torch.where(
            equal, torch.zeros_like(ratio), torch.full_like(ratio, math.inf)
        )
        return torch.where(nonfinite, nonfinite_ratio, ratio)


def _max_or_zero(t: torch.Tensor) -> float:
    return float(t.max().item()) if t.numel() else 0.0


def error_ratios(
    reference: torch.Tensor, candidate: torch.Tensor, atol: float, rtol: float
) -> tuple[float, float]:
    """(max_ratio_official, max_ratio_historical); see `error_ratio_map`."""
    official = error_ratio_map(reference, candidate, atol, rtol, scale="candidate")
    historical = error_ratio_map(reference, candidate, atol, rtol, scale="reference")
    return _max_or_zero(official), _max_or_zero(historical)


def f32_bits(x: float | torch.Tensor) -> int:
    """Unsigned 32-bit pattern of x as float32 (a Python number is rounded to nearest)."""
    if isinstance(x, torch.Tensor):
        if x.dtype != torch.float32 or x.numel() != 1:
            raise KbfuseError(f"f32_bits needs a one-element float32 tensor, got {x.dtype} {x}")
        t = x.detach().reshape(1).cpu()
    else:
        if isinstance(x, bool) or not isinstance(x, Real):
            raise KbfuseError(f"f32_bits needs a real number, got {x!r}")
        t = torch.tensor([float(x)], dtype=torch.float32)
    return int(t.view(torch.int32).item()) & 0xFFFFFFFF


def f32_bits_hex(x: float | torch.Tensor) -> str:
    """'0x%08x' of the float32 pattern of x."""
    return f"0x{f32_bits(x):08x}"


def f32_from_bits(bits: int | str) -> float:
    """The float32 value with the given pattern (int or '0x...' string), as a Python float."""
    if isinstance(bits, str):
        try:
            value = int(bits, 16)
        except ValueError:
            raise KbfuseError(f"not a hexadecimal float32 pattern: {bits!r}") from None
    elif isinstance(bits, int) and not isinstance(bits, bool):
        value = bits
    else:
        raise KbfuseError(f"float32 bits must be an int or a hex string, got {bits!r}")
    if not 0 <= value <= 0xFFFFFFFF:
        raise KbfuseError(f"float32 bits out of range: {bits!r}")
    return struct.unpack("<f", struct.pack("<I", value))[0]


def compare(
    reference: torch.Tensor,
    candidate: torch.Tensor,
    atol: float,
    rtol: float,
    name: str,
    group: str,
) -> dict:
    """The case record of docs/contracts.md for one reference/candidate pair."""
    _check_pair(reference, candidate)
    check_tolerance(atol, rtol)
    with torch.no_grad():
        elements = reference.numel()
        nonfinite, mismatch = _nonfinite_masks(reference, candidate)
        finite = ~nonfinite
        abs_diff = (reference[finite].double() - candidate[finite].double()).abs()
        max_ratio_official, max_ratio_historical = error_ratios(reference, candidate, atol, rtol)
        bit_equal = bit_equal_count(reference, candidate)
        return {
            "name": name,
            "group": group,
            "elements": int(elements),
            "bit_equal": bit_equal,
            "bit_equal_fraction": bit_equal / elements if elements else 1.0,
            "official_pass": official_allclose(reference, candidate, atol, rtol),
            "historical_pass": historical_allclose(reference, candidate, atol, rtol),
            "equal_nan_pass": not bool(mismatch.any()),
            "max_abs_diff": _max_or_zero(abs_diff),
            "max_ratio_official": max_ratio_official,
            "max_ratio_historical": max_ratio_historical,
            "nonfinite_reference": int((~torch.isfinite(reference)).sum().item()),
            "nonfinite_candidate": int((~torch.isfinite(candidate)).sum().item()),
            "nonfinite_mismatch": int(mismatch.sum().item()),
        }


def _case_field(case: Mapping, key: str, index: int):
    if not isinstance(case, Mapping):
        raise KbfuseError(f"case {index} is not a dict: {case!r}")
    if key not in case:
        raise KbfuseError(f"case {index} ({case.get('name', '?')}) lacks key {key!r}")
    return case[key]


def _case_int(case: Mapping, key: str, index: int) -> int:
    value = _case_field(case, key, index)
    if isinstance(value, bool) or not isinstance(value, int):
        raise KbfuseError(f"case {index} key {key!r} must be an integer, got {value!r}")
    return value


def _case_bool(case: Mapping, key: str, index: int) -> bool:
    value = _case_field(case, key, index)
    if not isinstance(value, bool):
        raise KbfuseError(f"case {index} key {key!r} must be a bool, got {value!r}")
    return value


def _case_float(case: Mapping, key: str, index: int) -> float:
    return number_field(_case_field(case, key, index), f"case {index} key {key!r}")


def _max_float(values: Iterable[float]) -> float:
    """max() that returns NaN when any value is NaN (built-in max depends on the order)."""
    values = list(values)
    return math.nan if any(math.isnan(v) for v in values) else max(values)


def summarize_cases(cases: Iterable[Mapping]) -> dict:
    """The `summary` block of a correctness result: integer counts and maxima over cases.

    Accepts records straight from `compare` or read back from JSON ("inf" strings).
    """
    cases = list(cases)
    if not cases:
        raise KbfuseError("summarize_cases: no cases to summarize")
    elements = [_case_int(c, "elements", i) for i, c in enumerate(cases)]
    bit_equal = [_case_int(c, "bit_equal", i) for i, c in enumerate(cases)]
    return {
        "cases": len(cases),
        "official_passes": sum(_case_bool(c, "official_pass", i) for i, c in enumerate(cases)),
        "bit_identical_cases": sum(b == e for b, e in zip(bit_equal, elements, strict=True)),
        "elements": sum(elements),
        "elements_bit_equal": sum(bit_equal),
        "max_abs_diff": _max_float(_case_float(c, "max_abs_diff", i) for i, c in enumerate(cases)),
        "max_ratio_official": _max_float(
            _case_float(c, "max_ratio_official", i) for i, c in enumerate(cases)
        ),
        "max_ratio_historical": _max_float(
            _case_float(c, "max_ratio_historical", i) for i, c in enumerate(cases)
        ),
        "equal_nan_passes": sum(_case_bool(c, "equal_nan_pass", i) for i, c in enumerate(cases)),
    }
