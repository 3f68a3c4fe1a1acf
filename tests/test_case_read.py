"""benchmarks/case_read.py and kbfuse.candidates.readcost: a case read mapped against copied,
on a small tensor."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kbfuse.candidates.readcost import WAYS, measure, report_markdown

ROOT = Path(__file__).resolve().parents[1]


def test_both_ways_are_timed_and_give_the_same_case(tmp_path):
    report = measure(4 << 20, 2, tmp_path)
    assert list(report["load_s"]) == list(WAYS) == ["copied", "mapped"]
    for way in WAYS:
        # the fingerprint reads every byte once more: never less than the load alone
        assert 0 < report["load_s"][way] <= report["load_and_fingerprint_s"][way]
    total = report["load_and_fingerprint_s"]
    assert report["copied_over_mapped"] == pytest.approx(
        total["copied"] / total["mapped"], rel=0.01, abs=0.01
    )
    assert report["same_fingerprint"] is True
    assert list(tmp_path.iterdir()) == []  # the written file is gone
    text = report_markdown(report)
    assert "| mapped |" in text and "copied over mapped" in text


def test_a_size_that_is_no_float32_count_is_refused_before_anything_is_written(tmp_path):
    with pytest.raises(ValueError, match="6 bytes is not a positive multiple of 4"):
        measure(6, 1, tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_the_benchmark_writes_its_json_and_markdown(tmp_path):
    out = tmp_path / "r.json"
    command = [sys.executable, str(ROOT / "benchmarks/case_read.py"), "--gib", "0.002"]
    command += ["--repeats", "1", "--folder", str(tmp_path), "--json", str(out)]
    command += ["--markdown", str(tmp_path / "r.md")]
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    report = json.loads(out.read_text())
    assert report["size_bytes"] == int(0.002 * 2**30) // 4 * 4 and report["repeats"] == 1
    assert (tmp_path / "r.md").read_text() == done.stdout
    missing = [sys.executable, str(ROOT / "benchmarks/case_read.py"), "--folder", "/nonexistent"]
    failed = subprocess.run(missing + ["--gib", "0.001"], capture_output=True, text=True)
    assert failed.returncode == 1 and failed.stderr == "case_read: /nonexistent is not a folder\n"
