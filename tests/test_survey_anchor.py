"""KernelBench's anchor timings: read from a checkout's results/timing, missing entries
reported as missing, malformed ones refused, ratios flagged outside the band."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from kbfuse.errors import KbfuseError
from kbfuse.survey import anchor

DATA = Path(__file__).parent / "data" / "kernelbench_timing"
T53, T1 = "53_Gemm_Scaling_Hardtanh_GELU.py", "1_Conv2D_ReLU_BiasAdd.py"


def entry(mean):
    return {
        "mean": mean,
        "std": 0.01,
        "min": mean,
        "max": mean,
        "num_trials": 100,
        "hardware": "NVIDIA H100 80GB HBM3",
        "device": "cuda:0",
    }


def write_anchor(root, eager, inductor=None, hardware="H100_Modal"):
    folder = root / "results" / "timing" / hardware
    folder.mkdir(parents=True)
    (folder / anchor.FILES["eager"]).write_text(json.dumps({"level2": eager}))
    if inductor is not None:
        (folder / anchor.FILES["inductor"]).write_text(json.dumps({"level2": inductor}))
    return root


def test_entries_are_read_and_missing_ones_reported(tmp_path):
    write_anchor(tmp_path, {T53: entry(0.1), T1: entry(4.35)})
    got = anchor.read_anchor(tmp_path, [T53, "99_Nope.py"])
    assert got["baselines"]["eager"] == {T53: {"mean_ms": 0.1, "hardware": "NVIDIA H100 80GB HBM3"}}
    assert got["baselines"]["inductor"] == {}
    assert got["missing"] == [
        "H100_Modal/baseline_time_torch.json: no entry for 99_Nope.py",
        "H100_Modal/baseline_time_torch_compile_inductor_default.json: no such file at the pin",
    ]


def test_malformed_mean_is_refused_naming_file_and_key(tmp_path):
    write_anchor(tmp_path, {T53: entry("fast")})
    with pytest.raises(
        KbfuseError, match=r"level2\.53_Gemm_Scaling_Hardtanh_GELU\.py\.mean is 'fast'"
    ):
        anchor.read_anchor(tmp_path, [T53])


def test_file_without_level2_is_refused(tmp_path):
    folder = tmp_path / "results" / "timing" / "H100_Modal"
    folder.mkdir(parents=True)
    (folder / anchor.FILES["eager"]).write_text(json.dumps({"level1": {}}))
    with pytest.raises(KbfuseError, match="field level2 is missing"):
        anchor.read_anchor(tmp_path, [T53])


def test_compare_gives_ratios_and_flags_outside_the_band(tmp_path):
    write_anchor(tmp_path, {T1: entry(4.0)}, {T1: entry(2.0)})
    got = anchor.read_anchor(tmp_path, [T1])
    row = anchor.compare(got, T1, {"eager": 9.0, "inductor": 2.2})
    assert row == {
        "anchor_eager_ms": 4.0,
        "eager_over_anchor": 2.25,
        "anchor_inductor_ms": 2.0,
        "inductor_over_anchor": pytest.approx(1.1),
        "anchor_disagrees": "eager 2.25x",
    }


def test_compare_leaves_blanks_where_either_side_is_missing(tmp_path):
    write_anchor(tmp_path, {T1: entry(4.0)})
    row = anchor.compare(anchor.read_anchor(tmp_path, [T1]), T1, {"eager": None})
    assert row["eager_over_anchor"] is None and row["anchor_inductor_ms"] is None
    assert row["anchor_disagrees"] == ""


def test_kernelbench_anchor_at_the_pin(tmp_path):
    """Entries copied verbatim from KernelBench's H100_Modal files at the pin (six tasks)."""
    shutil.copytree(DATA, tmp_path / "results" / "timing")
    got = anchor.read_anchor(tmp_path, [T1, T53])
    assert got["missing"] == []
    assert got["baselines"]["eager"][T1]["mean_ms"] == 4.35
    assert got["baselines"]["inductor"][T1]["mean_ms"] == 1.96
    assert got["baselines"]["eager"][T53] == {"mean_ms": 5.53, "hardware": "NVIDIA H100 80GB HBM3"}
    assert got["baselines"]["inductor"][T53]["mean_ms"] == 5.45
