"""benchmarks/tail_roofline.py and kbfuse.timing.roofline on the committed H200 run (no GPU).

Every expected number is computed here from the raw reference JSON (timing medians, tail
bytes, measured copy bandwidth), independently of kbfuse.results.summary, and checked against the
report. The reference holds one real `fast` variant; a copy with more `fast` variants added
checks the target logic on either side of each threshold.
"""

from __future__ import annotations

import copy
import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kbfuse.errors import KbfuseError
from kbfuse.io import read_json, write_json
from kbfuse.timing import roofline

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "results/reference/h200"
SCRIPT = ROOT / "benchmarks/tail_roofline.py"
NAIVE = ("cupy-default", "nvrtc-cubin-noftz", "nvrtc-cubin-ftz", "nvrtc-ptx-noftz", "nvrtc-ptx-ftz")
NAIVE12 = ("nvrtc12-cubin-noftz", "nvrtc12-cubin-ftz", "nvrtc12-ptx-noftz", "nvrtc12-ptx-ftz")
FAST = "fast-nvrtc-cubin-noftz"
IMPLS = ("eager", "torchscript", "inductor", *NAIVE, FAST, *NAIVE12, "fast-nvrtc12-cubin-noftz")


def raw(task: int) -> tuple[dict, float]:
    """(tail/graph measurements, copy bandwidth in GB/s) straight from the reference files."""
    timing = json.loads((REFERENCE / f"timing/{task}.json").read_text())
    env = json.loads((REFERENCE / "env/fingerprint.json").read_text())
    return timing, env["copy_bandwidth"]["gbps"]


@pytest.fixture(scope="module")
def report() -> dict:
    return roofline.roofline(REFERENCE)


def rows_of(report: dict, task: int) -> dict[str, dict]:
    return {r["impl"]: r for r in report["rows"] if r["task"] == task}


def test_task53_inductor_from_the_reference(report):
    timing, gbps = raw(53)
    inductor_ms = timing["measurements"]["tail/graph"]["inductor"]["median_ms"]
    floor_s = timing["tail_bytes"] / (gbps * 1e9)
    row = rows_of(report, 53)["inductor"]
    assert row["median_us"] == pytest.approx(inductor_ms * 1e3, rel=1e-12)
    assert row["median_us"] == pytest.approx(36.806, abs=1e-3)
    assert row["bytes_moved"] == timing["tail_bytes"] == 128 * 2**20
    assert row["floor_us"] == pytest.approx(floor_s * 1e6, rel=1e-12)
    assert row["floor_us"] == pytest.approx(31.621, abs=1e-3)
    assert row["pct_of_floor"] == pytest.approx(100 * floor_s / (inductor_ms * 1e-3), rel=1e-12)
    assert row["pct_of_floor"] == pytest.approx(85.91, abs=0.01)
    assert row["ratio_vs_inductor"] == 1.0
    assert row["kernel"] is None and row["kind"] == "baseline"


@pytest.mark.parametrize("task", [53, 81, 95])
def test_every_row_recomputed_from_the_raw_files(report, task):
    timing, gbps = raw(task)
    graph = timing["measurements"]["tail/graph"]
    rows = rows_of(report, task)
    assert list(rows) == list(IMPLS) == timing["timed"]
    floor_us = timing["tail_bytes"] / (gbps * 1e9) * 1e6
    inductor = graph["inductor"]["median_ms"]
    for impl, row in rows.items():
        median = graph[impl]["median_ms"]
        assert row["median_us"] == pytest.approx(median * 1e3, rel=1e-12)
        assert row["floor_us"] == pytest.approx(floor_us, rel=1e-12)
        assert row["pct_of_floor"] == pytest.approx(100 * floor_us / (median * 1e3), rel=1e-12)
        assert row["ratio_vs_inductor"] == pytest.approx(median / inductor, rel=1e-12)
        assert row["rounds"] == len(graph[impl]["samples_ms"]) == 25
    for variant in (*NAIVE, *NAIVE12):  # the study's kernels, as the timing job recorded them
        assert rows[variant]["kernel"] == "naive"
        assert rows[variant]["kernel_source"] == "timing"
        assert rows[variant]["target_kernel"] is False
        assert rows[variant]["targets_met"] is None
        assert rows[variant]["ratio_vs_inductor"] > 1.3  # the naive kernels lose to Inductor
    fast = rows[FAST]
    assert fast["kernel"] == "fast" and fast["target_kernel"] is True
    assert fast["ratio_vs_inductor"] < 1.1 and fast["pct_of_floor"] > 50
    assert fast["targets_met"] is False  # on this run (docs/device-runs.md says why)


def test_reference_task_records(report):
    assert report["kind"] == "tail_roofline" and report["scope"] == "tail/graph"
    assert [r["task"] for r in report["tasks"]] == [53, 81, 95]
    assert [r["bytes_moved"] for r in report["tasks"]] == [134217728, 67108864, 67141632]
    assert report["tasks"][0]["copy_bandwidth_gbps"] == pytest.approx(4244.58, abs=0.01)
    assert report["targets"] == {
        "kernels": ["fast"],
        "max_ratio_vs_inductor": 1.0,
        "min_pct_of_floor": 85.0,
    }


def test_markdown_rows(report):
    text = roofline.report_markdown(report)
    assert "| 53 | inductor | — | 36.8 | 134,217,728 | 31.6 | 85.9 | 1.000 |  |" in text
    assert "| 81 | nvrtc-cubin-noftz | naive | 35.6 | 67,108,864 | 15.8 | 44.4 | 1.611 |  |" in text
    assert (
        "| 53 | fast-nvrtc-cubin-noftz | fast | 37.2 | 134,217,728 | 31.6 | 85.0 | 1.011 | "
        "not met: 1.011 x Inductor > 1.00; 85.0 % of floor < 85 % |" in text
    )
    # 84.97 % of the floor, printed 85.0; its NVRTC 12.9 twin reaches 85.04 % but is slower
    # than Inductor's median in this run
    assert (
        "| 53 | fast-nvrtc12-cubin-noftz | fast | 37.2 | 134,217,728 | 31.6 | 85.0 | 1.010 | "
        "not met: 1.010 x Inductor > 1.00 |" in text
    )
    assert "Met by 0 of 6 task x variant rows." in text
    assert text.count("\n| 95 |") == len(IMPLS)


# ---------------------------------------------------------------- fast kernels and targets


def add_variant(results: Path, task: int, name: str, median_ms: float, kernel_in="meta"):
    """Add a timed variant to a copied timing file: tail/graph samples all `median_ms`."""
    path = results / f"timing/{task}.json"
    timing = read_json(path)
    entry = copy.deepcopy(timing["measurements"]["tail/graph"]["nvrtc-ptx-noftz"])
    entry.update(median_ms=median_ms, q1_ms=median_ms, q3_ms=median_ms)
    entry["samples_ms"] = [median_ms] * len(entry["samples_ms"])
    timing["measurements"]["tail/graph"][name] = entry
    timing["timed"].append(name)
    sha = f"{len(timing['timed']):064x}"
    timing["provenance"]["artifacts"][name] = sha
    if kernel_in == "timing":
        timing["provenance"].setdefault("kernels", {})[name] = "fast"
    write_json(path, timing)
    if kernel_in in ("meta", "stale meta"):
        meta = {"kind": "compile", "variant": name, "kernel": "fast"}
        meta["artifact_sha256"] = sha if kernel_in == "meta" else "0" * 64
        write_json(results / f"compile/{name}/meta.json", meta)


@pytest.fixture
def results(tmp_path) -> Path:
    dest = tmp_path / "results"
    for sub in ("timing", "env", "compile"):
        shutil.copytree(REFERENCE / sub, dest / sub)
    return dest


def test_targets_for_fast_kernels(results):
    timing, gbps = raw(53)
    inductor = timing["measurements"]["tail/graph"]["inductor"]["median_ms"]
    floor_ms = timing["tail_bytes"] / (gbps * 1e9) * 1e3
    good_ms = floor_ms / 0.874  # 87.4 % of the floor, faster than Inductor
    add_variant(results, 53, "fast-good", good_ms)
    add_variant(results, 53, "fast-slow", inductor * 1.05, kernel_in="timing")
    add_variant(results, 53, "fast-unnamed", inductor * 0.9, kernel_in="stale meta")
    report = roofline.roofline(results, tasks=[53])
    rows = rows_of(report, 53)
    good, slow, unnamed = rows["fast-good"], rows["fast-slow"], rows["fast-unnamed"]
    assert good["kernel"] == "fast" and good["kernel_source"] == "compile meta"
    assert good["ratio_vs_inductor"] == pytest.approx(good_ms / inductor, rel=1e-12)
    assert good["ratio_vs_inductor"] < 1
    assert good["pct_of_floor"] == pytest.approx(87.4, rel=1e-12)
    assert (good["meets_inductor"], good["meets_floor"], good["targets_met"]) == (True, True, True)
    assert slow["kernel"] == "fast" and slow["kernel_source"] == "timing"
    assert slow["ratio_vs_inductor"] == pytest.approx(1.05, rel=1e-12)
    assert slow["pct_of_floor"] == pytest.approx(100 * floor_ms / (inductor * 1.05), rel=1e-12)
    assert (slow["meets_inductor"], slow["meets_floor"], slow["targets_met"]) == (
        False,
        False,
        False,
    )
    # metadata for another artifact: the kernel is not taken from it, so no target check
    assert unnamed["kernel"] is None and "another artifact" in unnamed["kernel_source"]
    assert unnamed["target_kernel"] is False and unnamed["targets_met"] is None
    text = roofline.report_markdown(report)
    assert "| 53 | fast-good | fast | 36.2 |" in text
    assert text.count("| met |") == 1  # fast-good (the recorded fast rows are not)
    assert "not met: 1.050 x Inductor > 1.00; 81.8 % of floor < 85 %" in text
    assert "| 53 | fast-unnamed |  | 33.1 |" in text
    assert "Met by 1 of 4 task x variant rows." in text


def test_missing_fingerprint_is_named(results):
    (results / "env/fingerprint.json").unlink()
    with pytest.raises(KbfuseError, match=r"env/fingerprint\.json is missing"):
        roofline.roofline(results)


def test_no_timing_files(tmp_path):
    with pytest.raises(KbfuseError, match="no timing files"):
        roofline.roofline(tmp_path)


def test_script_writes_json_and_markdown(tmp_path):
    out_json, out_md = tmp_path / "roofline.json", tmp_path / "roofline.md"
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--results", str(REFERENCE), "--task", "81"]
        + ["--json", str(out_json), "--markdown", str(out_md)],
        capture_output=True,
        text=True,
        check=True,
    )
    assert proc.stdout == out_md.read_text()
    data = read_json(out_json)
    assert [r["task"] for r in data["tasks"]] == [81]
    timing, gbps = raw(81)
    graph = timing["measurements"]["tail/graph"]
    inductor = {r["impl"]: r for r in data["rows"]}["inductor"]
    expected = 100 * timing["tail_bytes"] / (gbps * 1e9) / (graph["inductor"]["median_ms"] * 1e-3)
    assert math.isclose(inductor["pct_of_floor"], expected, rel_tol=1e-12)
    assert round(inductor["pct_of_floor"], 1) == 71.5


def test_script_error_exit(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--results", str(tmp_path)], capture_output=True, text=True
    )
    assert proc.returncode == 1 and "no timing files" in proc.stderr
