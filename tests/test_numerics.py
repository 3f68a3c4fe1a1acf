"""The numerical contract: predicates equal torch.allclose, ratios agree with them exactly."""

from __future__ import annotations

import math

import pytest
import torch

from kbfuse.checks.numerics import (
    CASE_RECORD_KEYS,
    bit_equal_count,
    compare,
    equal_nan_stress,
    error_ratio_map,
    error_ratios,
    f32_bits,
    f32_bits_hex,
    f32_from_bits,
    historical_allclose,
    official_allclose,
    summarize_cases,
)
from kbfuse.errors import KbfuseError
from kbfuse.io import dumps_json, jsonable

TOLERANCES = [(1e-4, 1e-4), (0.0, 0.0), (0.0, 1e-4), (1e-4, 0.0), (1e-5, 1e-3), (1e-2, 2.0)]
SPECIALS = [0.0, -0.0, math.inf, -math.inf, math.nan, 1e-45, -1e-45, 1.1754942e-38, 3.4e38, -3.4e38]

# The study's witness: task 81 at input -88, PyTorch vs a kernel that flushes the subnormal sigmoid.
TASK81_EAGER = -2.6640246534862188e-37


def t32(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32)


def adversarial_pairs(n: int, seed: int, device: str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """Reference/candidate pairs crowded around the 1e-4 threshold, plus special values."""
    g = torch.Generator().manual_seed(seed)
    magnitude = 10.0 ** torch.randint(-8, 8, (n,), generator=g, dtype=torch.float64)
    ref = (torch.rand(n, generator=g, dtype=torch.float64) * 4 - 2) * magnitude
    threshold = 1e-4 + 1e-4 * ref.abs()
    sign = torch.where(torch.rand(n, generator=g) < 0.5, -1.0, 1.0).double()
    near = (ref + sign * threshold).float()
    ulps = torch.randint(-3, 4, (n,), generator=g, dtype=torch.int32)
    cand = (near.view(torch.int32) + ulps).view(torch.float32)
    ref = ref.float()
    # About one position in eight: a special value on one side, and some exact copies.
    specials = t32(SPECIALS)
    draw = torch.rand(n, generator=g)
    which = torch.randint(0, len(SPECIALS), (n,), generator=g)
    ref = torch.where(draw < 0.125, specials[which], ref)
    cand = torch.where((draw >= 0.125) & (draw < 0.25), specials[which], cand)
    cand = torch.where((draw >= 0.25) & (draw < 0.3), ref, cand)
    return ref.to(device), cand.to(device)


@pytest.mark.parametrize(("atol", "rtol"), TOLERANCES)
def test_ratio_map_classifies_exactly_like_torch_isclose(atol, rtol):
    ref, cand = adversarial_pairs(200_000, seed=1)
    official = error_ratio_map(ref, cand, atol, rtol, scale="candidate")
    historical = error_ratio_map(ref, cand, atol, rtol, scale="reference")
    assert official.dtype == torch.float64
    assert torch.equal(official <= 1, torch.isclose(ref, cand, atol=atol, rtol=rtol))
    assert torch.equal(historical <= 1, torch.isclose(cand, ref, atol=atol, rtol=rtol))
    assert not torch.isnan(official).any() and not torch.isnan(historical).any()


@pytest.mark.parametrize(
    ("ref_bits", "cand_bits", "torch_close"),
    [(0x3AFD62F1, 0x3AF04159, True), (0x4304AE2C, 0x4304AAC0, False)],
)
def test_float64_formula_alone_would_disagree_with_torch(ref_bits, cand_bits, torch_close):
    """Why the ratios use torch's float32 terms: the exact formula misclassifies these pairs."""
    ref, cand = t32([f32_from_bits(ref_bits)]), t32([f32_from_bits(cand_bits)])
    exact = (ref.double() - cand.double()).abs() <= 1e-4 + 1e-4 * cand.double().abs()
    assert bool(exact) is not torch_close
    assert bool(torch.allclose(ref, cand, atol=1e-4, rtol=1e-4)) is torch_close
    case = compare(ref, cand, 1e-4, 1e-4, "boundary", "g")
    assert case["official_pass"] is torch_close
    assert (case["max_ratio_official"] <= 1) is torch_close


def test_compare_passes_equal_torch_allclose_on_many_small_cases():
    g = torch.Generator().manual_seed(7)
    verdicts = set()
    for trial in range(400):
        ref, cand = adversarial_pairs(int(torch.randint(1, 6, (1,), generator=g)), seed=trial)
        atol, rtol = TOLERANCES[trial % len(TOLERANCES)]
        case = compare(ref, cand, atol, rtol, name=f"t{trial}", group="full_program")
        official = bool(torch.allclose(ref, cand, atol=atol, rtol=rtol))
        historical = bool(torch.allclose(cand, ref, atol=atol, rtol=rtol))
        assert case["official_pass"] is official
        assert case["historical_pass"] is historical
        assert official_allclose(ref, cand, atol, rtol) is official
        assert historical_allclose(ref, cand, atol, rtol) is historical
        assert (case["max_ratio_official"] <= 1) is official
        assert (case["max_ratio_historical"] <= 1) is historical
        if official:
            assert case["nonfinite_mismatch"] == 0
        verdicts.add((official, historical))
    assert {(True, True), (False, False)} <= verdicts  # both outcomes were exercised


def test_case_record_keys_and_types():
    ref = t32([1.0, 2.0, -0.5, 0.0])
    cand = t32([1.0, 2.0002, -0.5, -0.0])
    case = compare(ref, cand, 1e-4, 1e-4, name="uniform/seed0", group="full_program")
    assert set(case) == set(CASE_RECORD_KEYS)
    assert case["name"] == "uniform/seed0" and case["group"] == "full_program"
    assert case["elements"] == 4
    assert case["bit_equal"] == 2  # 2.0 vs 2.0002 and 0.0 vs -0.0 differ in bits
    assert case["bit_equal_fraction"] == 0.5
    assert case["official_pass"] is True and case["historical_pass"] is True
    assert case["equal_nan_pass"] is True
    diff = float(t32([2.0002]).item()) - 2.0
    assert case["max_abs_diff"] == diff
    allowed = float((1e-4 + (1e-4 * t32([2.0002])).abs()).item())
    assert case["max_ratio_official"] == diff / allowed
    assert 0 < case["max_ratio_historical"] <= 1
    for key in ("elements", "bit_equal", "nonfinite_reference", "nonfinite_mismatch"):
        assert type(case[key]) is int
    for key in ("max_abs_diff", "max_ratio_official", "bit_equal_fraction"):
        assert type(case[key]) is float


def test_task81_flushed_output_passes_both_predicates_with_different_bits():
    ref, cand = t32([TASK81_EAGER]), t32([-0.0])
    assert f32_bits_hex(ref) == "0x82b54ddb" and f32_bits_hex(cand) == "0x80000000"
    case = compare(ref, cand, 1e-4, 1e-4, name="witness81/-88", group="tail_control")
    assert case["official_pass"] is True and case["historical_pass"] is True
    assert case["bit_equal"] == 0 and case["bit_equal_fraction"] == 0.0
    assert case["max_abs_diff"] == 2.6640246534862188e-37
    assert case["max_ratio_official"] < 1e-32 and case["max_ratio_historical"] < 1e-32


def test_nan_against_nan_fails_official_but_passes_equal_nan_stress():
    ref, cand = t32([1.0, math.nan]), t32([1.0, math.nan])
    case = compare(ref, cand, 1e-4, 1e-4, name="nan", group="tail_control")
    assert case["official_pass"] is False and case["historical_pass"] is False
    assert case["equal_nan_pass"] is True and equal_nan_stress(ref, cand) is True
    assert case["max_ratio_official"] == math.inf and case["max_ratio_historical"] == math.inf
    assert case["nonfinite_reference"] == 1 and case["nonfinite_candidate"] == 1
    assert case["nonfinite_mismatch"] == 0
    assert case["bit_equal"] == 2
    assert case["max_abs_diff"] == 0.0  # over finite pairs only
    assert '"max_ratio_official": "inf"' in dumps_json(case)


def test_infinities():
    same = compare(t32([math.inf, -math.inf]), t32([math.inf, -math.inf]), 1e-4, 1e-4, "i", "g")
    assert same["official_pass"] is True and same["equal_nan_pass"] is True
    assert same["max_ratio_official"] == 0.0 and same["max_ratio_historical"] == 0.0
    assert same["nonfinite_mismatch"] == 0 and same["bit_equal"] == 2

    flipped = compare(t32([math.inf]), t32([-math.inf]), 1e-4, 1e-4, "i", "g")
    assert flipped["official_pass"] is False and flipped["equal_nan_pass"] is False
    assert flipped["nonfinite_mismatch"] == 1 and flipped["max_ratio_official"] == math.inf

    finite_vs_inf = compare(t32([3.0e38]), t32([math.inf]), 1e-4, 1e-4, "i", "g")
    assert finite_vs_inf["official_pass"] is False and finite_vs_inf["nonfinite_mismatch"] == 1
    assert finite_vs_inf["nonfinite_reference"] == 0 and finite_vs_inf["nonfinite_candidate"] == 1

    nan_vs_number = t32([math.nan]), t32([1.0])
    assert equal_nan_stress(*nan_vs_number) is False
    assert error_ratios(*nan_vs_number, 1e-4, 1e-4) == (math.inf, math.inf)


def test_finite_difference_overflowing_float32_counts_as_inf():
    ref, cand = t32([3.0e38]), t32([-3.0e38])
    case = compare(ref, cand, 1e-4, 1e-4, "overflow", "g")
    assert case["official_pass"] is False and case["equal_nan_pass"] is True
    assert case["max_ratio_official"] == math.inf and case["nonfinite_mismatch"] == 0
    assert case["max_abs_diff"] == 2 * float(t32([3.0e38]).item())


def test_direction_matters_official_uses_candidate_scale():
    # |ref - cand| = 2.0002e-4-ish: within atol + rtol*|ref| but not atol + rtol*|cand|.
    ref, cand = t32([f32_from_bits(0x3F800AE1)]), t32([f32_from_bits(0x3F800453)])
    case = compare(ref, cand, 1e-4, 1e-4, "direction", "g")
    assert case["official_pass"] is False and case["historical_pass"] is True
    assert case["max_ratio_official"] > 1 >= case["max_ratio_historical"]


def test_bit_equal_count_distinguishes_signed_zero_and_nan_payloads():
    a = t32([0.0, 1.0, math.nan, 2.0]).reshape(2, 2)
    b = t32([-0.0, 1.0, math.nan, 2.0]).reshape(2, 2)
    assert bit_equal_count(a, b) == 3
    other_nan = b.clone().reshape(-1)
    other_nan.view(torch.int32)[2] = 0x7FC00001
    assert bit_equal_count(a, other_nan.reshape(2, 2)) == 2
    assert bit_equal_count(a.t(), b.t()) == 3  # non-contiguous views work


def test_f32_bits_round_trip():
    assert f32_bits_hex(1.0) == "0x3f800000"
    assert f32_bits_hex(-0.0) == "0x80000000"
    assert f32_bits_hex(math.inf) == "0x7f800000"
    assert f32_bits_hex(1e-45) == "0x00000001"  # smallest subnormal
    assert f32_bits_hex(0.1) == "0x3dcccccd"  # rounded to nearest float32
    assert f32_from_bits("0x3f800000") == 1.0
    assert f32_from_bits(0x82B54DDB) == TASK81_EAGER
    assert math.isnan(f32_from_bits("0x7fc00000"))
    assert f32_bits(t32([TASK81_EAGER])) == 0x82B54DDB
    assert f32_bits(torch.tensor(-2.0)) == 0xC0000000


def test_summarize_cases_counts_and_maxima():
    passing = compare(t32([1.0, 2.0]), t32([1.0, 2.0]), 1e-4, 1e-4, "same", "full_program")
    close = compare(t32([1.0, 2.0]), t32([1.0, 2.0001]), 1e-4, 1e-4, "close", "full_program")
    nan = compare(t32([math.nan, 1.0, 1.0]), t32([math.nan, 1.0, 1.5]), 1e-4, 1e-4, "nan", "x")
    summary = summarize_cases([passing, close, nan])
    assert summary == {
        "cases": 3,
        "official_passes": 2,
        "bit_identical_cases": 1,
        "elements": 7,
        "elements_bit_equal": 2 + 1 + 2,
        "max_abs_diff": 0.5,
        "max_ratio_official": math.inf,
        "max_ratio_historical": math.inf,
        "equal_nan_passes": 3,
    }
    # Records read back from JSON carry "inf" strings: the same summary comes out.
    assert summarize_cases(jsonable([passing, close, nan])) == summary


def test_summarize_cases_rejects_bad_records():
    good = compare(t32([1.0]), t32([1.0]), 1e-4, 1e-4, "good", "g")
    with pytest.raises(KbfuseError, match="no cases"):
        summarize_cases([])
    with pytest.raises(KbfuseError, match="'bit_equal'"):
        summarize_cases([good, {k: v for k, v in good.items() if k != "bit_equal"}])
    with pytest.raises(KbfuseError, match="max_abs_diff"):
        summarize_cases([{**good, "max_abs_diff": "big"}])


def test_bad_input_is_named():
    x = t32([1.0, 2.0])
    with pytest.raises(KbfuseError, match="float32"):
        compare(x.double(), x.double(), 1e-4, 1e-4, "n", "g")
    with pytest.raises(KbfuseError, match="shape mismatch"):
        compare(x, t32([1.0]), 1e-4, 1e-4, "n", "g")
    with pytest.raises(KbfuseError, match="atol"):
        official_allclose(x, x, -1e-4, 1e-4)
    with pytest.raises(KbfuseError, match="rtol"):
        error_ratios(x, x, 1e-4, math.nan)
    with pytest.raises(KbfuseError, match="candidate must be a torch.Tensor"):
        bit_equal_count(x, [1.0, 2.0])
    with pytest.raises(KbfuseError, match="scale"):
        error_ratio_map(x, x, 1e-4, 1e-4, scale="both")
    with pytest.raises(KbfuseError, match="out of range"):
        f32_from_bits(1 << 32)


def test_empty_tensors_are_vacuously_close():
    e = t32([])
    case = compare(e, e, 1e-4, 1e-4, "empty", "g")
    assert case["elements"] == 0 and case["official_pass"] is True
    assert case["bit_equal_fraction"] == 1.0 and case["max_ratio_official"] == 0.0


@pytest.mark.gpu
@pytest.mark.parametrize(("atol", "rtol"), TOLERANCES)
def test_cuda_tensors_classify_like_torch_isclose(atol, rtol):
    ref, cand = adversarial_pairs(1_000_000, seed=3, device="cuda")
    assert torch.equal(
        error_ratio_map(ref, cand, atol, rtol) <= 1,
        torch.isclose(ref, cand, atol=atol, rtol=rtol),
    )
    assert torch.equal(
        error_ratio_map(ref, cand, atol, rtol, scale="reference") <= 1,
        torch.isclose(cand, ref, atol=atol, rtol=rtol),
    )
    case = compare(ref, cand, atol, rtol, "cuda", "full_program")
    cpu_case = compare(ref.cpu(), cand.cpu(), atol, rtol, "cuda", "full_program")
    assert case["official_pass"] is bool(torch.allclose(ref, cand, atol=atol, rtol=rtol))
    assert case == cpu_case  # same float32 arithmetic on both devices
