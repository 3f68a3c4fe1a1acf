"""The committed H200 run of the second fused study (results/reference/h200/fused2), checked
and summarised again on the CPU: its bundle verifies, `kbfuse summarize --study fused2`
rebuilds its tables byte for byte, and the tables say what the records hold, including a
compiled baseline that failed correctness and so was never timed (Inductor on task 4 with
TF32, the first run where a baseline was gated out of a study's timing, and max-autotune beside
it)."""

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


AUTOTUNE = "inductor-max-autotune-no-cudagraphs"


def test_a_baseline_that_failed_correctness_is_skipped_not_timed():
    """Both Inductors (default and max-autotune) fail task 4 with TF32 on the same cases."""
    baselines = read_json(REFERENCE / "correctness/4/baselines.json")["implementations"]
    timing = read_json(REFERENCE / "timing/4.json")
    assert baselines["torchscript"]["passed"] is True
    skipped = table("skipped")
    rows = skipped[(skipped.task == 4) & (skipped.stage == "timing")]
    assert list(rows.implementation) == ["inductor", AUTOTUNE]
    for inductor in ("inductor", AUTOTUNE):
        assert baselines[inductor]["passed"] is False
        assert inductor not in timing["timed"]
        failing = baselines[inductor]["failing_checks"]
        assert timing["skipped"][inductor]["failing_checks"] == failing
        row = rows[rows.implementation == inductor]
        assert row.failing_checks.iloc[0] == ", ".join(failing)
    # Task 65 (strict FP32): every baseline passed and was timed.
    assert read_json(REFERENCE / "timing/65.json")["skipped"] == {}


def test_every_configured_baseline_was_checked_and_max_autotune_timed_where_it_passed():
    """The run's baselines are the config's `fused2.baselines`, max-autotune among them: each
    has a correctness record on both tasks, and on task 65 (where it passes) a graph time."""
    import yaml

    configured = yaml.safe_load(CONFIG.read_text())["fused2"]["baselines"]
    assert AUTOTUNE in configured
    full = table("timing_full")
    for task in (4, 65):
        checked = read_json(REFERENCE / f"correctness/{task}/baselines.json")["implementations"]
        assert set(checked) == set(configured) - {"eager"}
    timed = full[(full.task == 65) & (full.method == "graph") & (full.impl == AUTOTUNE)]
    assert len(timed) == 1 and timed.median_ms.iloc[0] > 0
    assert read_json(REFERENCE / "correctness/65/baselines.json")["implementations"][AUTOTUNE][
        "passed"
    ]


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
