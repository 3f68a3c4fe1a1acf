"""GPU tests of the timing and controls stages (run on the GPU machine: pytest -m gpu).

A small KernelBench-shaped repository (tests/kbrepo.py) is pinned, kernels/naive.cu and a
deliberately wrong kernel source (tests/data/wrong_tails.cu) are compiled with
kbfuse.compilation.compile, correctness decides which variants may be timed, and the gate is proven:
the wrong variant shows up only in `skipped`, and its module is never loaded or launched.

The variants use the nvrtc-ptx route, which the CUDA compute-cache hazard (a cached cubin
served for another --ftz setting) does not affect, so the bit-level assertions below hold
whatever ran earlier in this process or on this machine.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from conftest import compile_in_child
from kbrepo import BATCH, IN_FEATURES, OUT_FEATURES

from kbfuse.checks.controls import run_controls, run_witness81
from kbfuse.checks.correctness import run_baselines, run_correctness
from kbfuse.checks.numerics import CASE_RECORD_KEYS
from kbfuse.compilation import launch
from kbfuse.io import jsonable, read_json, write_json
from kbfuse.tasks.kernelbench import pin_kernelbench
from kbfuse.timing.gate import TimedTask
from kbfuse.timing.measure import MEASUREMENT_KEYS
from kbfuse.timing.timing import run_timing

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[1]
NAIVE = ROOT / "kernels" / "naive.cu"
WRONG = ROOT / "tests" / "data" / "wrong_tails.cu"
BASE_OPTIONS = ["--std=c++11", "--fmad=false"]
VARIANTS = {  # name -> (source, spec), in config order
    "good": (
        NAIVE,
        {"route": "nvrtc-ptx", "kernel": "naive", "options": [*BASE_OPTIONS, "--ftz=false"]},
    ),
    "wrong": (
        WRONG,
        {"route": "nvrtc-ptx", "kernel": "wrong_tails", "options": [*BASE_OPTIONS, "--ftz=false"]},
    ),
    "flush": (
        NAIVE,
        {"route": "nvrtc-ptx", "kernel": "naive", "options": [*BASE_OPTIONS, "--ftz=true"]},
    ),
}
TASK = 81
BASELINES = ["eager", "torchscript", "inductor"]
TOLERANCE = {"atol": 1e-4, "rtol": 1e-4}
PROTOCOL = {"warmup": 3, "rounds": 3, "invocations_per_pair": 2, "order_seed": 7, "input_seed": 42}
CONTROLS = {
    "small_shape": {"batch": 8, "in_features": 16, "out_features": 32},
    "tiny_values": {"low": -110.0, "high": -60.0, "dense_count": 101},
    "ftz_cost": {"rounds": 3, "replays_per_pair": 2},
    "witness81_inputs": [-88.0, -87.5],
}
# The study's witness: eager task 81 at -88 (a subnormal sigmoid on the way); flushed: -0.0.
EAGER_81_AT_MINUS_88 = -2.6640246534862188e-37


@pytest.fixture(scope="module")
def study(tmp_path_factory, kb_repo):
    """Pinned repo, compiled variants and their task-81 correctness records."""
    root = tmp_path_factory.mktemp("gpu-timing")
    url, commit = kb_repo
    checkout, pin = root / "checkout", root / "pin.json"
    pin_kernelbench(url, commit, 2, [53, 81, 95], checkout, pin)
    variants, correctness = {}, {}
    for name, (source, spec) in VARIANTS.items():
        artifact, meta = compile_in_child(root / "compile" / name, source, name, spec)
        variants[name] = (artifact, meta)
        correctness[name] = root / "correctness" / f"{name}.json"
        run_correctness(
            task=TASK,
            variant=name,
            artifact=artifact,
            meta_path=meta,
            checkout=checkout,
            pin_path=pin,
            request=dict(
                seeds=[0],
                distributions=["uniform", "normal"],
                tolerance=TOLERANCE,
                input_seed=PROTOCOL["input_seed"],
            ),
            out=correctness[name],
            log=root / "correctness" / f"{name}.log",
        )
    records = {name: read_json(path) for name, path in correctness.items()}
    baselines_record = root / "correctness" / "baselines.json"
    run_baselines(
        task=TASK,
        checkout=checkout,
        pin_path=pin,
        request=dict(
            seeds=[0],
            distributions=["uniform"],
            tolerance=TOLERANCE,
            input_seed=PROTOCOL["input_seed"],
        ),
        out=baselines_record,
    )
    return {
        "baselines_record": baselines_record,
        "root": root,
        "checkout": checkout,
        "pin": pin,
        "variants": variants,
        "correctness": correctness,
        "records": records,
    }


def _timed_task(study) -> TimedTask:
    return TimedTask(
        task=TASK,
        variants=study["variants"],
        correctness=study["correctness"],
        baselines_record=study["baselines_record"],
        checkout=study["checkout"],
        pin_path=study["pin"],
        baselines=BASELINES,
    )


@pytest.fixture(scope="module")
def timing_run(study):
    """run_timing with spies on module loading and kernel launching."""
    loaded, launched = [], []
    original_load = launch.LoadedModule.load
    original_launch = launch.LoadedModule.launch

    def spy_load(cls, artifact, meta, *kernels):
        loaded.append(Path(artifact).resolve())
        return original_load(artifact, meta, *kernels)

    def spy_launch(self, name, n, args, device):
        launched.append(Path(self.artifact).resolve())
        return original_launch(self, name, n, args, device)

    out = study["root"] / "timing" / f"{TASK}.json"
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(launch.LoadedModule, "load", classmethod(spy_load))
        mp.setattr(launch.LoadedModule, "launch", spy_launch)
        result = run_timing(
            _timed_task(study),
            protocol=PROTOCOL,
            out=out,
            log=study["root"] / "timing" / "timing.log",
        )
    return {"result": result, "out": out, "loaded": loaded, "launched": launched}


def test_correctness_fails_the_wrong_kernel_only(study):
    records = study["records"]
    assert records["good"]["passed"] is True and records["good"]["failing_checks"] == []
    # flushed subnormals stay within atol = rtol = 1e-4, so FTZ passes the gate
    assert records["flush"]["passed"] is True
    assert records["wrong"]["passed"] is False
    assert records["wrong"]["failing_checks"]  # the cases it failed, by name


def test_gate_keeps_the_wrong_kernel_out_of_timing(study, timing_run):
    result = timing_run["result"]
    wrong_record = study["records"]["wrong"]
    assert set(result["skipped"]) == {"wrong"}
    assert result["skipped"]["wrong"]["failing_checks"] == wrong_record["failing_checks"]
    assert "failed correctness" in result["skipped"]["wrong"]["reason"]
    assert "wrong" not in result["timed"]
    assert "wrong" not in result["provenance"]["artifacts"]
    for key in MEASUREMENT_KEYS:
        assert "wrong" not in result["measurements"][key]
        assert "wrong" not in result["ratios"][key]
    wrong_artifact = Path(study["variants"]["wrong"][0]).resolve()
    good_artifact = Path(study["variants"]["good"][0]).resolve()
    assert wrong_artifact not in timing_run["loaded"]  # never loaded ...
    assert wrong_artifact not in timing_run["launched"]  # ... and never launched
    assert good_artifact in timing_run["loaded"] and good_artifact in timing_run["launched"]


def test_timing_result_has_all_scopes_with_positive_medians(study, timing_run):
    result = timing_run["result"]
    assert read_json(timing_run["out"]) == jsonable(result)
    assert result["kind"] == "timing" and result["task"] == TASK
    eligible = [v for v in VARIANTS if study["records"][v]["passed"]]
    assert "good" in eligible
    assert result["timed"] == BASELINES + eligible
    assert result["protocol"] == PROTOCOL
    assert result["shape"] == {
        "batch": BATCH,
        "in_features": IN_FEATURES,
        "out_features": OUT_FEATURES,
    }
    assert result["tail_bytes"] == 2 * 4 * BATCH * OUT_FEATURES  # float32 y read, out written
    assert result["provenance"]["artifacts"] == {
        v: read_json(study["variants"][v][1])["artifact_sha256"] for v in eligible
    }
    assert set(result["measurements"]) == set(MEASUREMENT_KEYS)
    for key in MEASUREMENT_KEYS:
        assert list(result["measurements"][key]) == result["timed"]
        width = len(result["timed"])
        for entry in result["measurements"][key].values():
            assert len(entry["samples_ms"]) == PROTOCOL["rounds"]
            assert len(entry["positions"]) == PROTOCOL["rounds"]
            assert all(0 <= p < width for p in entry["positions"])
            # balanced orders: 3 rounds of 5 implementations, never first twice
            assert entry["positions"].count(0) <= 1
            assert all(s > 0 for s in entry["samples_ms"])
            assert 0 < entry["q1_ms"] <= entry["median_ms"] <= entry["q3_ms"]
        assert set(result["ratios"][key]) == set(eligible)
        for ratios in result["ratios"][key].values():
            assert set(ratios) == {"vs_eager", "vs_torchscript", "vs_inductor", "vs_best_compiled"}
            best = ratios["vs_best_compiled"]
            medians = {
                b: result["measurements"][key][b]["median_ms"] for b in ("torchscript", "inductor")
            }
            assert best["baseline"] == min(medians, key=medians.get)
            assert best["median"] == ratios[f"vs_{best['baseline']}"]["median"] > 0
    assert result["cuda_cache"].keys() >= {"CUDA_CACHE_DISABLE", "isolated"}
    assert result["numerics"]["cuda_matmul_allow_tf32"] is False
    assert result["numerics"]["cudnn_allow_tf32"] is False
    assert len(result["provenance"]["weights_sha256"]) == 64


def test_a_failing_baseline_is_not_timed(study, tmp_path):
    record = read_json(study["baselines_record"])
    record["implementations"]["torchscript"]["passed"] = False
    record["implementations"]["torchscript"]["failing_checks"] = ["seed0/uniform"]
    failing = tmp_path / "baselines.json"
    write_json(failing, record)
    result = run_timing(
        TimedTask(
            task=TASK,
            variants={"good": study["variants"]["good"]},
            correctness={"good": study["correctness"]["good"]},
            baselines_record=failing,
            checkout=study["checkout"],
            pin_path=study["pin"],
            baselines=BASELINES,
        ),
        protocol=PROTOCOL,
        out=tmp_path / "timing.json",
    )
    assert result["timed"] == ["eager", "inductor", "good"]
    assert result["skipped"]["torchscript"]["failing_checks"] == ["seed0/uniform"]
    for key in MEASUREMENT_KEYS:
        assert "torchscript" not in result["measurements"][key]
        assert result["ratios"][key]["good"]["vs_best_compiled"]["baseline"] == "inductor"


AUTOTUNE = "inductor-max-autotune-no-cudagraphs"


def test_max_autotune_is_checked_gated_timed_and_its_build_recorded(study, tmp_path):
    """Checked like the other compiled baselines (one seed's cases, the tail, graph replay),
    timed when it passed, its build seconds recorded, the tail question answered against the
    fastest compiled baseline that passed."""
    record = tmp_path / "baselines.json"
    request = dict(seeds=[0], distributions=["uniform"], tolerance=TOLERANCE,
                   input_seed=PROTOCOL["input_seed"])  # fmt: skip
    checked = run_baselines(TASK, study["checkout"], study["pin"], request, record,
                            implementations=["inductor", AUTOTUNE])  # fmt: skip
    assert list(checked["implementations"]) == ["inductor", AUTOTUNE]
    assert checked["implementations"][AUTOTUNE]["passed"] is True
    names = ["eager", "inductor", AUTOTUNE]
    result = run_timing(
        TimedTask(TASK, {"good": study["variants"]["good"]}, {"good": study["correctness"]["good"]},
                  record, study["checkout"], study["pin"], names),
        protocol=PROTOCOL,
        out=tmp_path / "timing.json",
    )  # fmt: skip
    assert result["timed"] == [*names, "good"]
    for scope in ("full", "tail"):
        assert set(result["build_s"][scope]) == set(names)
        assert all(seconds > 0 for seconds in result["build_s"][scope].values())
    for key in MEASUREMENT_KEYS:
        best = result["ratios"][key]["good"]["vs_best_compiled"]["baseline"]
        medians = {n: result["measurements"][key][n]["median_ms"] for n in names[1:]}
        assert best == min(medians, key=medians.get)


def test_run_controls_writes_the_documented_keys(study):
    out = study["root"] / "controls" / f"{TASK}.json"
    result = run_controls(
        _timed_task(study),
        controls_cfg=CONTROLS,
        tolerance=TOLERANCE,
        protocol=PROTOCOL,
        out=out,
        log=study["root"] / "controls" / "controls.log",
    )
    assert read_json(out) == jsonable(result)
    assert result["kind"] == "controls" and result["task"] == TASK
    assert {"provenance", "small_shape", "tiny_values", "ftz_cost", "cuda_cache"} <= set(result)
    eligible = [v for v in VARIANTS if study["records"][v]["passed"]]

    small = result["small_shape"]
    assert small["shape"] == {**CONTROLS["small_shape"], "seed": 371}
    # checked at the small shape before timing: every compiled baseline and eligible variant
    assert set(small["correctness"]) == {"torchscript", "inductor", *eligible}
    for name, checked in small["correctness"].items():
        assert checked["passed"] is True, name
        assert [case["name"] for case in checked["cases"]] == ["small/full", "small/tail"]
    assert small["timed"] == BASELINES + eligible
    assert set(small["measurements"]) == set(MEASUREMENT_KEYS)
    for key in MEASUREMENT_KEYS:
        assert list(small["measurements"][key]) == BASELINES + eligible
        assert all(e["median_ms"] > 0 for e in small["measurements"][key].values())
        assert set(small["ratios"][key]) == set(eligible)
    assert "wrong" in small["skipped"]

    # tiny values: every variant, gated or not, five named cases each
    names = ["dense_-110_-60", "subnormals", "signed_zeros", "infinities", "nan"]
    assert set(result["tiny_values"]) == set(VARIANTS)
    for entry in result["tiny_values"].values():
        assert [case["name"] for case in entry["cases"]] == names
        for case in entry["cases"]:
            assert set(CASE_RECORD_KEYS) <= set(case)
            assert case["group"] == "tiny_values"
    dense = {v: result["tiny_values"][v]["cases"][0] for v in VARIANTS}
    assert dense["good"]["elements"] == CONTROLS["tiny_values"]["dense_count"]
    assert dense["good"]["bit_equal"] == dense["good"]["elements"]  # no FTZ: eager's bits
    assert dense["flush"]["bit_equal"] < dense["flush"]["elements"]  # FTZ changes bits ...
    assert dense["flush"]["official_pass"] is True  # ... and still passes the official check

    # FTZ cost: the nvrtc-ptx pair differs only in --ftz
    assert set(result["ftz_cost"]) == {"nvrtc-ptx"}
    cost = result["ftz_cost"]["nvrtc-ptx"]
    assert (cost["ftz_on"], cost["ftz_off"]) == ("flush", "good")
    for side in ("on", "off"):
        assert len(cost[side]["samples_ms"]) == CONTROLS["ftz_cost"]["rounds"]
        assert cost[side]["median_ms"] > 0
    assert set(cost["ratio_on_over_off"]) == {
        "median",
        "q1",
        "q3",
        "balanced",
        "balanced_rounds",
    }
    assert cost["ratio_on_over_off"]["balanced_rounds"] == 2
    assert (cost["rounds"], cost["replays_per_pair"]) == (3, 2)
    assert sorted(cost["on"]["positions"] + cost["off"]["positions"]) == [0, 0, 0, 1, 1, 1]
    assert result["numerics"]["cudnn_allow_tf32"] is False
    for entry in result["exhaustive"].values():
        assert entry["unwritten"] == 0
    assert cost["ratio_on_over_off"]["median"] > 0
    assert cost["effective_ftz"] == {"on": True, "off": False}


def test_run_witness81_values_and_bits(study):
    out = study["root"] / "controls" / "witness81.json"
    variants = {v: study["variants"][v] for v in ("good", "flush")}
    result = run_witness81(
        variants=variants,
        checkout=study["checkout"],
        pin_path=study["pin"],
        out=out,
        log=study["root"] / "controls" / "witness81.log",
    )
    assert read_json(out) == jsonable(result)
    assert result["kind"] == "witness81"
    assert result["inputs"] == [-88.0, -87.5]
    reference = result["reference"]
    assert [r["input"] for r in reference] == [-88.0, -87.5]
    assert reference[0]["output"] == EAGER_81_AT_MINUS_88
    assert reference[0]["output_bits"] != "0x80000000"
    assert set(result["variants"]) == {"good", "flush"}
    for row, ref in zip(result["variants"]["good"], reference, strict=True):
        assert row["bit_equal"] is True
        assert row["output_bits"] == ref["output_bits"]
    flushed = result["variants"]["flush"][0]
    assert flushed["input"] == -88.0
    assert flushed["output"] == 0.0 and math.copysign(1.0, flushed["output"]) == -1.0
    assert flushed["output_bits"] == "0x80000000"
    assert flushed["bit_equal"] is False
