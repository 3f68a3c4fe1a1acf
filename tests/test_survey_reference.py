"""The committed H200 reference survey (results/reference/h200/survey): its manifest holds (every
record follows its schema: tests/test_records.py), and the summary tables say what the records say.

The summary itself is not rebuilt here: its anchor column needs KernelBench's own timing files
from the pinned checkout, which CI does not fetch.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest

from kbfuse.io import read_json
from kbfuse.results import records
from kbfuse.results.manifest import verify_manifest

REFERENCE = Path(__file__).resolve().parents[1] / "results" / "reference" / "h200" / "survey"
MODES = ("strict", "kernelbench-defaults")
AUTOTUNE = "inductor-max-autotune-no-cudagraphs"


@pytest.fixture(scope="module")
def recs():
    """The task records, read as JSON: tests/test_records.py checks each against its schema
    (test_the_committed_reference_follows_every_schema), which is most of reading them."""
    return {
        mode: {
            int(path.stem): records.parse_json(path.read_bytes(), str(path))
            for path in (REFERENCE / "survey" / mode / "tasks").glob("*.json")
        }
        for mode in MODES
    }


def test_the_reference_matches_its_manifest():
    report = verify_manifest(REFERENCE, REFERENCE / "manifest.json", ignore=["manifest.json"])
    assert report["ok"], {k: report[k] for k in ("changed", "missing", "extra")}
    assert report["checked"] == 527
    assert report["pin"]["commit"] == "423217d9fda91e0c2d67e4a43bf62f96f6d104f1"
    assert report["environment"]["gpu"].startswith("NVIDIA H200")


def test_every_level_2_task_in_both_modes_from_one_job_each(recs):
    listed = read_json(REFERENCE / "survey" / "task_list.json")["tasks"]
    assert len(listed) == 100
    for mode in MODES:
        assert sorted(recs[mode]) == sorted(map(int, listed))
        for rec in recs[mode].values():
            assert rec["numerics"]["mode"] == mode and rec["device"] == "cuda"
            assert rec["job"]["modes"] == list(MODES)
            assert rec["timing_protocol"]["rounds"] == 30
            assert rec["timing_protocol"]["methods"] == ["events", "graph", "cold_l2"]


def test_the_summary_tables_say_what_the_records_say(recs):
    summary = REFERENCE / "survey" / "summary"
    failures = pd.read_csv(summary / "failures.csv")
    failed = {
        (task, mode, name)
        for mode in MODES
        for task, rec in recs[mode].items()
        for name, entry in rec["baselines"].items()
        if entry["status"] == "failed" or not entry["correctness"]["official_pass"]
    }
    assert set(zip(failures.task, failures.numerics, failures.baseline, strict=True)) == failed
    assert len(failed) == 32  # none failed a stage; 32 fail the official check
    for mode in MODES:
        main = pd.read_csv(summary / f"survey_{mode}.csv")
        assert len(main) == 100
        spots = {task for task, rec in recs[mode].items() if rec["blind_spot"]}
        assert set(main[main.blind_spot].task) == spots
        nondeterministic = {
            task
            for task, rec in recs[mode].items()
            if rec["determinism"] and rec["determinism"]["verdict"] == "nondeterministic"
        }
        assert set(main[main.nondeterministic].task) == nondeterministic


def test_every_task_has_max_autotune_a_floor_and_a_where_to_fuse_row(recs):
    """What issue 28 asks of the reference: the max-autotune column for every task, the floor,
    headroom and outside-time breakdown columns, the where-to-fuse table and plot."""
    summary = REFERENCE / "survey" / "summary"
    floors = {int(p.stem) for p in (REFERENCE / "survey" / "floors").glob("*.json")}
    assert floors == set(range(1, 101))
    for mode in MODES:
        for rec in recs[mode].values():
            autotune = rec["baselines"][AUTOTUNE]
            assert autotune["status"] == "ok" and autotune["built_in"] == mode
            assert autotune["warm_build_s"] > 0 and autotune["build_s"] > 0
        main = pd.read_csv(summary / f"survey_{mode}.csv")
        assert main[f"{AUTOTUNE}_ms"].notna().sum() == 100
        assert main["floor_ms"].notna().sum() == 100
        breakdown = ["generated_ms", "pointwise_ms", "reduction_ms", "copy_other_ms", "idle_ms"]
        assert (main[breakdown].notna().sum() == 99).all()  # task 66: no best compiled
        where = pd.read_csv(summary / f"where_to_fuse_{mode}.csv")
        assert len(where) == 15 and list(where["rank"]) == list(range(1, 16))
        assert where["headroom_ms"].is_monotonic_decreasing
        assert (summary / f"where_to_fuse_{mode}.png").stat().st_size > 10_000


def test_kbfuse_verify_bundle_checks_the_folder_and_names_a_changed_file(tmp_path, capsys):
    from kbfuse.workflow.cli import main

    assert main(["verify-bundle", str(REFERENCE)]) == 0
    assert "files listed in manifest: 527" in capsys.readouterr().out
    copy = tmp_path / "survey"
    shutil.copytree(REFERENCE, copy)
    record = copy / "survey" / "strict" / "tasks" / "53.json"
    record.write_text(record.read_text().replace('"blind_spot": false', '"blind_spot": true'))
    (copy / "notes.txt").write_text("not in the manifest\n")
    assert main(["verify-bundle", str(copy)]) == 1
    out = capsys.readouterr().out
    assert "CHANGED survey/strict/tasks/53.json" in out and "EXTRA notes.txt" in out
    assert main(["verify-bundle", str(copy), "--ignore", "notes.txt", "--json"]) == 1
    assert json.loads(capsys.readouterr().out)["extra"] == []
