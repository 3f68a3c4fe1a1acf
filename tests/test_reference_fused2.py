"""The committed H200 run of the second fused study (results/reference/h200/fused2), checked
and summarised again on the CPU: its bundle verifies, `kbfuse summarize --study fused2`
rebuilds its tables byte for byte, and the tables say what the records hold, including a
compiled baseline that failed correctness and so was never timed (Inductor on task 4 with
TF32, the first run where a baseline was gated out of a study's timing)."""

from __future__ import annotations

import tarfile
from pathlib import Path

import pandas as pd
import pytest
from summary_tables import assert_same_summary

from kbfuse.io import read_json
from kbfuse.workflow import cli

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "results/reference/h200/fused2"
SUMMARY = REFERENCE / "summary"
CONFIG = ROOT / "config/config.yaml"


@pytest.fixture(scope="module")
def rebuilt(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("fused2-summary") / "summary"
    args = ["summarize", str(REFERENCE), "--config", str(CONFIG), "--study", "fused2"]
    assert cli.main([*args, "--out", str(out)]) == cli.EXIT_OK
    return out


def table(name: str) -> pd.DataFrame:
    return pd.read_csv(SUMMARY / f"{name}.csv")


def test_the_bundle_verifies_and_names_the_h200(capsys):
    bundle = REFERENCE / "bundle/kbfuse-results.tar.gz"
    assert cli.main(["verify-bundle", str(bundle)]) == cli.EXIT_OK
    said = capsys.readouterr().out
    manifest = read_json(REFERENCE / "manifest.json")
    assert manifest["fingerprint"]["gpu"]["name"] == "NVIDIA H200"
    assert "produced on: GPU NVIDIA H200, driver " in said
    assert f"files listed in manifest: {len(manifest['files'])}" in said
    assert "OK: every file matches the manifest" in said
    with tarfile.open(bundle, "r:gz") as tar:
        inside = [m for m in tar.getnames() if m.endswith("manifest.json")]
        assert len(inside) == 1
        assert tar.extractfile(inside[0]).read() == (REFERENCE / "manifest.json").read_bytes()


def test_summarize_rebuilds_the_committed_tables(rebuilt):
    assert_same_summary(SUMMARY, rebuilt)


def test_a_baseline_that_failed_correctness_is_skipped_not_timed():
    baselines = read_json(REFERENCE / "correctness/4/baselines.json")["implementations"]
    timing = read_json(REFERENCE / "timing/4.json")
    assert baselines["inductor"]["passed"] is False
    assert baselines["torchscript"]["passed"] is True
    assert "inductor" not in timing["timed"]
    failing = baselines["inductor"]["failing_checks"]
    assert timing["skipped"]["inductor"]["failing_checks"] == failing
    skipped = table("skipped")
    row = skipped[(skipped.task == 4) & (skipped.stage == "timing")]
    assert list(row.implementation) == ["inductor"]
    assert row.failing_checks.iloc[0] == ", ".join(failing)
    # Task 65 (strict FP32): every baseline passed and was timed.
    assert read_json(REFERENCE / "timing/65.json")["skipped"] == {}


def test_the_prediction_compares_with_the_fastest_baseline_that_passed():
    prediction = table("prediction")
    full = table("timing_full")
    graph = full[(full.method == "graph") & (full.kind == "baseline")]
    for task, rows in prediction.groupby("task"):
        timed = graph[graph.task == task]
        passed = timed[timed.impl != "eager"]
        fastest = passed.loc[passed.median_ms.idxmin()]
        assert set(rows.best_compiled) == {fastest.impl}
        assert rows.best_compiled_ms.unique() == pytest.approx([fastest.median_ms])
        for _, row in rows.iterrows():
            assert row.speedup_vs_best_compiled == pytest.approx(
                row.best_compiled_ms / row.fused_ms
            )
