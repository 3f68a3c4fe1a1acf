"""CPU tests of the timing and controls logic: orders, statistics, paired ratios, gating."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from kbfuse.checks.controls import (
    as_rows,
    check_controls_cfg,
    dense_case_name,
    ftz_pairs,
    small_init_inputs,
    subnormal_bits,
    tiny_value_cases,
    without_ftz,
)
from kbfuse.errors import KbfuseError
from kbfuse.timing.gate import check_names, gate, gate_baselines, read_correctness_records
from kbfuse.timing.measure import (
    MEASUREMENT_KEYS,
    assemble_scope,
    best_compiled,
    check_protocol,
    paired_ratios,
    stats,
)

NAMES = ["eager", "torchscript", "inductor", "nvrtc-cubin-noftz", "nvrtc-ptx-ftz"]
PROTOCOL = {
    "warmup": 8,
    "rounds": 25,
    "invocations_per_pair": 5,
    "order_seed": 913,
    "input_seed": 42,
}


# --------------------------------------------------------------------------- statistics


def test_stats_on_known_samples():
    result = stats([4.0, 1.0, 3.0, 2.0, 5.0])
    assert result == {
        "median_ms": 3.0,
        "q1_ms": 2.0,
        "q3_ms": 4.0,
        "samples_ms": [4.0, 1.0, 3.0, 2.0, 5.0],  # kept in round order
    }
    # numpy's linear interpolation between order statistics
    even = stats([1.0, 2.0, 3.0, 4.0])
    assert even["median_ms"] == 2.5
    assert even["q1_ms"] == 1.75
    assert even["q3_ms"] == 3.25
    assert stats([0.125]) == {
        "median_ms": 0.125,
        "q1_ms": 0.125,
        "q3_ms": 0.125,
        "samples_ms": [0.125],
    }


def test_stats_values_are_plain_floats():
    result = stats(np.array([1, 2, 3], dtype=np.float32))
    assert all(type(v) is float for v in result["samples_ms"])
    assert type(result["median_ms"]) is float


@pytest.mark.parametrize("samples", [[], [1.0, math.nan], [1.0, math.inf], [1.0, 0.0], [-1.0]])
def test_stats_rejects_empty_or_non_positive_samples(samples):
    with pytest.raises(KbfuseError, match="stats: "):
        stats(samples)


def test_stats_keeps_the_round_positions():
    assert stats([2.0, 1.0], [1, 0])["positions"] == [1, 0]
    with pytest.raises(KbfuseError, match="2 samples but 1 positions"):
        stats([2.0, 1.0], [0])


def test_paired_ratios_are_per_round_baseline_over_variant():
    baseline = [2.0, 3.0, 8.0, 1.0]
    variant = [1.0, 3.0, 2.0, 4.0]
    # per round: 2, 1, 4, 0.25 -> sorted 0.25, 1, 2, 4
    result = paired_ratios(baseline, variant)
    assert result == {"median": 1.5, "q1": 0.8125, "q3": 2.5}
    # pairing matters: the ratio of medians would be 2.5 / 2.5 = 1
    assert paired_ratios([1.0, 1.0, 1.0], [0.5, 0.5, 0.5]) == {"median": 2.0, "q1": 2.0, "q3": 2.0}


def test_paired_ratios_needs_one_sample_per_round_each():
    with pytest.raises(KbfuseError, match="paired per round"):
        paired_ratios([1.0, 2.0], [1.0])
    with pytest.raises(KbfuseError, match="must be finite and positive"):
        paired_ratios([1.0], [0.0])


def test_best_compiled_is_the_faster_compiled_baseline():
    m = {
        "eager": {"median_ms": 0.1},
        "torchscript": {"median_ms": 2.0},
        "inductor": {"median_ms": 1.0},
    }
    assert best_compiled(m) == "inductor"  # eager is not a compiled baseline
    m["torchscript"]["median_ms"] = 0.5
    assert best_compiled(m) == "torchscript"
    m["inductor"]["median_ms"] = 0.5
    assert best_compiled(m) == "torchscript"  # a tie keeps the first
    assert best_compiled({"eager": {"median_ms": 1.0}}) is None


def test_assemble_scope_measurements_and_ratios():
    samples = {
        "eager": [4.0, 4.0, 4.0],
        "torchscript": [3.0, 3.0, 3.0],
        "inductor": [2.0, 2.0, 2.0],
        "fast": [1.0, 1.0, 2.0],
        "extra": [9.0, 9.0, 9.0],  # not named: ignored
    }
    positions = {name: [0, 1, 2] for name in samples}
    names = ["eager", "torchscript", "inductor"]
    measurements, ratios = assemble_scope(samples, positions, names, ["fast"])
    assert list(measurements) == ["eager", "torchscript", "inductor", "fast"]
    assert measurements["fast"]["median_ms"] == 1.0
    assert measurements["fast"]["positions"] == [0, 1, 2]
    assert set(ratios) == {"fast"}
    entry = ratios["fast"]
    assert set(entry) == {"vs_eager", "vs_torchscript", "vs_inductor", "vs_best_compiled"}
    # 4 implementations: one cycle is 4 rounds, none of the 3 rounds completes it
    assert entry["vs_eager"] == {
        "median": 4.0,
        "q1": 3.0,
        "q3": 4.0,
        "balanced": None,
        "balanced_rounds": 0,
    }
    assert entry["vs_best_compiled"] == {"baseline": "inductor", **entry["vs_inductor"]}
    assert entry["vs_inductor"]["median"] == 2.0


def test_assemble_scope_without_compiled_baselines_and_missing_samples():
    samples = {"eager": [1.0, 1.0], "v": [0.5, 0.25]}
    _, ratios = assemble_scope(samples, {"eager": [0, 1], "v": [1, 0]}, ["eager"], ["v"])
    assert ratios == {
        "v": {
            "vs_eager": {
                "median": 3.0,
                "q1": 2.5,
                "q3": 3.5,
                "balanced": pytest.approx(math.sqrt(8.0)),
                "balanced_rounds": 2,
            }
        }
    }
    with pytest.raises(KbfuseError, match=r"no samples for \['v'\]"):
        assemble_scope({"eager": [1.0]}, {"eager": [0]}, ["eager"], ["v"])


def test_measurement_keys_cover_both_scopes_and_methods():
    assert MEASUREMENT_KEYS == ("full/events", "full/graph", "tail/events", "tail/graph")


# --------------------------------------------------------------------------- protocol, names


def test_check_protocol_keeps_the_five_keys():
    assert check_protocol({**PROTOCOL, "extra": 1}) == PROTOCOL


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("warmup", 0),
        ("rounds", 0),
        ("invocations_per_pair", -1),
        ("order_seed", -1),
        ("input_seed", 1.5),
        ("rounds", True),
    ],
)
def test_check_protocol_names_the_bad_key(key, value):
    with pytest.raises(KbfuseError, match=f"timing.{key}"):
        check_protocol({**PROTOCOL, key: value})
    missing = {k: v for k, v in PROTOCOL.items() if k != key}
    with pytest.raises(KbfuseError, match=key):
        check_protocol(missing)


def test_check_names():
    assert check_names(["eager", "inductor"], ["a"]) == ["eager", "inductor"]
    with pytest.raises(KbfuseError, match="baselines \\['tensorrt'\\] are unknown"):
        check_names(["eager", "tensorrt"], [])
    with pytest.raises(KbfuseError, match="more than once"):
        check_names(["eager", "eager"], [])
    with pytest.raises(KbfuseError, match="clash"):
        check_names(["eager"], ["eager"])


# --------------------------------------------------------------------------- gate


def record(variant, passed=True, failing=(), task=81, sha="a" * 64, **extra):
    return {
        "kind": "correctness",
        "task": task,
        "implementation": variant,
        "provenance": {"variant": variant, "artifact_sha256": sha},
        "passed": passed,
        "failing_checks": list(failing),
        **extra,
    }


def test_gate_passes_good_records_in_order_and_skips_failures():
    records = {
        "good-b": record("good-b"),
        "wrong": record("wrong", passed=False, failing=["seed0/uniform", "timing_input"]),
        "good-a": record("good-a"),
    }
    eligible, skipped = gate(records, task=81, artifact_sha256={v: "a" * 64 for v in records})
    assert eligible == ["good-b", "good-a"]
    assert set(skipped) == {"wrong"}
    assert skipped["wrong"]["failing_checks"] == ["seed0/uniform", "timing_input"]
    assert "failed correctness" in skipped["wrong"]["reason"]
    assert "2 failing" in skipped["wrong"]["reason"]


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        (None, "no correctness record"),
        (KbfuseError("x.json: Expecting value"), "unreadable correctness record"),
        (["not", "a", "dict"], "not a JSON object"),
        ({**record("v"), "kind": "timing"}, "kind is 'timing'"),
        ({**record("v"), "passed": "yes"}, "passed is 'yes'"),
        ({k: v for k, v in record("v").items() if k != "passed"}, "passed is None"),
        ({**record("v"), "failing_checks": "seed0"}, "failing_checks is 'seed0'"),
        (record("other"), "implementation 'other'"),
        (record("v", task=53), "task 53"),
        (record("v", sha="b" * 64), "checked on artifact"),
        (record("v", passed=True, failing=["seed0/normal"]), "failing_checks is not empty"),
    ],
)
def test_gate_skips_missing_corrupt_and_mismatched_records(value, reason):
    eligible, skipped = gate({"v": value}, task=81, artifact_sha256={"v": "a" * 64})
    assert eligible == []
    assert reason in skipped["v"]["reason"]
    assert isinstance(skipped["v"]["failing_checks"], list)


def test_gate_without_task_or_artifacts_checks_the_record_alone():
    eligible, skipped = gate({"v": record("v", task=95, sha="c" * 64)})
    assert eligible == ["v"] and skipped == {}


def test_read_correctness_records(tmp_path):
    good = tmp_path / "good.json"
    good.write_text(json.dumps(record("good")))
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    records = read_correctness_records(
        {"good": good, "broken": broken, "absent": tmp_path / "absent.json", "none": None}
    )
    assert records["good"] == record("good")
    assert isinstance(records["broken"], KbfuseError)
    assert str(broken) in str(records["broken"])
    assert records["absent"] is None and records["none"] is None
    eligible, skipped = gate(records)
    assert eligible == ["good"]
    assert skipped["broken"]["reason"].startswith("unreadable correctness record")
    assert skipped["absent"]["reason"] == "no correctness record"


def baselines_record(task=81, **results):
    return {"kind": "correctness_baselines", "task": task, "implementations": results}


PASSING = {"passed": True, "failing_checks": []}
NAMES3 = ["eager", "torchscript", "inductor"]


def test_gate_baselines_times_eager_and_the_baselines_that_passed():
    failing = {"passed": False, "failing_checks": ["graph/new_weights"]}
    record = baselines_record(torchscript=failing, inductor=PASSING)
    eligible, skipped = gate_baselines(record, NAMES3, task=81)
    assert eligible == ["eager", "inductor"]
    assert skipped == {
        "torchscript": {
            "reason": "failed correctness (official predicate): 1 failing check(s)",
            "failing_checks": ["graph/new_weights"],
        }
    }


@pytest.mark.parametrize(
    ("record", "reason"),
    [
        (None, "no correctness record"),
        (KbfuseError("b.json: Expecting value"), "unreadable correctness record"),
        ({**baselines_record(), "kind": "correctness"}, "kind is 'correctness'"),
        (baselines_record(task=53, torchscript=PASSING, inductor=PASSING), "for task 53, not 81"),
        ({**baselines_record(), "implementations": []}, "implementations is []"),
        (baselines_record(torchscript=PASSING), "no correctness result for baseline 'inductor'"),
        (
            baselines_record(
                torchscript=PASSING, inductor={"passed": "true", "failing_checks": []}
            ),
            "passed is 'true', not a boolean",
        ),
        (
            baselines_record(
                torchscript=PASSING, inductor={"passed": True, "failing_checks": ["x"]}
            ),
            "passed is true but failing_checks is not empty",
        ),
    ],
)
def test_gate_baselines_skips_what_it_cannot_trust(record, reason):
    eligible, skipped = gate_baselines(record, NAMES3, task=81)
    assert "eager" in eligible and "inductor" not in eligible
    assert reason in skipped["inductor"]["reason"]


def test_gate_baselines_only_gates_the_configured_baselines():
    assert gate_baselines(None, ["eager"], task=81) == (["eager"], {})


# --------------------------------------------------------------------------- controls logic

CONTROLS = {
    "small_shape": {"batch": 128, "in_features": 1024, "out_features": 1024},
    "tiny_values": {"low": -110.0, "high": -60.0, "dense_count": 1048576},
    "ftz_cost": {"rounds": 35, "replays_per_pair": 10},
    "witness81_inputs": [-88.0, -87.5],
}


def test_check_controls_cfg():
    cfg = check_controls_cfg(CONTROLS)
    assert cfg["small_shape"] == {
        "batch": 128,
        "in_features": 1024,
        "out_features": 1024,
        "seed": 371,  # the study's small-shape seed, when the config names none
    }
    seeded = json.loads(json.dumps(CONTROLS))
    seeded["small_shape"]["seed"] = 5
    assert check_controls_cfg(seeded)["small_shape"]["seed"] == 5
    seeded["small_shape"]["seed"] = -1
    with pytest.raises(KbfuseError, match="controls.small_shape.seed is -1"):
        check_controls_cfg(seeded)
    assert cfg["tiny_values"] == {"low": -110.0, "high": -60.0, "dense_count": 1048576}
    assert cfg["ftz_cost"] == {"rounds": 35, "replays_per_pair": 10}
    bad = json.loads(json.dumps(CONTROLS))
    bad["tiny_values"]["low"] = -50.0
    with pytest.raises(KbfuseError, match="low -50.0 must be below high -60.0"):
        check_controls_cfg(bad)
    bad = json.loads(json.dumps(CONTROLS))
    bad["small_shape"]["batch"] = 0
    with pytest.raises(KbfuseError, match="controls.small_shape.batch"):
        check_controls_cfg(bad)
    with pytest.raises(KbfuseError, match="controls.ftz_cost"):
        check_controls_cfg({k: v for k, v in CONTROLS.items() if k != "ftz_cost"})


def test_tiny_value_cases():
    cases = tiny_value_cases(-110.0, -60.0, 11)
    assert list(cases) == ["dense_-110_-60", "subnormals", "signed_zeros", "infinities", "nan"]
    assert dense_case_name(-110.0, -60.0) == "dense_-110_-60"
    assert dense_case_name(-87.5, 1e-3) == "dense_-87.5_0.001"
    assert all(v.dtype == np.float32 for v in cases.values())
    assert cases["dense_-110_-60"].tolist() == [-110.0 + 5.0 * i for i in range(11)]
    zeros = cases["signed_zeros"]
    assert zeros.view(np.uint32).tolist() == [0x00000000, 0x80000000]
    assert cases["infinities"].tolist() == [math.inf, -math.inf]
    assert np.isnan(cases["nan"]).all() and cases["nan"].size == 1


def test_subnormals_span_the_range_with_both_signs():
    bits = subnormal_bits()
    half = len(bits) // 2
    positive, negative = bits[:half], bits[half:]
    assert negative == [b | 0x80000000 for b in positive]
    assert positive[0] == 0x00000001 and positive[-1] == 0x007FFFFF
    assert all(1 << k in positive for k in range(23))
    values = np.array(bits, dtype=np.uint32).view(np.float32)
    tiny = np.finfo(np.float32).tiny  # smallest normal
    assert np.all(np.abs(values) < tiny) and np.all(values != 0)
    assert (values > 0).sum() == (values < 0).sum() == half
    assert float(values[0]) == 2.0**-149


def test_as_rows_pads_with_zeros():
    values = np.array([1, 2, 3, 4, 5], dtype=np.float32)
    rows = as_rows(values, 4)
    assert rows.shape == (2, 4) and rows.dtype == np.float32
    assert rows.reshape(-1).tolist() == [1, 2, 3, 4, 5, 0, 0, 0]
    assert as_rows(values, 8).shape == (1, 8)
    assert as_rows(np.zeros(8, dtype=np.float32), 4).shape == (2, 4)


def meta(route, ftz, options=("--std=c++11", "--fmad=false"), kernel="naive", source="s" * 64):
    requested = [*options] + ([f"--ftz={'true' if ftz else 'false'}"] if ftz is not None else [])
    return {
        "route": route,
        "kernel": kernel,
        "source_sha256": source,
        "requested_options": requested,
        "expected_ftz": bool(ftz) if ftz is not None else route == "cupy-default",
    }


def test_ftz_pairs_match_route_kernel_source_and_options():
    metas = {
        "cupy-default": meta("cupy-default", None),
        "nvrtc-cubin-noftz": meta("nvrtc-cubin", False),
        "nvrtc-cubin-ftz": meta("nvrtc-cubin", True),
        "nvrtc-ptx-noftz": meta("nvrtc-ptx", False),
        "nvrtc-ptx-ftz": meta("nvrtc-ptx", True),
        "ptx-fmad-ftz": meta("nvrtc-ptx", True, options=("--fmad=true",)),  # other options
        "ptx-other-kernel": meta("nvrtc-ptx", False, kernel="tiled", source="t" * 64),
    }
    pairs = ftz_pairs(metas)
    assert pairs == {
        "nvrtc-cubin": {"ftz_on": "nvrtc-cubin-ftz", "ftz_off": "nvrtc-cubin-noftz", "others": []},
        "nvrtc-ptx": {"ftz_on": "nvrtc-ptx-ftz", "ftz_off": "nvrtc-ptx-noftz", "others": []},
    }


def test_ftz_pairs_first_pair_per_route_and_others_listed():
    metas = {
        "a-on": meta("nvrtc-ptx", True),
        "a-off": meta("nvrtc-ptx", False),
        "b-on": meta("nvrtc-ptx", True, options=("--fmad=true",)),
        "b-off": meta("nvrtc-ptx", False, options=("--fmad=true",)),
    }
    assert ftz_pairs(metas) == {
        "nvrtc-ptx": {"ftz_on": "a-on", "ftz_off": "a-off", "others": [["b-on", "b-off"]]}
    }
    with pytest.raises(KbfuseError, match="lacks"):
        ftz_pairs({"x": {"route": "nvrtc-ptx"}})


def test_without_ftz():
    assert without_ftz(["--std=c++11", "--ftz=true", "-ftz=false", "--fmad=false", "--ftzx"]) == (
        "--std=c++11",
        "--fmad=false",
        "--ftzx",
    )


def test_small_init_inputs_per_task():
    # task 53: in, out, scaling_factor, hardtanh_min, hardtanh_max
    assert small_init_inputs([8192, 8192, 0.5, -2, 2], 1024, 512) == [1024, 512, 0.5, -2, 2]
    # task 81: in, out
    assert small_init_inputs([8192, 8192], 1024, 1024) == [1024, 1024]
    # task 95: in, out, add_value_shape = (out,)
    assert small_init_inputs([8192, 8192, (8192,)], 1024, 256) == [1024, 256, (256,)]
    with pytest.raises(KbfuseError, match="in_features, out_features"):
        small_init_inputs([(8192,), 8192], 1024, 1024)
