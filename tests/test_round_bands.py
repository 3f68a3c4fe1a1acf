"""kbfuse.results.rounds and tools/round_bands.py: a block's rounds split in two bands by
their level, on a synthetic block and on the H200 reference's task-81 small-shape tail in
CUDA graphs, whose slow band docs/findings.md describes."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from kbfuse.errors import KbfuseError
from kbfuse.results.rounds import read_block, round_levels, spans, two_bands

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "results/reference/h200"


def load_tool():
    spec = importlib.util.spec_from_file_location("round_bands", ROOT / "tools/round_bands.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_spans_and_round_levels():
    assert spans([3, 4, 5, 9, 11, 12]) == "3-5, 9, 11-12"
    assert spans([]) == ""
    levels = round_levels({"a": [1.0, 2.0], "b": [3.0, 2.0], "c": [2.0, 9.0]})
    assert levels.tolist() == [2.0, 2.0]
    with pytest.raises(KbfuseError, match="one sample per round each"):
        round_levels({"a": [1.0, 2.0], "b": [1.0]})


def test_a_synthetic_slow_phase_is_found_with_who_it_spared():
    # rounds 3-4 slow: every implementation at least 4.5, "big" (10.0) untouched
    level = {"a": 3.0, "b": 3.0, "fast": 3.45, "big": 10.0}
    block = {
        name: {"samples_ms": [max(ms, 4.5) if r in (2, 3) and name != "big" else ms
                              for r in range(6)]}
        for name, ms in level.items()
    }  # fmt: skip
    bands = two_bands(block)
    assert bands["slow_rounds"] == [3, 4]
    assert bands["step"] == pytest.approx(4.5 / 3.225)
    ratios = {name: row["slow_over_fast"] for name, row in bands["implementations"].items()}
    assert ratios == pytest.approx({"a": 1.5, "b": 1.5, "fast": 4.5 / 3.45, "big": 1.0})
    assert bands["rounds_in_order"] == []  # no positions recorded


def test_the_reference_small_shape_tail_of_task_81_has_a_slow_band_with_one_floor():
    bands = two_bands(read_block(REFERENCE, 81, "small/tail/graph"))
    assert bands["slow_rounds"] == list(range(4, 16))
    assert bands["fast_level_ms"] * 1e3 == pytest.approx(3.04, abs=0.005)
    assert bands["slow_level_ms"] * 1e3 == pytest.approx(4.50, abs=0.005)
    rows = bands["implementations"]
    assert rows["eager"]["slow_over_fast"] == pytest.approx(1.021, abs=0.0005)
    kernels = {name: row for name, row in rows.items() if name != "eager"}
    fast = [row["fast_ms"] * 1e3 for row in kernels.values()]
    slow = [row["slow_ms"] * 1e3 for row in kernels.values()]
    # apart by 16 % in the fast band (the fast kernels at 3.45-3.49 µs), by 2 % in the slow
    assert (min(fast), max(fast)) == pytest.approx((3.01, 3.49), abs=0.005)
    assert (min(slow), max(slow)) == pytest.approx((4.44, 4.52), abs=0.005)
    assert min(r["slow_over_fast"] for r in kernels.values()) == pytest.approx(1.292, abs=5e-4)
    # the phase begins and ends inside rounds: the last sample of round 3 is slow, the first
    # three of round 5 and the last five of round 15 are not
    in_order = bands["rounds_in_order"]
    assert [round(ms * 1e3, 2) for _, ms in in_order[2][-2:]] == [3.06, 5.09]
    assert [round(ms * 1e3, 2) for _, ms in in_order[4][:4]] == [3.85, 3.04, 3.48, 10.46]
    assert [name for name, _ in in_order[14]][6] == "eager"


def test_the_other_small_shape_tails_have_no_such_band():
    for task in (53, 95):
        assert two_bands(read_block(REFERENCE, task, "small/tail/graph"))["step"] < 1.1


def test_read_block_finds_every_kind_of_block_and_names_a_missing_one():
    assert len(read_block(REFERENCE, 53, "full/graph")) == 14
    assert sorted(read_block(REFERENCE, 95, "ftz_cost/nvrtc-ptx")) == [
        "nvrtc-ptx-ftz",
        "nvrtc-ptx-noftz",
    ]
    with pytest.raises(KbfuseError, match=r"controls/95.json: no timed block 'ftz_cost/nope'"):
        read_block(REFERENCE, 95, "ftz_cost/nope")
    with pytest.raises(KbfuseError, match=r"timing/53.json: no timed block 'full/none'"):
        read_block(REFERENCE, 53, "full/none")


def test_the_tool_prints_the_bands_and_fails_on_a_missing_block(capsys):
    tool = load_tool()
    assert tool.main(["81", "small/tail/graph"]) == 0
    out = capsys.readouterr().out
    assert "4.50 µs in the slow band (rounds 4-15)" in out
    assert "| eager | 10.09 | 10.30 | 1.021 |" in out
    assert tool.main(["81", "small/none"]) == 1
    assert "no timed block 'small/none'" in capsys.readouterr().err
