"""Direction witness and margin audit."""

from __future__ import annotations

import json
import math

import pytest
import torch

from kbfuse.checks.numerics import compare, f32_from_bits, summarize_cases
from kbfuse.checks.protocol import (
    direction_witness,
    margin_audit,
    write_direction_witness,
    write_margin_audit,
)
from kbfuse.errors import KbfuseError
from kbfuse.io import read_json, write_json


def t32(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32)


@pytest.mark.parametrize(
    ("atol", "rtol"), [(1e-4, 1e-4), (1e-5, 1e-3), (0.0, 1e-4), (1e-2, 0.5), (1e-4, 1e-7)]
)
def test_direction_witness_disagrees_under_torch(atol, rtol):
    w = direction_witness(atol, rtol)
    assert w["kind"] == "direction_witness" and (w["atol"], w["rtol"]) == (atol, rtol)
    assert f32_from_bits(w["a_bits"]) == w["a"] and f32_from_bits(w["b_bits"]) == w["b"]
    a, b = t32([w["a"]]), t32([w["b"]])
    assert bool(torch.allclose(a, b, atol=atol, rtol=rtol)) is w["allclose_a_b"]
    assert bool(torch.allclose(b, a, atol=atol, rtol=rtol)) is w["allclose_b_a"]
    assert w["allclose_a_b"] is not w["allclose_b_a"]
    # Exact arithmetic agrees with torch: the argument order alone decides.
    assert w["search"]["exact_agreement_required"] is True
    assert w["exact_a_b"] is w["exact_f32_tolerance_a_b"] is w["allclose_a_b"]
    assert w["exact_b_a"] is w["exact_f32_tolerance_b_a"] is w["allclose_b_a"]
    # The allowed errors are the two scales torch used.
    assert w["scale_a_b"] == abs(w["b"]) and w["scale_b_a"] == abs(w["a"])
    assert (w["abs_diff"] <= w["allowed_a_b"]) is w["allclose_a_b"]
    assert (w["abs_diff"] <= w["allowed_b_a"]) is w["allclose_b_a"]


def test_direction_witness_at_study_tolerance_is_deterministic_and_near_one():
    w = direction_witness(1e-4, 1e-4)
    assert w == direction_witness(1e-4, 1e-4)
    assert (w["a_bits"], w["b_bits"]) == ("0x3f800ae1", "0x3f800453")
    assert w["allclose_a_b"] is False and w["allclose_b_a"] is True
    assert w["search"]["anchor"] == 1.0
    # As a case: reference=a, candidate=b fails official and passes historical.
    case = compare(t32([w["a"]]), t32([w["b"]]), 1e-4, 1e-4, "witness", "protocol")
    assert case["official_pass"] is False and case["historical_pass"] is True


def test_direction_witness_errors():
    with pytest.raises(KbfuseError, match="rtol == 0"):
        direction_witness(1e-4, 0.0)
    with pytest.raises(KbfuseError, match="atol"):
        direction_witness(-1.0, 1e-4)


def test_write_direction_witness(tmp_path):
    out = tmp_path / "protocol" / "direction_witness.json"
    record = write_direction_witness(1e-4, 1e-4, out)
    assert read_json(out) == json.loads(json.dumps(record))
    assert read_json(out)["a_bits"] == "0x3f800ae1"


def _correctness_file(cases: list[dict], tolerance=(1e-4, 1e-4)) -> dict:
    return {
        "kind": "correctness",
        "schema_version": 1,
        "tolerance": {"atol": tolerance[0], "rtol": tolerance[1]},
        "cases": cases,
        "summary": summarize_cases(cases),
    }


@pytest.fixture
def result_dir(tmp_path):
    same = compare(t32([1.0, 2.0]), t32([1.0, 2.0]), 1e-4, 1e-4, "same", "full_program")
    near = compare(t32([0.5]), t32([0.50012]), 1e-4, 1e-4, "near", "full_program")
    # The witness pair: official > 1, historical <= 1.
    flip = compare(
        t32([f32_from_bits(0x3F800AE1)]), t32([f32_from_bits(0x3F800453)]), 1e-4, 1e-4, "flip", "g"
    )
    nan = compare(t32([math.nan]), t32([math.nan]), 1e-4, 1e-4, "nan", "tail_control")
    write_json(tmp_path / "correctness" / "81" / "v.json", _correctness_file([same, near, flip]))
    write_json(
        tmp_path / "controls" / "81.json",
        {"kind": "controls", "tiny_values": {"v-1": {"cases": [nan]}}},
    )
    write_json(tmp_path / "env" / "fingerprint.json", {"kind": "env", "gpu": {"name": "x"}})
    write_json(
        tmp_path / "correctness" / "53" / "v.json", _correctness_file([same], tolerance=(1e-3, 0))
    )
    return tmp_path


def test_margin_audit_finds_cases_flips_and_the_closest_margin(result_dir):
    audit = margin_audit([result_dir], tolerance={"atol": 1e-4, "rtol": 1e-4})
    assert audit["kind"] == "margin_audit"
    files = {f["file"]: f for f in audit["files"]}
    root = str(result_dir)
    assert list(files) == [
        f"{root}/controls/81.json",
        f"{root}/correctness/53/v.json",
        f"{root}/correctness/81/v.json",
        f"{root}/env/fingerprint.json",
    ]
    assert files[f"{root}/env/fingerprint.json"]["records"] == 0  # audited, nothing to audit
    assert files[f"{root}/correctness/81/v.json"]["records"] == 4  # 3 cases + summary
    assert files[f"{root}/correctness/81/v.json"]["cases"] == 3

    by_path = {(c["file"], c["path"]): c for c in audit["cases"]}
    flip = by_path[(f"{root}/correctness/81/v.json", "cases[2]")]
    assert flip["name"] == "flip" and flip["record"] == "case"
    assert flip["flips"] is True and flip["flip"] == "historical_only"
    assert flip["official_within"] is False and flip["historical_within"] is True
    summary = by_path[(f"{root}/correctness/81/v.json", "summary")]
    assert summary["record"] == "aggregate" and summary["flips"] is True
    nan = by_path[(f"{root}/controls/81.json", "tiny_values.v-1.cases[0]")]
    assert nan["max_ratio_official"] == math.inf and nan["flips"] is False
    assert nan["margin"] is None
    same = by_path[(f"{root}/correctness/81/v.json", "cases[0]")]
    assert same["max_ratio_official"] == 0.0 and same["margin"] is None

    totals = audit["totals"]
    assert totals["files"] == 4 and totals["files_with_records"] == 3
    assert totals["cases"] == 5 and totals["aggregates"] == 2 and totals["records"] == 7
    assert totals["flips"] == 1 and totals["aggregate_flips"] == 1
    assert totals["flipping_cases"] == [
        {
            "file": f"{root}/correctness/81/v.json",
            "path": "cases[2]",
            "name": "flip",
            "flip": "historical_only",
        }
    ]
    # The witness pair sits within one float32 step of the threshold: closest overall.
    closest = totals["closest_margin"]
    assert closest["path"] == "cases[2]" and closest["name"] == "flip"
    assert closest["abs_log_ratio"] == abs(math.log(closest["ratio"])) < 1e-3
    assert totals["tolerance_mismatches"] == [f"{root}/correctness/53/v.json"]


def test_write_margin_audit_reads_back_inf_strings_and_skips_earlier_audits(result_dir, tmp_path):
    out = result_dir / "protocol" / "margin_audit.json"
    first = write_margin_audit([result_dir], out)
    on_disk = read_json(out)
    assert on_disk["totals"]["flips"] == 1
    nan_entry = next(c for c in on_disk["cases"] if c["name"] == "nan")
    assert nan_entry["max_ratio_official"] == "inf"
    # Auditing again, now with the audit itself in the directory: it is listed, not audited.
    again = margin_audit([result_dir])
    audit_entry = next(f for f in again["files"] if f["file"] == str(out))
    assert audit_entry["records"] == 0 and audit_entry["skipped"] == "an earlier margin audit"
    assert again["cases"] == first["cases"]


def test_margin_audit_errors(tmp_path):
    with pytest.raises(KbfuseError, match="not found"):
        margin_audit([tmp_path / "missing.json"])
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(KbfuseError, match="bad.json"):
        margin_audit([bad])
    wrong = tmp_path / "wrong.json"
    write_json(wrong, {"cases": [{"max_ratio_official": "big", "max_ratio_historical": 0.1}]})
    with pytest.raises(KbfuseError, match=r"cases\[0\].max_ratio_official"):
        margin_audit([wrong])
    for tolerance in ({"atol": 1e-4}, {"tol": 1e-4}, {"atol": 1e-4, "rtol": -1.0}):
        with pytest.raises(KbfuseError, match="tol"):
            margin_audit([wrong], tolerance=tolerance)


def test_margin_picks_ratio_closest_to_one_on_log_scale(tmp_path):
    path = tmp_path / "r.json"
    write_json(path, {"x": {"max_ratio_official": 0.5, "max_ratio_historical": 1.9}})
    entry = margin_audit([path])["cases"][0]
    assert entry["path"] == "x" and entry["record"] == "aggregate"
    assert entry["flip"] == "official_only"
    # |ln 1.9| = 0.642 < |ln 0.5| = 0.693: the historical ratio is the closer one.
    assert entry["margin"]["predicate"] == "historical"
    assert entry["margin"]["abs_log_ratio"] == abs(math.log(1.9))
