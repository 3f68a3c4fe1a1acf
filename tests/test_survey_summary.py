"""The survey's tables from records built by hand per the contract: values, order, flags,
failures, unclassified kernels, TF32 comparison, refusals."""

from __future__ import annotations

import shutil
from pathlib import Path

import pandas as pd
import pytest
from survey_records import CONV, GELU, GEMM, TRITON, failed, kernel, ok, record, write_records

from kbfuse.errors import KbfuseError
from kbfuse.io import write_json
from kbfuse.survey import summary as s

DATA = Path(__file__).parent / "data" / "kernelbench_timing"


@pytest.fixture
def checkout(tmp_path):
    shutil.copytree(DATA, tmp_path / "checkout" / "results" / "timing")
    return tmp_path / "checkout"


def conv_record(mode="strict", **kw):
    """Task 1: a convolution where the library takes most of the time."""
    return record(
        task=1,
        mode=mode,
        flops={"aten.convolution": 2_000_000_000_000},
        baselines={
            "eager": ok(9.1 if mode == "strict" else 3.9, [kernel(CONV, 8000.0)], cold=9.2),
            "torchscript": failed("build", "RuntimeError", "trace failed"),
            "inductor": ok(
                8.0 if mode == "strict" else 3.0, [kernel(CONV, 7800.0), kernel(TRITON, 150.0)]
            ),
        },
        **kw,
    )


def test_the_build_time_is_from_cold_caches_max_autotunes_warm_up_where_it_had_one():
    autotuned = ok(0.2, [kernel(GEMM, 180.0)]) | {"build_s": 1.25, "warm_build_s": 21.0}
    rec = record()
    rec["baselines"]["inductor-max-autotune-no-cudagraphs"] = autotuned
    row = s.main_rows([rec], anchor=None)[0]
    assert (row["best_compiled"], row["best_build_s"]) == (
        "inductor-max-autotune-no-cudagraphs",
        21.0,
    )
    assert s.cold_build_s({"build_s": 0.5}) == 0.5  # a record made before the warm-up
    assert s.cold_build_s({"build_s": 0.5, "warm_build_s": None}) == 0.5


def test_main_row_of_a_gemm_task():
    row = s.main_rows([record()], anchor=None)[0]
    assert row["method"] == "graph"
    assert (row["eager_ms"], row["torchscript_ms"], row["inductor_ms"]) == (0.30, 0.28, 0.25)
    assert (row["best_compiled"], row["best_ms"]) == ("inductor", 0.25)
    assert row["library_ms"] == pytest.approx(0.2)
    assert row["outside_ms"] == pytest.approx(0.05)
    assert (row["outside_q1_ms"], row["outside_q3_ms"]) == pytest.approx((0.04, 0.06))
    assert row["outside_pct"] == pytest.approx(20.0)
    assert row["ceiling_upper_bound"] == pytest.approx(1.25)
    # the outside time's parts, from Inductor's profile: its Triton kernel and the idle time
    assert row["generated_ms"] == pytest.approx(0.03) and row["idle_ms"] == pytest.approx(0.01)
    assert (row["pointwise_ms"], row["reduction_ms"], row["copy_other_ms"]) == (0.0, 0.0, 0.0)
    assert row["best_build_s"] == 0.5
    flops = 2 * 128 * 4096 * 4096
    assert (row["main_op"], row["main_op_flops"]) == ("aten.addmm", flops)
    assert row["library_tflops"] == pytest.approx(flops / 0.2e-3 / 1e12)
    assert (row["peak_kind"], row["peak_tflops"]) == ("fp32", 67.0)
    assert row["pct_of_peak"] == pytest.approx(100 * flops / 0.2e-3 / 1e12 / 67.0)
    assert row["rank_safe"] is True  # alone
    assert (row["blind_spot"], row["nondeterministic"]) == (False, False)
    assert row["floor_ms"] is None and row["headroom_ms"] is None  # no checkout: no floor
    assert row["notes"] == "no floor: no pinned checkout"


def test_rows_sorted_by_outside_time_and_rank_safe_from_overlapping_spreads():
    near = record(task=12)  # outside 0.05 +- 0.01, as task 53: spreads overlap
    far = conv_record()  # outside 8.0 - 7.8 = 0.2
    rows = s.main_rows([record(task=53), near, far], anchor=None)
    assert [r["task"] for r in rows] == [1, 12, 53]
    assert rows[0]["outside_ms"] == pytest.approx(0.2)
    assert [r["rank_safe"] for r in rows] == [True, False, False]


def test_events_used_for_every_baseline_when_one_has_no_graph():
    rec = record()
    rec["baselines"]["torchscript"] = ok(0.28, None, graph=False)
    row = s.main_rows([rec], anchor=None)[0]
    assert row["method"] == "events"
    assert row["eager_ms"] == pytest.approx(0.30 * 1.05)
    assert row["notes"] == "no CUDA graph: torchscript; no floor: no pinned checkout"


def test_failed_baseline_missing_profile_and_unknown_device_are_said():
    rec = conv_record(device="Mystery GPU")
    rec["baselines"]["inductor"]["kernels"] = None
    row = s.main_rows([rec], anchor=None)[0]
    assert row["torchscript_ms"] is None and row["best_compiled"] == "inductor"
    assert row["library_ms"] is None and row["outside_ms"] is None and row["rank_safe"] is None
    assert row["peak_tflops"] is None
    assert row["notes"] == (
        "no kernel profile of inductor; failed: torchscript; no floor: no pinned checkout; "
        "no peak for device 'Mystery GPU'"
    )
    assert row["generated_ms"] is None and row["idle_ms"] is None


def test_tf32_peak_follows_the_records_flags():
    row = s.main_rows([conv_record(mode="kernelbench-defaults")], anchor=None)[0]
    assert (row["peak_kind"], row["peak_tflops"]) == ("tf32", 494.7)


def test_flags_blind_spot_and_nondeterminism():
    rec = record(task=66, blind_spot=True, verdict="nondeterministic")
    row = s.main_rows([rec], anchor=None)[0]
    assert (row["blind_spot"], row["nondeterministic"]) == (True, True)


def test_anchor_uses_cold_l2_when_measured(checkout):
    from kbfuse.survey import anchor

    got = anchor.read_anchor(checkout, ["1_Conv2D_ReLU_BiasAdd.py"])
    row = s.main_rows([conv_record()], anchor=got)[0]
    assert row["anchor_eager_ms"] == 4.35 and row["eager_over_anchor"] == pytest.approx(9.2 / 4.35)
    assert row["inductor_over_anchor"] == pytest.approx(8.0 / 1.96)
    assert row["anchor_method"] == "cold_l2/graph"
    assert row["anchor_disagrees"] == "eager 2.11x, inductor 4.08x"


def test_failures_unclassified_and_categories():
    rec = conv_record()
    rec["baselines"]["eager"]["kernels"].append(kernel("mystery_kernel", 12.5, calls=2))
    by_mode = {"strict": [rec]}
    assert s.failure_rows(by_mode) == [
        {
            "task": 1,
            "file": "1_Conv2D_ReLU_BiasAdd.py",
            "numerics": "strict",
            "baseline": "torchscript",
            "stage": "build",
            "error": "RuntimeError",
            "message": "trace failed",
        }
    ]
    assert s.unclassified_rows(by_mode) == [
        {"kernel": "mystery_kernel", "where": "strict/1/eager", "device_us": 12.5, "calls": 2}
    ]
    cats = s.category_rows(by_mode)
    assert [(r["role"], r["baseline"]) for r in cats] == [
        ("eager", "eager"),
        ("best compiled", "inductor"),
    ]
    assert cats[0]["library_ms"] == 8.0 and cats[0]["unclassified_ms"] == 0.0125
    assert cats[1]["generated_ms"] == 0.15


def test_tf32_table_when_both_modes():
    by_mode = {
        "strict": [conv_record(), record()],
        "kernelbench-defaults": [conv_record(mode="kernelbench-defaults")],
    }
    rows = s.tf32_rows(by_mode)
    assert [r["task"] for r in rows] == [1]
    assert rows[0]["eager_strict_over_defaults"] == pytest.approx(9.1 / 3.9)
    assert rows[0]["best_strict_over_defaults"] == pytest.approx(8.0 / 3.0)
    assert rows[0]["main_op"] == "aten.convolution"
    assert "tf32" in s.build_survey_tables(by_mode, None)
    assert "tf32" not in s.build_survey_tables({"strict": [record()]}, None)


def test_write_survey_summary_writes_every_declared_output(tmp_path, checkout):
    paths = write_records(
        tmp_path / "results", [record(), conv_record(), conv_record(mode="kernelbench-defaults")]
    )
    out = tmp_path / "summary"
    written = s.write_survey_summary(paths, checkout, out)
    names = sorted(p.name for p in written)
    assert names == sorted(s.summary_outputs(["strict", "kernelbench-defaults"]))
    assert sorted(p.name for p in out.iterdir()) == names
    main = pd.read_csv(out / "survey_strict.csv")
    assert list(main["task"]) == [1, 53]
    assert list(main["anchor_eager_ms"]) == [4.35, 5.53]
    failures = pd.read_csv(out / "failures.csv")
    assert list(zip(failures["numerics"], failures["baseline"], strict=True)) == [
        ("strict", "torchscript"),
        ("kernelbench-defaults", "torchscript"),
    ]


def test_empty_tables_keep_their_header(tmp_path):
    paths = write_records(tmp_path / "results", [record()])
    out = tmp_path / "summary"
    s.write_survey_summary(paths, None, out)
    assert (out / "failures.csv").read_text() == (
        "task,file,numerics,baseline,stage,error,message\n"
    )
    assert (out / "unclassified.md").read_text().endswith("(no rows)\n")


def test_a_record_of_another_mode_is_refused(tmp_path):
    paths = write_records(tmp_path / "results", [record(mode="kernelbench-defaults")])
    with pytest.raises(KbfuseError, match="numerics.mode is 'kernelbench-defaults', expected"):
        s.write_survey_summary({"strict": paths["kernelbench-defaults"]}, None, tmp_path / "o")
    assert not (tmp_path / "o").exists() or not any((tmp_path / "o").iterdir())


def test_a_task_twice_and_a_wrong_kind_are_refused(tmp_path):
    paths = write_records(tmp_path / "results", [record()])
    with pytest.raises(KbfuseError, match="task 53 appears twice in mode strict"):
        s.read_mode(paths["strict"] * 2, "strict")
    bad = tmp_path / "bad.json"
    write_json(bad, {**record(), "kind": "timing"})
    with pytest.raises(KbfuseError, match="field kind is not 'survey_task'"):
        s.read_mode([bad], "strict")


def test_unknown_mode_is_refused_before_reading(tmp_path):
    with pytest.raises(KbfuseError, match="numerics mode 'fast' is not one of"):
        s.write_survey_summary({"fast": ["nowhere.json"]}, None, tmp_path / "o")


def test_cpu_records_use_wall_time():
    rec = record(device="cpu")
    for b in rec["baselines"].values():
        b["timing"] = {
            "wall": b["timing"]["graph"],
            "events": None,
            "graph": None,
            "graph_missing": "cpu",
            "cold_l2": None,
        }
        b["kernels"] = [kernel("aten::addmm", 200.0), kernel("aten::frobnicate", 40.0)]
    row = s.main_rows([rec], anchor=None)[0]
    assert (row["method"], row["best_ms"]) == ("wall", 0.25)
    assert row["library_ms"] == pytest.approx(0.2)
    assert row["notes"].endswith("no peak for device 'cpu'")
    assert s.unclassified_rows({"strict": [rec]})[0]["kernel"] == "aten::frobnicate"


def test_gelu_name_used_in_records_is_pointwise():
    from kbfuse.survey.classify import POINTWISE, classify

    assert classify(GELU) == POINTWISE and classify(GEMM) == "library"


def test_every_output_has_a_caption_in_the_report_folder():
    report = Path(__file__).resolve().parents[1] / "workflow" / "report"
    outputs = s.summary_outputs(["strict", "kernelbench-defaults"])
    captions = {s.caption_name(name) for name in outputs}
    assert captions == {
        "survey_main.rst",
        "survey_where_to_fuse.rst",
        "survey_failures.rst",
        "survey_unclassified.rst",
        "survey_categories.rst",
        "survey_tf32.rst",
        "survey_time_split.rst",
        "survey_speedup_vs_outside.rst",
    }
    assert all((report / c).is_file() for c in captions)
    assert "tf32.csv" not in s.summary_outputs(["strict"])


def test_records_are_grouped_by_the_mode_in_their_path():
    paths = [
        "results/survey/strict/tasks/1.json",
        "results/survey/kernelbench-defaults/tasks/1.json",
    ]
    assert s.records_by_mode(paths, ["strict", "kernelbench-defaults"]) == {
        "strict": [paths[0]],
        "kernelbench-defaults": [paths[1]],
    }
    assert s.records_by_mode([], ["strict"]) == {"strict": []}
    with pytest.raises(KbfuseError, match=r"kernelbench-defaults/tasks/1\.json is not under"):
        s.records_by_mode(paths, ["strict"])


def test_a_baseline_that_fails_the_official_check_is_never_best_compiled():
    rec = record()  # inductor the fastest (0.25), TorchScript next (0.28)
    rec["baselines"]["inductor"] = ok(
        0.25, [kernel(GEMM, 200.0), kernel(TRITON, 30.0)], official=False
    )
    row = s.main_rows([rec], anchor=None)[0]
    assert (row["best_compiled"], row["best_ms"]) == ("torchscript", 0.28)
    assert row["inductor_ms"] == 0.25  # still timed and shown
    assert (row["torchscript_official"], row["inductor_official"]) == (True, False)
    assert "eager_official" not in row
    assert row["notes"] == "fails the official check: inductor; no floor: no pinned checkout"
    categories = s.category_rows({"strict": [rec]})
    assert [c["baseline"] for c in categories] == ["eager", "torchscript"]


def test_no_best_compiled_when_every_compiled_baseline_fails_the_official_check():
    rec = record()
    for name in ("torchscript", "inductor"):
        rec["baselines"][name] = ok(0.2, [kernel(GEMM, 150.0)], official=False)
    row = s.main_rows([rec], anchor=None)[0]
    assert row["best_compiled"] is None and row["outside_ms"] is None


def test_the_failures_table_lists_official_check_failures_with_their_figures():
    rec = record(task=66)
    rec["baselines"]["inductor"] = ok(0.25, None, official=False)
    rec["baselines"]["inductor"]["correctness"].update(max_abs=1.0, max_rel=2.5)
    rec["baselines"]["torchscript"] = failed("build", "RuntimeError", "trace failed")
    rows = s.failure_rows({"kernelbench-defaults": [rec]})
    assert rows == [
        {
            "task": 66,
            "file": "66_Matmul_Dropout_Softmax.py",
            "numerics": "kernelbench-defaults",
            "baseline": "torchscript",
            "stage": "build",
            "error": "RuntimeError",
            "message": "trace failed",
        },
        {
            "task": 66,
            "file": "66_Matmul_Dropout_Softmax.py",
            "numerics": "kernelbench-defaults",
            "baseline": "inductor",
            "stage": "official check",
            "error": "not close to eager",
            "message": "fails 5 of 5 official trials: max abs error 1.0, max rel 2.5 "
            "(atol 0.0001, rtol 0.0001)",
        },
    ]
