"""Protocol checks on the numerical contract itself (CPU only).

* `direction_witness`: a float32 pair for which `torch.allclose(a, b)` and
  `torch.allclose(b, a)` disagree, i.e. proof that the argument order (which tensor scales
  the relative term) decides a verdict at the study's tolerance.
* `margin_audit`: every record in the result files that holds both error ratios, whether
  its verdict would flip between the official (`|candidate|`) and the historical
  (`|reference|`) scale, and how close it came to the threshold.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Iterable, Iterator, Mapping
from fractions import Fraction
from pathlib import Path
from typing import Any

import torch

from kbfuse.checks.numerics import check_tolerance, f32_bits, f32_bits_hex, f32_from_bits
from kbfuse.errors import KbfuseError
from kbfuse.io import as_float, number_field, read_json, write_json

# Where the witness search starts, in order: 1.0 is the magnitude of the tails' outputs
# (tanh/GELU/hardtanh/clamp), 0.0 the regime where atol dominates, then every binade.
SEARCH_ANCHORS = (1.0, 0.0, *(2.0**e for e in range(-40, 41) if e != 0))
SEARCH_STEPS = 1 << 16  # consecutive float32 values of b tried per anchor
SEARCH_OFFSETS = range(-4, 5)  # ulps around float32(b + atol + rtol * b)
SEARCH_CANDIDATES = 64  # pairs per anchor confirmed one by one before moving on

MARGIN_METRIC = (
    "abs_log_ratio = |ln r|: a record's margin is whichever of its two ratios has the "
    "smaller |ln r| (ties: official); ratios of 0 or inf, or NaN, have no margin"
)
FLIP_VALUES = {
    "official_only": "max_ratio_official <= 1 < max_ratio_historical: only the official "
    "(|candidate|-scaled) predicate accepts",
    "historical_only": "max_ratio_historical <= 1 < max_ratio_official: only the historical "
    "(|reference|-scaled) predicate accepts",
}


def _witness_candidates(
    anchor: float, atol: float, rtol: float, exact_too: bool
) -> list[tuple[int, int, int]]:
    """(step, offset, a's bits) of the first few disagreeing pairs with b >= anchor, in order.

    With exact_too, the formula evaluated without rounding must give the same verdicts,
    with atol and rtol taken as doubles and as float32 alike: the pair then does not
    depend on how torch rounds its terms.
    """
    anchor_bits = f32_bits(anchor)
    steps = torch.arange(SEARCH_STEPS, dtype=torch.int64)
    b_bits = anchor_bits + steps
    b_bits = b_bits[b_bits < 0x7F800000]  # stay below +inf
    b = b_bits.to(torch.int32).view(torch.float32)
    threshold = (b.double() + atol + rtol * b.double()).to(torch.float32)
    offsets = torch.tensor(list(SEARCH_OFFSETS), dtype=torch.int64)
    a_bits = threshold.view(torch.int32).to(torch.int64)[:, None] + offsets[None, :]
    valid = (a_bits > 0) & (a_bits < 0x7F800000)
    a = a_bits.clamp(0, 0x7F7FFFFF).to(torch.int32).view(torch.float32)
    b_wide = b[:, None].expand_as(a).contiguous()
    a_b = torch.isclose(a, b_wide, atol=atol, rtol=rtol)
    b_a = torch.isclose(b_wide, a, atol=atol, rtol=rtol)
    disagree = valid & (a > b_wide) & (a_b != b_a)
    if exact_too:  # float64 stands in for exact here; the chosen pair is rechecked exactly
        diff = (a.double() - b_wide.double()).abs()
        for tol_a, tol_r in _tolerance_readings(atol, rtol):
            disagree &= (diff <= tol_a + tol_r * b_wide.double().abs()) == a_b
            disagree &= (diff <= tol_a + tol_r * a.double().abs()) == b_a
    hits = torch.nonzero(disagree)[:SEARCH_CANDIDATES].tolist()
    return [(step, int(offsets[k]), int(a_bits[step, k])) for step, k in hits]


def _torch_terms(a: float, b: float, atol: float, rtol: float) -> dict:
    """The float32 quantities torch.allclose compares, for both argument orders."""
    ta = torch.tensor([a], dtype=torch.float32)
    tb = torch.tensor([b], dtype=torch.float32)
    abs_diff = (ta - tb).abs()
    allowed_a_b = atol + (rtol * tb).abs()
    allowed_b_a = atol + (rtol * ta).abs()
    return {
        "abs_diff": float(abs_diff.item()),
        "abs_diff_bits": f32_bits_hex(abs_diff),
        "scale_a_b": abs(b),
        "scale_b_a": abs(a),
        "allowed_a_b": float(allowed_a_b.item()),
        "allowed_a_b_bits": f32_bits_hex(allowed_a_b),
        "allowed_b_a": float(allowed_b_a.item()),
        "allowed_b_a_bits": f32_bits_hex(allowed_b_a),
    }


def _tolerance_readings(atol: float, rtol: float) -> tuple[tuple[float, float], ...]:
    """(atol, rtol) as the doubles given and rounded to float32, as torch uses them."""
    as_f32 = torch.tensor([atol, rtol], dtype=torch.float32).tolist()
    return (atol, rtol), (as_f32[0], as_f32[1])


def _exact_close(x: float, y: float, atol: float, rtol: float) -> bool:
    """|x - y| <= atol + rtol * |y| in exact rational arithmetic."""
    fx, fy = Fraction(x), Fraction(y)
    return abs(fx - fy) <= Fraction(atol) + Fraction(rtol) * abs(fy)


def _exact_verdicts(a: float, b: float, atol: float, rtol: float) -> dict:
    (d_atol, d_rtol), (f_atol, f_rtol) = _tolerance_readings(atol, rtol)
    return {
        "exact_a_b": _exact_close(a, b, d_atol, d_rtol),
        "exact_b_a": _exact_close(b, a, d_atol, d_rtol),
        "exact_f32_tolerance_a_b": _exact_close(a, b, f_atol, f_rtol),
        "exact_f32_tolerance_b_a": _exact_close(b, a, f_atol, f_rtol),
    }


def _search_order(atol: float, rtol: float) -> Iterator[tuple[bool, float, tuple[int, int, int]]]:
    for exact_too in (True, False):
        for anchor in SEARCH_ANCHORS:
            for found in _witness_candidates(anchor, atol, rtol, exact_too):
                yield exact_too, anchor, found


def direction_witness(atol: float, rtol: float) -> dict:
    """A float32 pair (a, b) where torch.allclose(a, b) != torch.allclose(b, a).

    Deterministic search: for each anchor in SEARCH_ANCHORS, b runs over consecutive
    float32 values from the anchor and a over a few ulps around b + atol + rtol*b; the
    first pair (in that order) whose two verdicts differ is confirmed with torch.allclose
    on one-element CPU tensors and returned with both verdicts as torch gave them. A first
    pass only accepts pairs on which exact arithmetic agrees with torch (the argument order
    alone decides); a second pass, reached only for odd tolerances, accepts any pair.
    exact_a_b / exact_b_a record the exact-arithmetic verdicts.
    """
    check_tolerance(atol, rtol)
    if rtol == 0:
        raise KbfuseError(
            "no direction witness exists for rtol == 0: both argument orders compare "
            f"|a - b| with atol={atol!r} alone"
        )
    for exact_too, anchor, (step, offset, a_bits) in _search_order(atol, rtol):
        b_value = f32_from_bits(f32_bits(anchor) + step)
        a_value = f32_from_bits(a_bits)
        ta = torch.tensor([a_value], dtype=torch.float32)
        tb = torch.tensor([b_value], dtype=torch.float32)
        allclose_a_b = bool(torch.allclose(ta, tb, atol=atol, rtol=rtol))
        allclose_b_a = bool(torch.allclose(tb, ta, atol=atol, rtol=rtol))
        if allclose_a_b == allclose_b_a:  # isclose and allclose disagree: not a witness
            continue
        exact = _exact_verdicts(a_value, b_value, atol, rtol)
        exact_agrees = (
            exact["exact_a_b"] == exact["exact_f32_tolerance_a_b"] == allclose_a_b
            and exact["exact_b_a"] == exact["exact_f32_tolerance_b_a"] == allclose_b_a
        )
        if exact_too and not exact_agrees:
            continue  # float64 screening was not exact enough: keep searching
        return {
            "kind": "direction_witness",
            "schema_version": 1,
            "atol": atol,
            "rtol": rtol,
            "torch": torch.__version__,
            "a": a_value,
            "a_bits": f32_bits_hex(ta),
            "b": b_value,
            "b_bits": f32_bits_hex(tb),
            "allclose_a_b": allclose_a_b,
            "allclose_b_a": allclose_b_a,
            "call_a_b": f"torch.allclose(a, b, atol={atol!r}, rtol={rtol!r})",
            "call_b_a": f"torch.allclose(b, a, atol={atol!r}, rtol={rtol!r})",
            **_torch_terms(a_value, b_value, atol, rtol),
            **exact,
            "reading": (
                "torch.allclose(input, other) accepts |input - other| <= atol + rtol*|other| "
                "(float32 arithmetic). With reference=a and candidate=b the official predicate "
                "gives allclose_a_b; scaling by |reference| instead (historical) gives "
                "allclose_b_a."
            ),
            "search": {
                "exact_agreement_required": exact_too,
                "anchor": anchor,
                "anchor_bits": f32_bits_hex(anchor),
                "step": step,
                "offset_ulps": offset,
            },
        }
    raise KbfuseError(
        f"no direction witness found for atol={atol!r}, rtol={rtol!r} "
        f"({len(SEARCH_ANCHORS)} anchors x {SEARCH_STEPS} values of b searched)"
    )


def write_direction_witness(atol: float, rtol: float, out: str | os.PathLike) -> dict:
    record = direction_witness(atol, rtol)
    write_json(out, record)
    return record


_PLAIN_KEY = re.compile(r"^[A-Za-z0-9_-]+$")


def _child_path(parent: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{parent}[{key}]"
    if not _PLAIN_KEY.match(key):
        return f"{parent}[{json.dumps(key)}]"
    return f"{parent}.{key}" if parent else key


def _ratio_records(node: Any, path: str = "") -> Iterator[tuple[str, Mapping]]:
    """(JSON path, dict) for every dict holding both ratio keys, in document order."""
    if isinstance(node, Mapping):
        if "max_ratio_official" in node and "max_ratio_historical" in node:
            yield path or "$", node
        for key, value in node.items():
            yield from _ratio_records(value, _child_path(path, str(key)))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from _ratio_records(value, _child_path(path, index))


def _ratio(record: Mapping, key: str, file: str, path: str) -> float:
    return number_field(record[key], f"{file}: {path}.{key}")


def _margin(official: float, historical: float) -> dict | None:
    best = None
    for predicate, ratio in (("official", official), ("historical", historical)):
        if not (math.isfinite(ratio) and ratio > 0):
            continue
        distance = abs(math.log(ratio))
        if best is None or distance < best["abs_log_ratio"]:
            best = {"predicate": predicate, "ratio": ratio, "abs_log_ratio": distance}
    return best


def _flip(official: float, historical: float) -> str | None:
    if official <= 1 < historical:
        return "official_only"
    if historical <= 1 < official:
        return "historical_only"
    return None


def _expand(paths: Iterable[str | os.PathLike]) -> list[Path]:
    if isinstance(paths, str | os.PathLike):
        paths = [paths]
    files: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            found = sorted(path.rglob("*.json"))
        elif path.is_file():
            found = [path]
        else:
            raise KbfuseError(f"margin audit: result file not found: {path}")
        files.extend(f for f in found if f not in files)
    return files


def _check_audit_tolerance(tolerance: Mapping | None) -> dict | None:
    if tolerance is None:
        return None
    if not isinstance(tolerance, Mapping) or not {"atol", "rtol"} <= set(tolerance):
        raise KbfuseError(f"margin audit tolerance must hold atol and rtol, got {tolerance!r}")
    check_tolerance(tolerance["atol"], tolerance["rtol"])
    return {"atol": float(tolerance["atol"]), "rtol": float(tolerance["rtol"])}


def _file_tolerance(data: Any, file: str) -> dict | None:
    tol = data.get("tolerance") if isinstance(data, Mapping) else None
    if not (isinstance(tol, Mapping) and "atol" in tol and "rtol" in tol):
        return None
    try:
        return {"atol": as_float(tol["atol"]), "rtol": as_float(tol["rtol"])}
    except (KeyError, TypeError, ValueError):
        raise KbfuseError(f"{file}: tolerance is not numeric: {tol!r}") from None


def margin_audit(paths: Iterable[str | os.PathLike], tolerance: Mapping | None = None) -> dict:
    """Audit every ratio-holding record in the given result files (directories: *.json).

    A record is a "case" when it has a name (a case record) and an "aggregate" otherwise
    (a summary block). A record flips when one ratio is <= 1 and the other > 1 (see
    FLIP_VALUES); totals.closest_margin is taken over the cases (over aggregates only when
    there are no cases). Ratios are those the files hold: a record's verdict under a
    predicate is ratio <= 1, which numerics.compare makes exact. With
    `tolerance`, files that state a different top-level tolerance are listed in
    totals.tolerance_mismatches (their ratios are relative to their own tolerance).
    """
    expected = _check_audit_tolerance(tolerance)
    files, records = [], []
    for path in _expand(paths):
        file = str(path)
        try:
            data = read_json(path)
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise KbfuseError(f"margin audit: cannot read {file} as JSON: {exc}") from None
        file_tol = _file_tolerance(data, file)
        # An earlier audit holds both ratio keys in every entry: never audit it again.
        is_audit = isinstance(data, Mapping) and data.get("kind") == "margin_audit"
        found = [] if is_audit else list(_ratio_records(data))
        for json_path, record in found:
            official = _ratio(record, "max_ratio_official", file, json_path)
            historical = _ratio(record, "max_ratio_historical", file, json_path)
            flip = _flip(official, historical)
            records.append(
                {
                    "file": file,
                    "path": json_path,
                    "record": "case" if "name" in record else "aggregate",
                    "name": record.get("name"),
                    "group": record.get("group"),
                    "max_ratio_official": official,
                    "max_ratio_historical": historical,
                    "official_within": official <= 1,
                    "historical_within": historical <= 1,
                    "flips": flip is not None,
                    "flip": flip,
                    "margin": _margin(official, historical),
                }
            )
        files.append(
            {
                "file": file,
                "kind": data.get("kind") if isinstance(data, Mapping) else None,
                "skipped": "an earlier margin audit" if is_audit else None,
                "records": len(found),
                "cases": sum("name" in r for _, r in found),
                "tolerance": file_tol,
                "tolerance_matches": None
                if expected is None or file_tol is None
                else file_tol == expected,
            }
        )
    return {
        "kind": "margin_audit",
        "schema_version": 1,
        "tolerance": expected,
        "margin_metric": MARGIN_METRIC,
        "flip_values": FLIP_VALUES,
        "files": files,
        "cases": records,
        "totals": _totals(files, records),
    }


def _totals(files: list[dict], records: list[dict]) -> dict:
    cases = [r for r in records if r["record"] == "case"]
    aggregates = [r for r in records if r["record"] == "aggregate"]
    closest = None
    # Aggregates repeat their cases' maxima: they stand in only when no case was found.
    for r in cases or aggregates:
        m = r["margin"]
        if m is not None and (closest is None or m["abs_log_ratio"] < closest["abs_log_ratio"]):
            closest = {"file": r["file"], "path": r["path"], "name": r["name"], **m}
    return {
        "files": len(files),
        "files_with_records": sum(f["records"] > 0 for f in files),
        "records": len(records),
        "cases": len(cases),
        "aggregates": len(aggregates),
        "flips": sum(r["flips"] for r in cases),
        "aggregate_flips": sum(r["flips"] for r in aggregates),
        "flipping_cases": [
            {"file": r["file"], "path": r["path"], "name": r["name"], "flip": r["flip"]}
            for r in cases
            if r["flips"]
        ],
        "closest_margin": closest,
        "tolerance_mismatches": [f["file"] for f in files if f["tolerance_matches"] is False],
    }


def write_margin_audit(
    paths: Iterable[str | os.PathLike],
    out: str | os.PathLike,
    tolerance: Mapping | None = None,
) -> dict:
    audit = margin_audit(paths, tolerance)
    write_json(out, audit)
    return audit
