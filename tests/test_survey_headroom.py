"""The headroom columns of the survey's main table, the where-to-fuse ranking and its files,
from records built by hand: records with the new fields (a timeline) and records made before
them, a floor with and without the GPU's copy bandwidth."""

from __future__ import annotations

import shutil
from pathlib import Path

import pandas as pd
import pytest
from survey_kbrepo import SURVEY_TASK_FILES
from survey_records import CONV, GEMM, TRITON, kernel, ok, record, write_records

from kbfuse.errors import KbfuseError
from kbfuse.io import read_json, sha256_file, write_json
from kbfuse.survey import headroom
from kbfuse.survey import summary as s

ROOT = Path(__file__).resolve().parents[1]
FINGERPRINT = ROOT / "results/reference/h200/survey/env/fingerprint.json"
H200 = {"gbps": 4000.0, "device_name": "NVIDIA H200"}
# 40 MB at 4000 GB/s: 0.01 ms
FLOOR = ({"floor_bytes": 40_000_000}, None)


def gemm_row(rec=None, floor=FLOOR, copy=H200) -> dict:
    rec = rec or record()
    return s.main_rows([rec], None, {rec["task"]: floor}, copy)[0]


def test_headroom_is_outside_minus_the_floor_at_the_copy_bandwidth():
    # task 53: Inductor 0.25 ms (q1 0.24, q3 0.26), library 0.2 ms: outside 0.05 ms
    row = gemm_row()
    assert row["floor_bytes"] == 40_000_000
    assert row["floor_ms"] == pytest.approx(0.01)
    assert row["headroom_ms"] == pytest.approx(0.04)
    assert (row["headroom_q1_ms"], row["headroom_q3_ms"]) == pytest.approx((0.03, 0.05))
    assert row["fused_ms"] == pytest.approx(0.21)
    assert row["ceiling_realistic"] == pytest.approx(0.25 / 0.21)
    assert row["ceiling_upper_bound"] == pytest.approx(1.25)
    assert row["notes"] == ""


def test_a_floor_larger_than_the_outside_time_leaves_a_negative_headroom():
    row = gemm_row(floor=({"floor_bytes": 400_000_000}, None))  # 0.1 ms
    assert row["headroom_ms"] == pytest.approx(-0.05)  # not clipped: the profile disagrees
    assert row["ceiling_realistic"] == pytest.approx(0.25 / 0.3)


@pytest.mark.parametrize(
    ("floor", "copy", "note"),
    [
        (FLOOR, None, "no floor_ms: no copy bandwidth (no env fingerprint)"),
        (
            FLOOR,
            {"gbps": 2000.0, "device_name": "NVIDIA H100 80GB HBM3"},
            "no floor_ms: copy bandwidth measured on 'NVIDIA H100 80GB HBM3', the record ran "
            "on 'NVIDIA H200'",
        ),
        ((None, "no floor: DataDependentOutputException: x"), H200,
         "no floor: DataDependentOutputException: x"),
        (None, H200, "no floor: no pinned checkout"),
    ],
)  # fmt: skip
def test_what_is_missing_stays_blank_and_is_said(floor, copy, note):
    row = gemm_row(floor=floor, copy=copy)
    for column in ("floor_ms", "headroom_ms", "fused_ms", "ceiling_realistic"):
        assert row[column] is None, column
    assert row["ceiling_upper_bound"] == pytest.approx(1.25)
    assert row["notes"] == note


def test_the_outside_time_broken_down_from_the_best_compileds_profile():
    rec = record()
    rec["baselines"]["inductor"] = ok(
        0.25,
        [
            kernel(GEMM, 200.0),
            kernel(TRITON, 20.0),
            kernel("void at::native::reduce_kernel<512, 1>(float)", 8.0),
            kernel("void at::native::vectorized_elementwise_kernel<4>(float)", 4.0),
            kernel("Memcpy DtoD (Device -> Device)", 2.0),
            kernel("mystery_kernel", 1.0),
        ],
        idle_us=15.0,
    )
    row = gemm_row(rec)
    assert row["generated_ms"] == pytest.approx(0.020)
    assert row["reduction_ms"] == pytest.approx(0.008)
    assert row["pointwise_ms"] == pytest.approx(0.004)
    assert row["copy_other_ms"] == pytest.approx(0.003)  # a copy and an unclassified kernel
    assert row["idle_ms"] == pytest.approx(0.015)


def test_a_record_made_before_the_timeline_has_no_idle_time_and_says_so():
    rec = record()
    rec["baselines"]["inductor"] = ok(
        0.25, [kernel(GEMM, 200.0), kernel(TRITON, 30.0)], idle_us=None
    )
    assert "timeline" not in rec["baselines"]["inductor"]
    row = gemm_row(rec)
    assert row["idle_ms"] is None and row["generated_ms"] == pytest.approx(0.03)
    assert row["notes"] == "idle between kernels not measured (no timeline in the record)"
    assert row["headroom_ms"] == pytest.approx(0.04)  # the rest as before


def test_where_rows_rank_by_headroom_with_rank_safety_in_that_order():
    def row(task, headroom_ms, spread=0.01):
        return {
            "task": task,
            "file": f"{task}_Conv2d_Thing.py",
            "headroom_ms": headroom_ms,
            "headroom_q1_ms": None if headroom_ms is None else headroom_ms - spread,
            "headroom_q3_ms": None if headroom_ms is None else headroom_ms + spread,
        }

    rows = [row(1, 0.5), row(2, 2.0), row(3, 0.505), row(4, None), row(5, 1.0)]
    ranked = headroom.where_rows(rows, top=3)
    assert [(r["rank"], r["task"], r["rank_safe"]) for r in ranked] == [
        (1, 2, True),
        (2, 5, True),
        (3, 3, False),  # its spread overlaps task 1's, ranked next
    ]
    assert ranked[0]["name"] == "Conv2d_Thing" and list(ranked[0]) == headroom.WHERE_COLUMNS
    assert headroom.where_rows([row(4, None)]) == []
    # outside time under the floor, or a profile's library time over the timed forward's
    assert headroom.where_rows([row(6, 0.0), row(7, -10.3), row(8, 0.2)]) == [
        {**headroom.where_rows([row(8, 0.2)])[0]}
    ]
    assert [r["task"] for r in headroom.where_rows([row(6, 0.0), row(8, 0.2)])] == [8]


def test_the_copy_bandwidth_is_read_from_the_fingerprint(tmp_path):
    assert headroom.read_copy_bandwidth(FINGERPRINT) == {
        "gbps": pytest.approx(4287.010735133728),
        "device_name": "NVIDIA H200",
    }
    assert headroom.read_copy_bandwidth(None) is None
    bad = read_json(FINGERPRINT)
    bad["copy_bandwidth"]["gbps"] = 0
    write_json(tmp_path / "env.json", bad)
    with pytest.raises(KbfuseError, match="field copy_bandwidth.gbps is 0"):
        headroom.read_copy_bandwidth(tmp_path / "env.json")


def conv_task_record(checkout: Path, mode: str, timeline: bool) -> dict:
    """Task 1 of the survey fixture, its file at the checkout, timed as a convolution."""
    name, text = SURVEY_TASK_FILES[1]
    path = checkout / "KernelBench" / "level2" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    idle = 5.0 if timeline else None
    rec = record(
        task=1,
        mode=mode,
        baselines={
            "eager": ok(9.0, [kernel(CONV, 8000.0)], idle_us=idle),
            "inductor": ok(8.0, [kernel(CONV, 7800.0), kernel(TRITON, 150.0)], idle_us=idle),
        },
    )
    rec["file"], rec["sha256"] = name, sha256_file(path)
    return rec


@pytest.mark.parametrize("timeline", [True, False])
def test_the_summary_writes_where_to_fuse_from_the_checkout_and_the_fingerprint(tmp_path, timeline):
    checkout = tmp_path / "checkout"
    shutil.copytree(ROOT / "tests/data/kernelbench_timing", checkout / "results" / "timing")
    recs = [conv_task_record(checkout, m, timeline) for m in ("strict", "kernelbench-defaults")]
    recs.append(record())  # task 53: no file at this checkout, so no floor
    paths = write_records(tmp_path / "results", recs)
    out = tmp_path / "summary"
    written = s.write_survey_summary(paths, checkout, out, fingerprint=FINGERPRINT)
    assert sorted(p.name for p in written) == sorted(
        s.summary_outputs(["strict", "kernelbench-defaults"])
    )
    main = pd.read_csv(out / "survey_strict.csv").set_index("task")
    floor_bytes = 2 * (2 * 4 * 6 * 6 * 4) + 4 * 4  # conv output read and written, bias read
    assert main.loc[1, "floor_bytes"] == floor_bytes
    assert main.loc[1, "floor_ms"] == pytest.approx(floor_bytes / 4287.010735133728e9 * 1e3)
    assert main.loc[1, "headroom_ms"] == pytest.approx(0.2 - main.loc[1, "floor_ms"])
    assert pd.isna(main.loc[53, "floor_ms"])
    assert (
        "no floor: 53_Gemm_Scaling_Hardtanh_GELU.py is not at the checkout" in main.loc[53, "notes"]
    )
    assert (
        (main.loc[1, "idle_ms"] == pytest.approx(0.005))
        if timeline
        else pd.isna(main.loc[1, "idle_ms"])
    )
    where = pd.read_csv(out / "where_to_fuse_strict.csv")
    assert list(where.columns) == headroom.WHERE_COLUMNS
    assert list(where["task"]) == [1] and where.loc[0, "name"] == "Conv2D_ReLU_BiasAdd"
    assert (out / "where_to_fuse_strict.md").read_text().count("Conv2D_ReLU_BiasAdd") == 1
