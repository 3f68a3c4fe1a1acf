"""The correctness and env stages, and the baselines they check.

GPU tests (marked `gpu`, run on the GPU machine with `pytest -m gpu`) pin the small
KernelBench-shaped repository of tests/kbrepo.py, compile kernels/naive.cu as nvrtc-cubin
with --ftz=false and --ftz=true in a child process with an isolated CUDA compute cache (its
key ignores --ftz, so each compile must not see an earlier one), and run the stages on them.
The unmarked tests check, on the CPU, the pure parts: request validation, the control values,
the gate, result assembly, the baseline builders, and the sharing of each case's input and
eager reference between the implementations one job checks (run on a CPU model).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from kbfuse import stage
from kbfuse.checks import correctness, taskchecks
from kbfuse.checks.cases import assemble, check_case
from kbfuse.checks.correctness import (
    check_request,
    run_baselines,
    run_correctness,
    run_correctness_variants,
)
from kbfuse.checks.numerics import CASE_RECORD_KEYS
from kbfuse.checks.tail_controls import (
    CONTROL_ROWS,
    control_inputs,
    large_values,
    mixed_rows,
    tiny_values,
    value_rows,
)
from kbfuse.checks.taskchecks import GROUPS
from kbfuse.errors import KbfuseError
from kbfuse.io import jsonable, read_json, write_json
from kbfuse.tasks import baselines
from kbfuse.tasks.kernelbench import build_model, load_task, pin_kernelbench
from kbfuse.tasks.tails import tail_for, ulp_window

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "kernels" / "naive.cu"
TASKS = (53, 81, 95)
TOLERANCE = {"atol": 1e-4, "rtol": 1e-4}
SEEDS = [0, 1]
DISTRIBUTIONS = ["uniform", "normal", "uniform_x100", "uniform_xneg100"]
INPUT_SEED = 42
REQUEST = dict(seeds=SEEDS, distributions=DISTRIBUTIONS, tolerance=TOLERANCE, input_seed=INPUT_SEED)
BASE_OPTIONS = ["--std=c++11", "--fmad=false"]
# Tail controls whose eager result has subnormals that --ftz=true flushes: subnormal inputs
# (task 95's add lifts them to normal values), and exp(-88)-sized sigmoids (+-88, -87.5).
FLUSHED_CONTROLS = {
    53: ["tail/zeros_tiny"],
    81: ["tail/zeros_tiny", "tail/large"],
    95: ["tail/large"],
}
VARIANTS = {
    "nvrtc-cubin-noftz": [*BASE_OPTIONS, "--ftz=false"],
    "nvrtc-cubin-ftz": [*BASE_OPTIONS, "--ftz=true"],
}


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int32)


@pytest.fixture(scope="module")
def pinned(kb_repo, tmp_path_factory):
    """(checkout, pin record, pin path) of the small KernelBench repository."""
    root = tmp_path_factory.mktemp("correctness-pin")
    url, commit = kb_repo
    checkout, pin_path = root / "checkout", root / "pin.json"
    pin = pin_kernelbench(url, commit, 2, list(TASKS), checkout, pin_path)
    return checkout, pin, pin_path


def cpu_model(pinned, task: int, seed: int = 0):
    checkout, pin, _ = pinned
    return build_model(load_task(checkout, pin, task), seed=seed, device="cpu")


# --------------------------------------------------------------------------- CPU: requests


def test_check_request_normalises_valid_parameters():
    request = check_request((0, 3), ("normal",), {"atol": 1e-4, "rtol": 0}, 42)
    assert request == {
        "seeds": [0, 3],
        "distributions": ["normal"],
        "tolerance": {"atol": 1e-4, "rtol": 0.0},
        "input_seed": 42,
    }


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (([], DISTRIBUTIONS, TOLERANCE, 0), "seeds must be a non-empty list"),
        (([0, -1], DISTRIBUTIONS, TOLERANCE, 0), "seeds: -1"),
        (([0, 0], DISTRIBUTIONS, TOLERANCE, 0), "seeds repeat"),
        (([True], DISTRIBUTIONS, TOLERANCE, 0), "seeds: True"),
        (([0], "uniform", TOLERANCE, 0), "distributions must be a list"),
        (([0], [], TOLERANCE, 0), "distributions is empty"),
        (([0], ["uniform", "gauss"], TOLERANCE, 0), "'gauss'"),
        (([0], ["normal", "normal"], TOLERANCE, 0), "distributions repeat"),
        (([0], DISTRIBUTIONS, {"atol": 1e-4}, 0), "tolerance.rtol"),
        (([0], DISTRIBUTIONS, {"atol": -1, "rtol": 0}, 0), "tolerance.atol"),
        (([0], DISTRIBUTIONS, {"atol": math.nan, "rtol": 0}, 0), "tolerance.atol"),
        (([0], DISTRIBUTIONS, 1e-4, 0), "tolerance must be a mapping"),
        (([0], DISTRIBUTIONS, TOLERANCE, -3), "input_seed"),
    ],
)
def test_check_request_names_the_bad_value(args, message):
    with pytest.raises(KbfuseError, match=message):
        check_request(*args)


def test_run_correctness_rejects_bad_input_before_any_work(tmp_path):
    out = tmp_path / "out.json"
    meta = tmp_path / "meta.json"
    write_json(meta, {"kind": "compile", "variant": "other-variant", "artifact_sha256": "0" * 64})
    common = dict(
        task=81,
        artifact=tmp_path / "tails.bin",
        meta_path=meta,
        checkout=tmp_path / "checkout",
        pin_path=tmp_path / "pin.json",
        out=out,
    )
    request = dict(seeds=[0], distributions=["uniform"], tolerance=TOLERANCE, input_seed=0)
    with pytest.raises(KbfuseError, match="'gaussian'"):
        bad = {**request, "distributions": ["gaussian"]}
        run_correctness(variant="v", request=bad, **common)
    with pytest.raises(KbfuseError, match=r"missing \['input_seed'\], unknown \['seed'\]"):
        bad = {**{k: v for k, v in request.items() if k != "input_seed"}, "seed": 0}
        run_correctness(variant="v", request=bad, **common)
    with pytest.raises(KbfuseError, match="is for variant 'other-variant', not 'v'"):
        run_correctness(variant="v", request=request, **common)
    with pytest.raises(KbfuseError, match="unknown compiled baseline 'eager'"):
        run_baselines(81, tmp_path, tmp_path / "pin.json", request, out, implementations=["eager"])
    assert not out.exists()


def test_run_correctness_variants_checks_variants_and_outputs_before_any_work(tmp_path):
    metas = {}
    for name in ("a", "b"):
        metas[name] = tmp_path / f"{name}.json"
        write_json(metas[name], {"kind": "compile", "variant": name, "artifact_sha256": "0" * 64})
    variants = {name: (tmp_path / f"{name}.bin", meta) for name, meta in metas.items()}
    outs = {name: tmp_path / "out" / f"{name}.json" for name in metas}
    common = dict(
        task=81,
        checkout=tmp_path / "checkout",
        pin_path=tmp_path / "pin.json",
        request=dict(
            seeds=[0], distributions=["uniform"], tolerance=TOLERANCE, input_seed=INPUT_SEED
        ),
    )
    with pytest.raises(KbfuseError, match=r"no output path for \['b'\]"):
        run_correctness_variants(variants=variants, outs={"a": outs["a"]}, **common)
    with pytest.raises(KbfuseError, match=r"an output path but no artifact for \['c'\]"):
        run_correctness_variants(
            variants=variants, outs={**outs, "c": tmp_path / "c.json"}, **common
        )
    with pytest.raises(KbfuseError, match="two variants share an output path"):
        run_correctness_variants(variants=variants, outs={"a": outs["a"], "b": outs["a"]}, **common)
    with pytest.raises(KbfuseError, match="variants must be a non-empty mapping"):
        run_correctness_variants(variants={}, outs={}, **common)
    with pytest.raises(KbfuseError, match="expected \\(artifact, meta path\\)"):
        run_correctness_variants(variants={"a": metas["a"]}, outs={"a": outs["a"]}, **common)
    swapped = {"a": variants["b"], "b": variants["a"]}
    with pytest.raises(KbfuseError, match=r"b\.json is for variant 'b', not 'a'"):
        run_correctness_variants(variants=swapped, outs=outs, **common)
    assert not (tmp_path / "out").exists()


# --------------------------------------------------------------------------- CPU: control values


def test_ulp_window_is_consecutive_float32_values():
    window = ulp_window(1.0, 2)
    as_bits = [int(np.float32(v).view(np.uint32)) for v in window]
    assert as_bits == [0x3F7FFFFE, 0x3F7FFFFF, 0x3F800000, 0x3F800001, 0x3F800002]


def test_task53_bounds_and_the_prescale_values_that_land_on_them(pinned):
    model = cpu_model(pinned, 53)
    values = tail_for(53).bound_values(model)
    scale = np.float32(model.scaling_factor)
    for bound in (np.float32(model.hardtanh.min_val), np.float32(model.hardtanh.max_val)):
        neighbours = {
            float(np.nextafter(bound, np.float32(-np.inf))),
            float(np.nextafter(bound, np.float32(np.inf))),
        }
        assert {float(bound)} | neighbours <= set(values)
        scaled = {float(np.float32(v) * scale) for v in values}
        assert float(bound) in scaled  # some input lands exactly on the bound ...
        assert neighbours <= scaled  # ... and others just inside and just outside it
    assert len(values) <= CONTROL_ROWS


def test_task81_bounds_straddle_the_upper_clamp(pinned):
    values = torch.tensor(tail_for(81).bound_values(cpu_model(pinned, 81)))
    for bound in (-1.0, 1.0):
        assert bound in values.tolist()
    clamp_input = values * torch.sigmoid(values) / 2.0  # task 81's ops before the clamp
    assert (clamp_input < 1.0).any() and (clamp_input >= 1.0).any()
    near = values[(values > 2) & (values < 3)]
    assert len(near) == 9  # +-4 float32 ulps around the crossing


def test_task95_bounds(pinned):
    assert tail_for(95).bound_values(cpu_model(pinned, 95)) == ulp_window(-1.0, 1) + ulp_window(
        1.0, 1
    )


def test_tiny_and_large_values_cover_the_ftz_hazards():
    tiny = torch.tensor(tiny_values(), dtype=torch.float32)
    tiny_bits = set(bits(tiny).tolist())
    assert {0x00000000, -0x80000000} <= tiny_bits  # +0.0 and -0.0
    assert {0x00000001, 0x007FFFFF, 0x00800000} <= tiny_bits  # subnormal ends, FLT_MIN
    subnormal = (tiny != 0) & (tiny.abs() < torch.finfo(torch.float32).tiny)
    assert int(subnormal.sum()) == 8  # four magnitudes, both signs
    large = large_values()
    assert {-88.0, 88.0, -87.5, 87.5, 1e30, -1e30} <= set(large)
    assert len(tiny_values()) <= CONTROL_ROWS and len(large) <= CONTROL_ROWS


def test_value_rows_and_mixed_rows():
    rows = value_rows([1.0, -0.0, 3.0], cols=5, rows=7)
    assert rows.shape == (7, 5) and rows.is_contiguous()
    assert rows[:, 0].tolist() == [1.0, -0.0, 3.0, 1.0, -0.0, 3.0, 1.0]
    assert torch.equal(rows, rows[:, :1].expand(7, 5))
    assert bits(rows)[1, 0] == -0x80000000
    with pytest.raises(KbfuseError, match="need 1..2 control values, got 3"):
        value_rows([1.0, 2.0, 3.0], cols=4, rows=2)
    mixed = mixed_rows([math.inf, math.nan, 1.0], cols=4, rows=3)
    assert torch.isinf(mixed[0, 0]) and torch.isnan(mixed[0, 1]) and torch.isnan(mixed[1, 0])
    for row in mixed:  # every row mixes non-finite and finite values
        assert torch.isnan(row).any() and torch.isinf(row).any() and torch.isfinite(row).any()


@pytest.mark.parametrize("task", TASKS)
def test_control_inputs_and_why_nan_cases_need_equal_nan(pinned, task):
    model = cpu_model(pinned, task)
    tail = tail_for(task)
    cols = tail.library(model).out_features
    controls = control_inputs(tail, model, cols)
    assert list(controls) == ["tail/bounds", "tail/zeros_tiny", "tail/large", "tail/nonfinite"]
    for y in controls.values():
        assert y.shape == (CONTROL_ROWS, cols) and y.dtype == torch.float32
    reference = tail.reference(model, controls["tail/nonfinite"])
    # NaN inputs give NaN outputs in every task: the reference fails allclose with itself.
    assert torch.isnan(reference).any()
    assert not torch.allclose(reference, reference, atol=1e-4, rtol=1e-4)
    for name in ("tail/bounds", "tail/zeros_tiny", "tail/large"):
        assert not torch.isnan(tail.reference(model, controls[name])).any(), name


# --------------------------------------------------------------------------- CPU: gate and assembly


def test_check_case_gates_on_the_official_predicate():
    ref = torch.tensor([1.0, 2.0, -3.0])
    same = check_case(ref, ref.clone(), TOLERANCE, "same", "full_program")
    assert set(CASE_RECORD_KEYS) <= set(same)
    assert same["gate"] == "official" and same["gate_pass"] and same["official_pass"]
    assert same["bit_equal"] == 3
    off = check_case(ref, ref + torch.tensor([0.0, 0.0, 1e-2]), TOLERANCE, "off", "full_program")
    assert off["gate"] == "official" and not off["gate_pass"] and not off["official_pass"]
    nan_candidate = check_case(ref, torch.tensor([1.0, math.nan, -3.0]), TOLERANCE, "n", "g")
    assert not nan_candidate["gate_pass"]


def test_check_case_uses_equal_nan_only_where_the_reference_has_nan():
    ref = torch.tensor([math.nan, 1.0, math.inf, -0.5])
    exact = check_case(ref, ref.clone(), TOLERANCE, "tail/nonfinite", "tail_control")
    assert exact["gate"] == "official_equal_nan"
    assert exact["official_pass"] is False  # torch.allclose(ref, ref) with equal_nan=False
    assert exact["gate_pass"] is True and exact["equal_nan_pass"] is True
    inner = exact["official_on_non_nan_reference"]
    assert inner["elements"] == 3 and inner["official_pass"] and inner["bit_equal"] == 3
    assert inner["name"] == "tail/nonfinite[non-NaN reference]"
    finite_instead = check_case(
        ref, torch.tensor([0.0, 1.0, math.inf, -0.5]), TOLERANCE, "a", "tail_control"
    )
    assert not finite_instead["gate_pass"]  # NaN must stay NaN
    wrong_elsewhere = check_case(
        ref, torch.tensor([math.nan, 1.5, math.inf, -0.5]), TOLERANCE, "b", "tail_control"
    )
    assert not wrong_elsewhere["gate_pass"]
    assert not wrong_elsewhere["official_on_non_nan_reference"]["official_pass"]
    nan_elsewhere = check_case(
        ref, torch.tensor([math.nan, math.nan, math.inf, -0.5]), TOLERANCE, "c", "tail_control"
    )
    assert not nan_elsewhere["gate_pass"]


def test_gated_ratio_ignores_the_nan_positions_of_the_reference():
    ref = torch.tensor([math.nan, 1.0, 2.0])
    cand = torch.tensor([math.nan, 1.0, 2.0 + 1e-4])
    case = check_case(ref, cand, TOLERANCE, "tail/nonfinite", "tail_control")
    assert case["max_ratio_official"] == math.inf and case["gate_pass"]
    result = assemble([case], {"capturable": True, "error": None})
    assert result["summary"]["max_ratio_official"] == math.inf
    # about 1e-4 / (atol + rtol * 2) = 1/3; the float32 difference is not exactly 1e-4
    assert 0.3 < result["gated_max_ratio_official"] < 0.36


def test_assemble_lists_failing_checks_and_capture_failures():
    ref = torch.tensor([1.0, 2.0])
    good = check_case(ref, ref.clone(), TOLERANCE, "seed0/uniform", "full_program")
    bad = check_case(ref, ref * 2, TOLERANCE, "tail/large", "tail_control")
    result = assemble([good, bad], {"capturable": True, "error": None})
    assert result["passed"] is False and result["failing_checks"] == ["tail/large"]
    assert result["summary"]["cases"] == 2 and result["summary"]["official_passes"] == 1
    assert result["gated_max_ratio_official"] == bad["max_ratio_official"] > 1
    ok = assemble([good], {"capturable": True, "error": None})
    assert ok["gated_max_ratio_official"] == 0.0
    assert ok["passed"] is True and ok["failing_checks"] == []
    uncapturable = assemble([good], {"capturable": False, "error": "RuntimeError: x"})
    assert uncapturable["passed"] is False and uncapturable["failing_checks"] == ["graph/capture"]


# --------------------------------------------------------------------------- CPU: shared cases


def cpu_checks(pinned, task: int) -> correctness.TaskChecks:
    checkout, pin, _ = pinned
    spec = load_task(checkout, pin, task)
    model = build_model(spec, seed=INPUT_SEED, device="cpu")
    request = check_request(SEEDS, DISTRIBUTIONS, TOLERANCE, INPUT_SEED)
    return correctness.TaskChecks(spec, model, tail_for(task), request, correctness.Progress(None))


def cpu_maker(name: str, tail, scale: float):
    """model -> the eager model (scale 1: bit-identical) or its output scaled (off by a
    factor), as a SubjectMaker."""

    def make(model) -> correctness.Subject:
        def full(x):
            with torch.no_grad():
                return model(x) * scale

        def tail_only(y):
            return tail.reference(model, y) * scale

        return correctness.Subject(name=name, full=full, tail=tail_only, capture=model)

    return make


def cpu_subject(name: str, checks: correctness.TaskChecks, scale: float):
    return cpu_maker(name, tail_for(checks.spec.task), scale)


def shared_cases(checks, makers) -> dict[str, list[dict]]:
    cases = {make(checks.model).name: [] for make in makers}
    checks.full_program(makers, cases)
    subjects = [make(checks.model) for make in makers]
    checks.timing_input(subjects, cases)
    checks.tail_controls(subjects, cases)
    return cases


class CountingTail:
    """A task's Tail whose reference() counts its calls."""

    def __init__(self, tail):
        self._tail, self.calls = tail, 0

    def reference(self, model, y):
        self.calls += 1
        return self._tail.reference(model, y)

    def __getattr__(self, name):
        return getattr(self._tail, name)


@pytest.mark.parametrize("task", TASKS)
def test_shared_cases_compute_each_reference_once_and_match_single_runs(pinned, task):
    checks = cpu_checks(pinned, task)
    subjects = [cpu_subject("same", checks, 1.0), cpu_subject("off", checks, 1.5)]
    eager_calls = []
    eager = checks.eager
    checks.eager = lambda x, model=None: eager_calls.append(x.shape) or eager(x, model)
    checks.tail = CountingTail(checks.tail)
    together = shared_cases(checks, subjects)
    n_full = len(SEEDS) * len(DISTRIBUTIONS)
    n_controls = 6 if task == 95 else 5
    # one eager reference per input and one tail reference per control, for both subjects
    assert len(eager_calls) == n_full + 1 and checks.tail.calls == n_controls
    alone = {name: shared_cases(checks, [s]) for name, s in zip(together, subjects, strict=True)}
    assert len(eager_calls) == 3 * (n_full + 1) and checks.tail.calls == 3 * n_controls
    for name in together:
        assert together[name] == alone[name][name]
    names = [case["name"] for case in together["same"]]
    assert len(names) == n_full + 1 + n_controls
    assert names[:n_full] == [f"seed{s}/{d}" for s in SEEDS for d in DISTRIBUTIONS]
    assert names[n_full:] == [
        f"timing/seed{INPUT_SEED}/uniform",
        *checks.control_tensors(),
    ]
    assert all(c["bit_equal"] == c["elements"] for c in together["same"])
    assert not any(c["bit_equal"] == c["elements"] for c in together["off"][:n_full])


@pytest.mark.parametrize("task", TASKS)
def test_each_seed_checks_its_own_model_as_the_study_did(pinned, task):
    """Seeds x distributions: each seed builds the model right after seeding (its own weights),
    the subjects are built on that model, and the record names every model by its weights."""
    from kbfuse.tasks.weights import weights_sha256

    checks = cpu_checks(pinned, task)
    seen = []

    def recording_maker(model):
        seen.append(weights_sha256(model))
        return cpu_maker("same", tail_for(task), 1.0)(model)

    cases = {"same": []}
    weights = checks.full_program([recording_maker], cases)
    assert list(weights) == [str(seed) for seed in SEEDS]
    assert len(set(weights.values())) == len(SEEDS)  # 5 weight sets
    assert seen == list(weights.values())
    spec = checks.spec
    for seed in SEEDS:
        assert weights[str(seed)] == weights_sha256(build_model(spec, seed=seed, device="cpu"))
    assert weights_sha256(checks.model) not in weights.values()  # the timing seed's model
    # bit-identical to eager on each seed's own model, every case
    assert all(case["bit_equal"] == case["elements"] for case in cases["same"])
    # an implementation bound to the timing seed's weights fails the other seeds' cases
    stale = {"stale": []}
    checks.full_program(
        [lambda model: cpu_maker("stale", tail_for(task), 1.0)(checks.model)], stale
    )
    assert not all(case["bit_equal"] == case["elements"] for case in stale["stale"])


@pytest.fixture
def cpu_stage(pinned, tmp_path, monkeypatch):
    """run_correctness(_variants) on the CPU: the model on the CPU, each "module" a stand-in
    whose output is the eager one times the factor its metadata names, no CUDA graph part.
    Checks the stage's plumbing (one model, records per variant, files) without a GPU."""
    from kbfuse.compilation import launch

    class FakeModule:
        def __init__(self, artifact, meta):
            self.artifact, self.meta = artifact, meta

    loads = []

    def load(artifact, meta, kernels=()):
        loads.append(meta["variant"])
        return FakeModule(artifact, meta)

    def fake_subject(name, mod, tail, model):
        scale = mod.meta["scale"]

        def full(x):
            with torch.no_grad():
                return model(x) * scale

        return correctness.Subject(
            name, full, lambda y: tail.reference(model, y) * scale, capture=full
        )

    builds = []
    real_build = correctness.build_model

    def build_on_cpu(spec, seed, device="cuda"):
        builds.append((spec.task, seed, device))
        return real_build(spec, seed=seed, device="cpu")

    monkeypatch.setattr(launch.LoadedModule, "load", staticmethod(load))
    monkeypatch.setattr(correctness, "variant_subject", fake_subject)
    monkeypatch.setattr(correctness, "build_model", build_on_cpu)
    monkeypatch.setattr(taskchecks, "build_model", build_on_cpu)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(
        correctness.TaskChecks,
        "graph_replay",
        lambda self, subject: ([], {"capturable": True, "error": None}),
    )
    variants = {}
    for name, scale in (("exact", 1.0), ("scaled", 1.5), ("exact-too", 1.0)):
        meta = tmp_path / "compile" / name / "meta.json"
        record = {"kind": "compile", "variant": name, "scale": scale, "kernel": "naive"}
        write_json(meta, {**record, "route": "nvrtc-cubin", "artifact_sha256": name * 4})
        variants[name] = (meta.parent / "tails.bin", meta)
    checkout, _, pin_path = pinned
    request = dict(
        checkout=checkout,
        pin_path=pin_path,
        request=dict(
            seeds=SEEDS, distributions=DISTRIBUTIONS, tolerance=TOLERANCE, input_seed=INPUT_SEED
        ),
    )
    return variants, request, loads, builds


@pytest.mark.parametrize("task", TASKS)
def test_variants_stage_on_a_cpu_stand_in_matches_single_variant_runs(cpu_stage, tmp_path, task):
    variants, request, loads, builds = cpu_stage
    outs = {name: tmp_path / "together" / f"{name}.json" for name in variants}
    log = tmp_path / "together.log"
    records = run_correctness_variants(task, variants, outs, log=log, **request)
    # the timing seed's model, then one per correctness seed (on the device of the first)
    assert builds == [(task, INPUT_SEED, "cuda")] + [(task, s, "cpu") for s in SEEDS]
    assert loads == list(variants)
    assert list(records) == list(variants)
    for name, (artifact, meta) in variants.items():
        alone = tmp_path / "alone" / f"{name}.json"
        single = run_correctness(task, name, artifact, meta, out=alone, **request)
        assert single == records[name]
        assert outs[name].read_bytes() == alone.read_bytes(), name
        assert read_json(outs[name]) == json.loads(json.dumps(jsonable(records[name])))
    # one set of models for the whole job, one more set per single run
    assert len(builds) == (1 + len(SEEDS)) * (1 + len(variants))
    exact, scaled = records["exact"], records["scaled"]
    assert len(set(exact["weights_sha256"].values())) == len(SEEDS) + 1
    assert exact["kind"] == "correctness" and exact["implementation"] == "exact"
    assert exact["provenance"]["variant"] == "exact"
    assert exact["provenance"]["artifact_sha256"] == "exact" * 4
    assert exact["passed"] and exact["summary"]["bit_identical_cases"] == exact["summary"]["cases"]
    assert not scaled["passed"] and "seed0/uniform" in scaled["failing_checks"]
    text = log.read_text()
    assert "checking exact, scaled, exact-too on task" in text
    assert all(f"wrote {path}" in text for path in outs.values())


def test_variants_stage_writes_no_file_when_one_write_fails(cpu_stage, tmp_path, monkeypatch):
    variants, request, _, _ = cpu_stage
    outs = {name: tmp_path / "out" / f"{name}.json" for name in variants}
    real_write = stage.write_json

    def failing_write(path, record):
        if Path(path).name == "scaled.json":
            raise OSError("disk full")
        real_write(path, record)

    monkeypatch.setattr(stage, "write_json", failing_write)
    with pytest.raises(OSError, match="disk full"):
        run_correctness_variants(81, variants, outs, **request)
    assert not [p for p in (tmp_path / "out").rglob("*") if p.is_file()]


def test_run_all_refuses_repeated_or_missing_implementations(pinned):
    checks = cpu_checks(pinned, 81)
    same = cpu_subject("same", checks, 1.0)
    with pytest.raises(KbfuseError, match=r"implementation names repeat: \['same', 'same'\]"):
        checks.run_all([same, same])
    with pytest.raises(KbfuseError, match="no implementation to check"):
        checks.run_all([])


# --------------------------------------------------------------------------- CPU: baselines


def test_set_numerics_turns_tf32_off():
    record = baselines.set_numerics()
    assert record == {
        "cuda_matmul_allow_tf32": False,
        "cudnn_allow_tf32": False,
        "float32_matmul_precision": "highest",
    }


@pytest.mark.parametrize("task", TASKS)
def test_tail_module_is_the_reference_tail_and_shares_parameters(pinned, task):
    model = cpu_model(pinned, task, seed=3)
    tail = tail_for(task)
    x = torch.rand(*load_task(pinned[0], pinned[1], task).input_shape()) * 10 - 5
    with torch.no_grad():
        y = tail.library(model)(x)
        expected = model(x)
    module = baselines.tail_module(model, tail)
    assert isinstance(getattr(model, tail.library_attr), torch.nn.Linear)  # original untouched
    assert isinstance(getattr(module, tail.library_attr), torch.nn.Identity)
    got = baselines.eager(module)(y)
    assert torch.equal(bits(got), bits(expected))
    assert torch.equal(bits(got), bits(tail.reference(model, y)))
    shared = {id(p) for p in module.parameters()}
    assert shared <= {id(p) for p in model.parameters()}
    if task == 95:
        assert module.add_value is model.add_value


def test_torchscript_builder_is_a_frozen_trace(pinned):
    model = cpu_model(pinned, 53)
    x = torch.rand(*load_task(pinned[0], pinned[1], 53).input_shape())
    program = baselines.build("torchscript", model, x)
    with torch.no_grad():
        expected = model(x)
    assert torch.allclose(program(x), expected, atol=1e-6, rtol=1e-6)
    assert not program(x).requires_grad
    with pytest.raises(KbfuseError, match="unknown baseline 'jax'"):
        baselines.build("jax", model, x)


def test_tail_module_needs_the_linear_attribute(pinned):
    model = cpu_model(pinned, 81)
    with pytest.raises(KbfuseError, match="no submodule 'matmul'"):
        baselines.tail_module(model, tail_for(95))


# --------------------------------------------------------------------------- GPU

_COMPILE_IN_CHILD = """
import json, sys
from kbfuse.compilation.compile import compile_variant
for job in json.loads(sys.argv[1]):
    compile_variant(job["source"], job["variant"], job["spec"], "auto", job["artifact"],
                    job["meta"], job["log"])
"""


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
    """variant -> (artifact, meta path): kernels/naive.cu as nvrtc-cubin, compiled in a child
    process whose CUDA compute cache is private and disabled."""
    from kbfuse.compilation import cudacache

    root = tmp_path_factory.mktemp("correctness-compile")
    jobs, out = [], {}
    for name, options in VARIANTS.items():
        folder = root / name
        folder.mkdir()
        spec = {"route": "nvrtc-cubin", "kernel": "naive", "options": options}
        jobs.append(
            {
                "source": str(SOURCE),
                "variant": name,
                "spec": spec,
                "artifact": str(folder / "tails.bin"),
                "meta": str(folder / "meta.json"),
                "log": str(folder / "compile.log"),
            }
        )
        out[name] = (folder / "tails.bin", folder / "meta.json")
    env = cudacache.isolated_env(root / "scratch")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "src"), env.get("PYTHONPATH")]))
    proc = subprocess.run(
        [sys.executable, "-c", _COMPILE_IN_CHILD, json.dumps(jobs)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, f"compile failed:\n{proc.stdout}\n{proc.stderr}"
    return out


def correctness_record(pinned, artifacts, tmp_path, task, variant):
    checkout, _, pin_path = pinned
    artifact, meta = artifacts[variant]
    out, log = tmp_path / f"{task}-{variant}.json", tmp_path / f"{task}-{variant}.log"
    record = run_correctness(task, variant, artifact, meta, checkout, pin_path, REQUEST, out, log)
    assert read_json(out) == json.loads(json.dumps(jsonable(record)))
    assert "wrote" in log.read_text()
    return record


def by_name(cases) -> dict:
    return {case["name"]: case for case in cases}


@pytest.mark.gpu
@pytest.mark.parametrize("task", TASKS)
def test_noftz_variant_passes_and_is_bit_identical_everywhere(pinned, artifacts, tmp_path, task):
    record = correctness_record(pinned, artifacts, tmp_path, task, "nvrtc-cubin-noftz")
    meta = read_json(artifacts["nvrtc-cubin-noftz"][1])
    assert record["kind"] == "correctness" and record["implementation"] == "nvrtc-cubin-noftz"
    assert record["provenance"]["artifact_sha256"] == meta["artifact_sha256"]
    assert record["provenance"]["pin_commit"] == pinned[1]["commit"]
    assert record["provenance"]["task_sha256"] == pinned[1]["tasks"][str(task)]["sha256"]
    assert record["numerics"]["cuda_matmul_allow_tf32"] is False
    assert record["passed"] is True and record["failing_checks"] == []
    cases = by_name(record["cases"])
    assert {case["group"] for case in record["cases"]} == set(GROUPS)
    expected_full = {f"seed{s}/{d}" for s in SEEDS for d in DISTRIBUTIONS}
    assert expected_full <= set(cases)
    assert f"timing/seed{INPUT_SEED}/uniform" in cases
    nudges = ["graph/input_mul_0.9", "graph/weight_add_1e-5"]
    nudges += ["graph/add_value_add_0.01"] if task == 95 else []
    graph = nudges + ["graph/new_input", "graph/new_weights"]
    graph += ["graph/new_add_value"] if task == 95 else []
    assert [c["name"] for c in record["cases"] if c["group"] == "graph_replay"] == graph
    assert record["graph_capture"] == {"capturable": True, "error": None}
    unequal = {
        c["name"]: c["bit_equal"] for c in record["cases"] if c["bit_equal"] != c["elements"]
    }
    assert unequal == {}
    summary = record["summary"]
    assert summary["bit_identical_cases"] == summary["cases"] == len(record["cases"])
    assert summary["elements_bit_equal"] == summary["elements"]
    nonfinite = cases["tail/nonfinite"]
    assert nonfinite["gate"] == "official_equal_nan" and nonfinite["official_pass"] is False
    assert nonfinite["gate_pass"] is True and nonfinite["equal_nan_pass"] is True
    for case in record["cases"]:
        if case["name"] != "tail/nonfinite":
            assert case["official_pass"] and case["historical_pass"], case["name"]


@pytest.mark.gpu
@pytest.mark.parametrize("task", TASKS)
def test_ftz_variant_passes_official_but_flushes(pinned, artifacts, tmp_path, task):
    record = correctness_record(pinned, artifacts, tmp_path, task, "nvrtc-cubin-ftz")
    assert record["passed"] is True, record["failing_checks"]
    assert record["summary"]["bit_identical_cases"] < record["summary"]["cases"]
    cases = by_name(record["cases"])
    for name in FLUSHED_CONTROLS[task]:
        assert cases[name]["official_pass"], name
        assert cases[name]["bit_equal"] < cases[name]["elements"], name


@pytest.mark.gpu
@pytest.mark.parametrize("task", TASKS)
def test_one_job_for_every_variant_writes_what_single_variant_jobs_write(
    pinned, artifacts, tmp_path, task
):
    """run_correctness_variants (the workflow's job: one model, shared eager references)
    writes, byte for byte, the files run_correctness writes for each variant alone."""
    checkout, _, pin_path = pinned
    outs = {name: tmp_path / "together" / f"{name}.json" for name in artifacts}
    log = tmp_path / "together.log"
    records = run_correctness_variants(task, artifacts, outs, checkout, pin_path, REQUEST, log)
    assert list(records) == list(artifacts)
    for name in artifacts:
        single = correctness_record(pinned, artifacts, tmp_path, task, name)
        assert records[name] == single
        alone = tmp_path / f"{task}-{name}.json"
        assert outs[name].read_bytes() == alone.read_bytes(), name
        assert f"wrote {outs[name]}" in log.read_text()
    assert records["nvrtc-cubin-noftz"]["passed"] and records["nvrtc-cubin-ftz"]["passed"]


@pytest.mark.gpu
def test_ftz_variant_differs_from_eager_at_minus_88_for_task81(pinned, artifacts):
    from kbfuse.compilation.launch import LoadedModule, run_tail

    checkout, pin, _ = pinned
    model = build_model(load_task(checkout, pin, 81), seed=INPUT_SEED, device="cuda")
    tail = tail_for(81)
    y = torch.full((2, 64), -88.0, device="cuda")
    reference = tail.reference(model, y)
    outputs = {}
    for variant, (artifact, meta) in artifacts.items():
        outputs[variant] = run_tail(LoadedModule.load(artifact, read_json(meta)), tail, model, y)
    torch.cuda.synchronize()
    assert torch.equal(bits(outputs["nvrtc-cubin-noftz"]), bits(reference))
    assert not torch.equal(bits(outputs["nvrtc-cubin-ftz"]), bits(reference))
    assert torch.allclose(reference, outputs["nvrtc-cubin-ftz"], atol=1e-4, rtol=1e-4)


@pytest.mark.gpu
def test_graph_replay_restores_the_parameters_it_changes(pinned, artifacts):
    from kbfuse.compilation.launch import LoadedModule

    checkout, pin, _ = pinned
    spec = load_task(checkout, pin, 95)
    model = build_model(spec, seed=INPUT_SEED, device="cuda")
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    request = check_request(SEEDS, DISTRIBUTIONS, TOLERANCE, INPUT_SEED)
    checks = correctness.TaskChecks(spec, model, tail_for(95), request, correctness.Progress(None))
    artifact, meta = artifacts["nvrtc-cubin-noftz"]
    mod = LoadedModule.load(artifact, read_json(meta))
    subject = correctness.variant_subject("noftz", mod, tail_for(95), model)
    cases, capture = checks.graph_replay(subject)
    assert capture["capturable"] and [c["bit_equal"] == c["elements"] for c in cases] == [True] * 6
    for name, param in model.named_parameters():
        assert torch.equal(bits(param.detach()), bits(before[name])), name


@pytest.mark.gpu
def test_run_baselines_checks_torchscript_and_inductor(pinned, tmp_path):
    checkout, pin, pin_path = pinned
    out, log = tmp_path / "baselines.json", tmp_path / "baselines.log"
    request = {**REQUEST, "seeds": [0], "distributions": ["uniform", "uniform_xneg100"]}
    record = run_baselines(95, checkout, pin_path, request, out, log)
    assert read_json(out) == json.loads(json.dumps(jsonable(record)))
    assert record["kind"] == "correctness_baselines" and record["task"] == 95
    assert record["provenance"]["task_sha256"] == pin["tasks"]["95"]["sha256"]
    assert set(record["implementations"]) == {"torchscript", "inductor"}
    for name, result in record["implementations"].items():
        cases = by_name(result["cases"])
        assert {
            "seed0/uniform",
            "seed0/uniform_xneg100",
            f"timing/seed{INPUT_SEED}/uniform",
        } <= set(cases)
        assert {"tail/linear_output", "tail/bounds", "tail/nonfinite"} <= set(cases)
        assert result["summary"]["cases"] == len(result["cases"])
        assert isinstance(result["passed"], bool)
        assert set(result["failing_checks"]) == {
            c["name"] for c in result["cases"] if not c["gate_pass"]
        } | ({"graph/capture"} if not result["graph_capture"]["capturable"] else set())
        for key in ("seed0/uniform", "tail/linear_output"):
            assert cases[key]["official_pass"], (name, key)
    inductor = record["implementations"]["inductor"]
    assert inductor["graph_capture"]["capturable"] is True
    graph = by_name(inductor["cases"])
    assert graph["graph/new_input"]["official_pass"]
    assert graph["graph/new_weights"]["official_pass"]  # parameters are inputs of the graph
    assert graph["graph/new_add_value"]["official_pass"]
    assert graph["graph/weight_add_1e-5"]["official_pass"]
    assert graph["graph/add_value_add_0.01"]["official_pass"]


@pytest.mark.gpu
def test_write_fingerprint_records_the_machine_and_a_positive_bandwidth(tmp_path):
    from kbfuse.workflow.envinfo import write_fingerprint

    out, log = tmp_path / "fingerprint.json", tmp_path / "env.log"
    record = write_fingerprint(out, log, copy_bytes=256 * 1024**2)
    assert read_json(out) == json.loads(json.dumps(jsonable(record)))
    assert record["kind"] == "env"
    gpu = record["gpu"]
    assert gpu["name"] == torch.cuda.get_device_name(0)
    assert gpu["sm_count"] > 0 and gpu["memory_bytes"] > 0
    major, minor = torch.cuda.get_device_capability(0)
    assert gpu["compute_capability"] == f"{major}.{minor}"
    assert record["torch"] == torch.__version__ and record["torch_cuda"] == torch.version.cuda
    bandwidth = record["copy_bandwidth"]
    assert bandwidth["gbps"] > 0 and bandwidth["median_ms"] > 0
    assert bandwidth["bytes_moved"] == 2 * bandwidth["buffer_bytes"] == 2 * 256 * 1024**2
    assert record["nvrtc"]["version"] is not None
    assert "cuda_cache" in record and "copy bandwidth" in log.read_text()
