"""The survivors of kbfuse.survey.summary's mutation run of 2026-12-02 (docs/mutation.md), each
pinned by the value it would change: sort keys and neighbours of the ranking, the main op and
its FLOP/s, the notes' wording, the tables' columns when empty, the floor and copy bandwidth
handed down to every row, the anchor's level, and the summary's refusals."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd
import pytest
from survey_records import GEMM, TRITON, failed, kernel, ok, record, stats, write_records

from kbfuse.errors import KbfuseError
from kbfuse.results import records
from kbfuse.survey import classify, headroom, plots
from kbfuse.survey import floor as floor_mod
from kbfuse.survey import summary as s

ROOT = Path(__file__).resolve().parents[1]
FINGERPRINT = ROOT / "results/reference/h200/survey/env/fingerprint.json"
FINGERPRINT_GBPS = 4287.010735133728
H200 = {"gbps": 4000.0, "device_name": "NVIDIA H200"}
FLOOR = {"floor_bytes": 40_000_000}  # 40 MB at 4000 GB/s: 0.01 ms
NO_FLOOR_NOTE = "no floor: no pinned checkout"


# ---------------------------------------------------------------- ranking


def test_an_unknown_outside_time_sorts_after_every_known_one_and_a_known_one_by_its_negation():
    assert s._nan_last_desc(None) == (1, 0.0)
    assert s._nan_last_desc(float("nan")) == (1, 0.0)
    assert s._nan_last_desc(2.5) == (0, -2.5)
    assert s._nan_last_desc(0.0) == (0, -0.0)


def test_spreads_that_touch_at_one_end_overlap_both_ways():
    low = {"outside_q1_ms": 0.0, "outside_q3_ms": 1.0}
    high = {"outside_q1_ms": 1.0, "outside_q3_ms": 2.0}
    assert s._overlap(high, low) is True
    assert s._overlap(low, high) is True
    apart = {"outside_q1_ms": 1.5, "outside_q3_ms": 2.0}
    assert s._overlap(low, apart) is False


def _ranked(task, outside, q1, q3):
    """A main-table row as rank_rows gets it (rank_safe blank until ranked)."""
    return {
        "task": task,
        "outside_ms": outside,
        "outside_q1_ms": q1,
        "outside_q3_ms": q3,
        "rank_safe": None,
    }


def test_rows_sort_by_outside_time_not_by_task_number():
    rows = s.rank_rows(
        [_ranked(1, 0.1, 0.09, 0.11), _ranked(2, None, None, None), _ranked(3, 5.0, 4.9, 5.1)]
    )
    assert [r["task"] for r in rows] == [3, 1, 2]
    assert [r["rank_safe"] for r in rows] == [True, True, None]


def test_the_second_row_is_compared_with_the_first():
    rows = s.rank_rows([_ranked(7, 1.0, 0.5, 1.5), _ranked(8, 1.2, 0.8, 1.6)])
    assert [r["task"] for r in rows] == [8, 7]
    assert [r["rank_safe"] for r in rows] == [False, False]


def test_rank_safe_looks_at_the_row_just_above_only():
    # task 3 overlaps task 1 (two above) but not task 2 (just above)
    rows = s.rank_rows(
        [_ranked(1, 10.0, 2.0, 11.0), _ranked(2, 9.0, 8.95, 9.05), _ranked(3, 5.0, 4.0, 6.0)]
    )
    assert [r["task"] for r in rows] == [1, 2, 3]
    assert [r["rank_safe"] for r in rows] == [False, False, True]


def test_rank_safe_looks_at_the_row_just_below_only():
    # task 1 overlaps task 3 (two below) but not task 2 (just below)
    rows = s.rank_rows(
        [_ranked(1, 10.0, 9.5, 10.5), _ranked(2, 9.0, 8.9, 9.1), _ranked(3, 5.0, 4.0, 11.0)]
    )
    assert [r["rank_safe"] for r in rows] == [True, False, False]


# ---------------------------------------------------------------- per task


def test_ok_baselines_need_both_status_ok_and_a_timing():
    rec = record()
    rec["baselines"]["torchscript"] = {"status": "ok", "timing": None}
    rec["baselines"]["inductor"] = {"status": "failed", "timing": {"graph": stats(0.1)}}
    assert list(s.ok_baselines(rec)) == ["eager"]


def test_best_compiled_is_the_lowest_median_not_the_first_name():
    rec = record()
    rec["baselines"]["torchscript"] = ok(0.2, [kernel(GEMM, 150.0)])
    assert s.best_compiled(rec, "graph") == "torchscript"
    assert s.main_rows([rec], anchor=None)[0]["best_ms"] == 0.2


def test_the_main_op_is_the_records_own_when_named_else_the_op_with_most_flops():
    named = {"flops": {"main_op": "aten.relu", "by_op": {"aten.addmm": 10, "aten.relu": 5}}}
    assert s.main_op(named) == ("aten.relu", 5)
    unnamed = {"flops": {"main_op": None, "by_op": {"aten.relu": 5, "aten.addmm": 10}}}
    assert s.main_op(unnamed) == ("aten.addmm", 10)
    assert s.main_op({"flops": {"by_op": {"aten.relu": 5, "aten.addmm": 10}}}) == (
        "aten.addmm",
        10,
    )
    absent = {"flops": {"main_op": "aten.mm", "by_op": {"aten.addmm": 10}}}
    assert s.main_op(absent) == ("aten.mm", None)
    assert s.main_op({"flops": None}) == (None, None)


def test_the_matmul_tf32_flag_picks_the_tf32_peak_of_a_gemm():
    rec = record()
    rec["numerics"]["matmul_tf32"] = True
    row = s.main_rows([rec], anchor=None)[0]
    assert (row["main_op"], row["peak_kind"], row["peak_tflops"]) == ("aten.addmm", "tf32", 494.7)
    strict = s.main_rows([record()], anchor=None)[0]
    assert (strict["peak_kind"], strict["peak_tflops"]) == ("fp32", 67.0)


def test_library_tflops_is_flops_over_1e12_per_library_second_exactly():
    row = s.main_rows([record()], anchor=None)[0]
    flops = 2 * 128 * 4096 * 4096
    assert row["library_ms"] == 0.2
    assert row["library_tflops"] == (flops / 1e12) / (0.2 / 1e3)


def test_no_flops_leave_the_rate_blank():
    row = s.main_rows([record(flops={})], anchor=None)[0]
    assert (row["main_op"], row["main_op_flops"]) == (None, None)
    assert (row["library_tflops"], row["pct_of_peak"]) == (None, None)
    assert (row["peak_kind"], row["peak_tflops"]) == ("fp32", 67.0)


def test_outside_fields_without_a_best_are_four_blank_columns():
    assert s.outside_fields(None, 0.2, []) == {
        "outside_ms": None,
        "outside_q1_ms": None,
        "outside_q3_ms": None,
        "outside_pct": None,
    }
    assert s.outside_fields(stats(0.25), None, []) == {
        "outside_ms": None,
        "outside_q1_ms": None,
        "outside_q3_ms": None,
        "outside_pct": None,
    }


def test_library_time_equal_to_the_forward_is_not_said_to_be_longer():
    notes: list[str] = []
    got = s.outside_fields(stats(0.25), 0.25, notes)
    assert notes == []
    assert got["outside_ms"] == 0.0 and got["outside_pct"] == 0.0


def test_library_time_longer_than_the_forward_is_said():
    notes: list[str] = []
    got = s.outside_fields(stats(0.25), 0.5, notes)
    assert notes == ["library kernels take longer in the profile than the timed forward"]
    assert got["outside_ms"] == -0.25


def test_no_library_kernel_is_said_and_one_millisecond_of_it_is_not():
    notes: list[str] = []
    s.outside_fields(stats(2.0), 0.0, notes)
    assert notes == ["no library kernel: no ceiling"]
    notes = []
    got = s.outside_fields(stats(2.0), 1.0, notes)
    assert notes == []
    assert got == {
        "outside_ms": 1.0,
        "outside_q1_ms": 2.0 - 0.01 - 1.0,
        "outside_q3_ms": 2.0 + 0.01 - 1.0,
        "outside_pct": 50.0,
    }


def test_anchor_fields_without_an_anchor_are_blank_with_a_blank_method():
    assert s.anchor_fields(record(), "graph", None) == {
        "anchor_eager_ms": None,
        "eager_over_anchor": None,
        "anchor_inductor_ms": None,
        "inductor_over_anchor": None,
        "anchor_disagrees": "",
        "anchor_method": None,
    }


def test_the_row_names_the_file_and_the_best_compileds_quartiles():
    row = s.main_rows([record()], anchor=None)[0]
    assert row["file"] == "53_Gemm_Scaling_Hardtanh_GELU.py"
    assert (row["best_q1_ms"], row["best_q3_ms"]) == (0.25 - 0.01, 0.25 + 0.01)


def test_notes_list_several_baselines_separated_by_a_comma():
    rec = record()
    for name, ms in (("torchscript", 0.28), ("inductor", 0.25)):
        rec["baselines"][name] = ok(ms, [kernel(GEMM, 200.0)], graph=False)
    row = s.main_rows([rec], anchor=None)[0]
    assert row["notes"] == f"no CUDA graph: torchscript, inductor; {NO_FLOOR_NOTE}"
    rec = record()
    rec["baselines"]["torchscript"] = failed("build", "RuntimeError", "x")
    rec["baselines"]["inductor"] = failed("timing", "RuntimeError", "y")
    row = s.main_rows([rec], anchor=None)[0]
    assert row["notes"] == f"failed: torchscript, inductor; {NO_FLOOR_NOTE}"
    rec = record()
    for name in ("torchscript", "inductor"):
        rec["baselines"][name] = ok(0.2, [kernel(GEMM, 150.0)], official=False)
    row = s.main_rows([rec], anchor=None)[0]
    assert row["notes"] == f"fails the official check: torchscript, inductor; {NO_FLOOR_NOTE}"


def test_a_best_compiled_without_a_timeline_says_so_in_the_notes():
    rec = record()
    rec["baselines"]["inductor"] = ok(
        0.25, [kernel(GEMM, 200.0), kernel(TRITON, 30.0)], idle_us=None
    )
    row = s.main_rows([rec], anchor=None)[0]
    assert row["idle_ms"] is None
    assert row["notes"] == (
        f"idle between kernels not measured (no timeline in the record); {NO_FLOOR_NOTE}"
    )


def test_main_rows_hand_each_task_its_floor_and_the_copy_bandwidth():
    rows = s.main_rows([record(), record(task=12)], None, {53: (FLOOR, None)}, H200)
    by_task = {r["task"]: r for r in rows}
    assert by_task[53]["floor_bytes"] == 40_000_000
    assert by_task[53]["floor_ms"] == 40_000_000 / (4000.0 * 1e9) * 1e3
    assert by_task[53]["headroom_ms"] == pytest.approx(0.04)
    assert by_task[53]["notes"] == ""
    assert by_task[12]["floor_ms"] is None and by_task[12]["notes"] == NO_FLOOR_NOTE


# ---------------------------------------------------------------- tables


def test_categories_skip_a_role_without_a_profile_and_name_task_and_mode():
    rec = record()
    rec["baselines"]["eager"]["kernels"] = None
    rows = s.category_rows({"kernelbench-defaults": [rec]})
    assert len(rows) == 1
    assert {k: rows[0][k] for k in ("task", "numerics", "role", "baseline")} == {
        "task": 53,
        "numerics": "kernelbench-defaults",
        "role": "best compiled",
        "baseline": "inductor",
    }
    assert rows[0]["library_ms"] == 0.2 and rows[0]["generated_ms"] == 0.03


def test_categories_of_a_task_without_a_best_compiled_have_eager_only():
    rec = record()
    for name in ("torchscript", "inductor"):
        rec["baselines"][name] = ok(0.2, [kernel(GEMM, 150.0)], official=False)
    rows = s.category_rows({"strict": [rec]})
    assert [(r["role"], r["baseline"]) for r in rows] == [("eager", "eager")]
    rec["baselines"]["torchscript"] = failed("build", "RuntimeError", "x")
    rec["baselines"]["inductor"] = failed("build", "RuntimeError", "x")
    rec["baselines"]["eager"] = failed("build", "RuntimeError", "x")
    rec["baselines"]["eager"]["kernels"] = [kernel(GEMM, 1.0)]  # failed: not counted
    assert s.category_rows({"strict": [rec]}) == []


def test_unclassified_kernels_are_summed_per_name_and_sorted_largest_first():
    rec = record()
    rec["baselines"]["eager"]["kernels"] += [
        kernel("mystery_a", 5.0, calls=2),
        {"name": "mystery_b", "device_us": 30.0, "calls": None},
    ]
    rec["baselines"]["inductor"]["kernels"].append(kernel("mystery_a", 7.5, calls=3))
    assert s.unclassified_rows({"strict": [rec]}) == [
        {"kernel": "mystery_b", "where": "strict/53/eager", "device_us": 30.0, "calls": 0},
        {
            "kernel": "mystery_a",
            "where": "strict/53/eager, strict/53/inductor",
            "device_us": 12.5,
            "calls": 5,
        },
    ]


def test_tf32_rows_need_both_modes_and_name_file_and_best_compiled():
    assert s.tf32_rows({"strict": [record()]}) == []
    assert s.tf32_rows({"kernelbench-defaults": [record(mode="kernelbench-defaults")]}) == []
    rows = s.tf32_rows({"strict": [record()], "kernelbench-defaults": [record()]})
    assert rows[0]["file"] == "53_Gemm_Scaling_Hardtanh_GELU.py"
    assert (rows[0]["best_compiled_strict"], rows[0]["best_compiled_defaults"]) == (
        "inductor",
        "inductor",
    )
    assert (rows[0]["best_ms_strict"], rows[0]["best_strict_over_defaults"]) == (0.25, 1.0)


def test_built_tables_carry_floors_copy_and_every_row():
    rec = record()
    rec["baselines"]["eager"]["kernels"].append(kernel("mystery_kernel", 12.5))
    by_mode = {"strict": [rec], "kernelbench-defaults": [record(mode="kernelbench-defaults")]}
    tables = s.build_survey_tables(by_mode, None, {53: (FLOOR, None)}, H200)
    main = tables["survey_strict"]
    assert main.loc[0, "floor_ms"] == 40_000_000 / (4000.0 * 1e9) * 1e3
    where = tables["where_to_fuse_strict"]
    assert list(where.columns) == headroom.WHERE_COLUMNS
    assert (list(where["task"]), list(where["rank"])) == ([53], [1])
    assert list(tables["unclassified"]["kernel"]) == ["mystery_kernel"]
    assert list(tables["categories"]["role"]) == ["eager", "best compiled"] * 2
    assert list(tables["tf32"]["task"]) == [53]


def test_empty_built_tables_keep_their_columns():
    tables = s.build_survey_tables({"strict": []}, None)
    assert list(tables["where_to_fuse_strict"].columns) == headroom.WHERE_COLUMNS
    assert list(tables["unclassified"].columns) == ["kernel", "where", "device_us", "calls"]
    assert list(tables["categories"].columns) == ["task", "numerics", "role", "baseline"] + [
        f"{c}_ms" for c in (*classify.CATEGORIES, classify.UNCLASSIFIED)
    ]
    assert list(tables["failures"].columns) == s.FAILURE_COLUMNS


def test_survey_rows_of_a_run_keep_every_main_column(tmp_path):
    write_records(tmp_path / "results", [record()])
    df = s.survey_rows_of(tmp_path / "results")
    assert list(df.columns[:3]) == ["numerics", "task", "file"]
    assert "outside_q1_ms" in df.columns and "floor_ms" in df.columns
    assert list(df["best_compiled"]) == ["inductor"]


# ---------------------------------------------------------------- reading


def test_records_by_mode_takes_a_three_part_path_and_refuses_one_not_under_tasks():
    assert s.records_by_mode(["strict/tasks/1.json"], ["strict"]) == {
        "strict": ["strict/tasks/1.json"]
    }
    for path in ("results/survey/strict/other/1.json", "tasks/1.json"):
        with pytest.raises(KbfuseError, match=re.escape(f"survey record {path} is not under")):
            s.records_by_mode([path], ["strict"])


def test_a_record_that_is_not_json_is_named_by_its_path(tmp_path):
    path = tmp_path / "1.json"
    path.write_text("{bad")
    with pytest.raises(KbfuseError, match=re.escape(f"{path} is not valid JSON")):
        s.read_task_record(path)


def test_a_record_off_its_schema_is_refused_with_its_path(tmp_path):
    path = tmp_path / "1.json"
    rec = record()
    del rec["seed"]
    path.write_text(json.dumps(rec))
    with pytest.raises(
        KbfuseError, match=re.escape(f"{path} does not follow the survey_task record schema")
    ):
        s.read_task_record(path)


@pytest.mark.parametrize(("value", "shown"), [("53", "'53'"), (True, "True")])
def test_without_a_schema_the_fields_read_are_checked(tmp_path, monkeypatch, value, shown):
    monkeypatch.setattr(records, "SCHEMA_KINDS", ())
    path = tmp_path / "1.json"
    path.write_text(json.dumps({**record(), "task": value}))
    with pytest.raises(KbfuseError, match=re.escape(f"{path}: field task is {shown}")):
        s.read_task_record(path)
    path.write_text(json.dumps(record()))
    assert s.read_task_record(path)["task"] == 53


def test_survey_level_is_the_records_one_level_else_two():
    assert s.survey_level([{"level": 1}, {"level": 1}]) == 1
    assert s.survey_level([{}]) == 2
    assert s.survey_level([]) == 2
    with pytest.raises(KbfuseError, match=re.escape("levels [1, 2] in one summary")):
        s.survey_level([{"level": 2}, {"level": 1}])


def test_task_floors_find_each_tasks_floor_once(monkeypatch):
    calls = []

    def record_floor(checkout, rec):
        calls.append((checkout, rec["task"]))
        return {"floor_bytes": rec["task"] * 1000}, None

    monkeypatch.setattr(floor_mod, "record_floor", record_floor)
    recs = [record(), record(task=12), record(mode="kernelbench-defaults")]
    assert s.task_floors("co", recs) == {
        53: ({"floor_bytes": 53_000}, None),
        12: ({"floor_bytes": 12_000}, None),
    }
    assert calls == [("co", 53), ("co", 12)]


# ---------------------------------------------------------------- the whole summary


def _anchor_file(path: Path, level1_ms: float, level2_ms: float) -> None:
    file = "53_Gemm_Scaling_Hardtanh_GELU.py"
    entry = {"hardware": "NVIDIA H100 80GB HBM3"}
    path.write_text(
        json.dumps(
            {
                "level1": {file: {**entry, "mean": level1_ms}},
                "level2": {file: {**entry, "mean": level2_ms}},
            }
        )
    )


def test_the_summary_uses_the_checkouts_floors_the_fingerprints_bandwidth_and_the_level(
    tmp_path, monkeypatch
):
    checkout = tmp_path / "checkout"
    timing = checkout / "results" / "timing" / "H100_Modal"
    timing.mkdir(parents=True)
    _anchor_file(timing / "baseline_time_torch.json", 0.5, 9.0)
    _anchor_file(timing / "baseline_time_torch_compile_inductor_default.json", 0.4, 8.0)
    monkeypatch.setattr(floor_mod, "record_floor", lambda co, rec: (FLOOR, None))
    seen = []
    real = plots.write_plots

    def write_plots(main, categories, mode, outdir, where=None):
        seen.append(where)
        return real(main, categories, mode, outdir, where)

    monkeypatch.setattr(plots, "write_plots", write_plots)
    rec = record()
    rec["level"] = 1
    paths = write_records(tmp_path / "results", [rec])
    out = tmp_path / "summary"
    s.write_survey_summary(paths, checkout, out, fingerprint=FINGERPRINT)
    main = pd.read_csv(out / "survey_strict.csv")
    assert main.loc[0, "floor_bytes"] == 40_000_000
    assert main.loc[0, "floor_ms"] == pytest.approx(40_000_000 / (FINGERPRINT_GBPS * 1e9) * 1e3)
    assert (main.loc[0, "anchor_eager_ms"], main.loc[0, "anchor_inductor_ms"]) == (0.5, 0.4)
    where = pd.read_csv(out / "where_to_fuse_strict.csv")
    assert list(where["task"]) == [53]
    assert len(seen) == 1 and list(seen[0]["task"]) == [53]
    assert list(seen[0].columns) == headroom.WHERE_COLUMNS


def test_the_summary_takes_floors_from_the_floor_records_when_given(tmp_path, monkeypatch):
    read = []

    def read_record(path, kind):
        read.append((str(path), kind))
        return {"task": 53, "level": 2, "sha256": "0" * 64, "semantics": "kernelbench"} | {
            "floor": FLOOR,
            "problem": None,
        }

    monkeypatch.setattr(records, "read_record", read_record)
    paths = write_records(tmp_path / "results", [record()])
    out = tmp_path / "summary"
    s.write_survey_summary(paths, None, out, floor_files=["floors/53.json"])
    assert read == [("floors/53.json", "survey_floor")]
    main = pd.read_csv(out / "survey_strict.csv")
    assert main.loc[0, "floor_bytes"] == 40_000_000
    assert main.loc[0, "notes"] == "no floor_ms: no copy bandwidth (no env fingerprint)"
