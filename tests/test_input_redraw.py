"""benchmarks/input_redraw.py and kbfuse.candidates.inputcost: what redrawing a check's inputs
costs against the disk's round trip, on a small tensor."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kbfuse.candidates.inputcost import STEPS, measure, report_markdown

ROOT = Path(__file__).resolve().parents[1]


def test_each_step_is_timed_and_the_ratio_is_redraw_over_disk(tmp_path):
    report = measure(4 << 20, 2, tmp_path)
    assert list(report["seconds"]) == list(STEPS) and all(
        s >= 0 for s in report["seconds"].values()
    )
    s = report["seconds"]
    assert report["redraw_s"] == pytest.approx(s["draw"] + s["digest"], abs=1e-3)
    assert report["disk_s"] == pytest.approx(s["write"] + s["read"], abs=1e-3)
    assert report["redraw_over_disk"] == pytest.approx(
        report["redraw_s"] / report["disk_s"], rel=0.01, abs=2e-3
    )
    assert report["same_digest_every_draw"] is True  # a seed's draw is the same every time
    assert list(tmp_path.iterdir()) == []  # the written file is gone
    assert "| write |" in report_markdown(report) and "ratio" in report_markdown(report)


def test_a_size_that_is_no_float32_count_is_refused_before_anything_is_written(tmp_path):
    with pytest.raises(ValueError, match="6 bytes is not a positive multiple of 4"):
        measure(6, 1, tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_the_benchmark_writes_its_json_and_markdown(tmp_path):
    out = tmp_path / "r.json"
    command = [sys.executable, str(ROOT / "benchmarks/input_redraw.py"), "--gib", "0.002"]
    command += ["--repeats", "1", "--folder", str(tmp_path), "--json", str(out)]
    command += ["--markdown", str(tmp_path / "r.md")]
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    report = json.loads(out.read_text())
    assert report["size_bytes"] == int(0.002 * 2**30) // 4 * 4 and report["repeats"] == 1
    assert (tmp_path / "r.md").read_text() == done.stdout
