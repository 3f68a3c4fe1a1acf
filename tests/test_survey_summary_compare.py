"""A survey in the manifest, the bundle and `kbfuse compare`: its records and summary are
hashed when present, and two bundles' surveys are compared task by task."""

from __future__ import annotations

import pytest
from survey_records import record, write_records
from test_bundle import result_files
from test_summary import make_config, write_study

from kbfuse.results.bundle import make_bundle, verify_bundle
from kbfuse.results.compare import compare_bundles
from kbfuse.results.manifest import build_manifest, survey_files
from kbfuse.survey.summary import write_survey_summary


def bundle_with_survey(base, name, recs, **machine):
    config = make_config()
    root = base / name / "results"
    write_study(root, config, **machine)
    if recs:
        paths = write_records(root, recs)
        write_survey_summary(paths, None, root / "survey" / "summary")
    manifest = base / name / "manifest.json"
    build_manifest(root, result_files(root, config) + survey_files(root), config, manifest)
    return make_bundle(root, manifest, base / f"{name}.tar.gz")


def test_survey_files_lists_records_and_summary_only(tmp_path):
    assert survey_files(tmp_path) == []
    write_records(tmp_path, [record(task=53), record(task=1, mode="kernelbench-defaults")])
    (tmp_path / "survey/strict/logs").mkdir(parents=True)
    (tmp_path / "survey/strict/logs/53.log").write_text("log")
    (tmp_path / "survey/summary/.partial-x").mkdir(parents=True)
    (tmp_path / "survey/summary/failures.csv").write_text("task\n")
    (tmp_path / "survey/devices.json").write_text("{}")  # the cross-device check
    (tmp_path / "survey/logs").mkdir()
    (tmp_path / "survey/logs/devices.log").write_text("log")
    assert survey_files(tmp_path) == [
        "survey/devices.json",
        "survey/kernelbench-defaults/tasks/1.json",
        "survey/strict/tasks/53.json",
        "survey/summary/failures.csv",
    ]


@pytest.fixture(scope="module")
def bundles(tmp_path_factory):
    base = tmp_path_factory.mktemp("survey-compare")
    slower = record(task=53)
    slower["baselines"]["inductor"]["timing"]["graph"]["median_ms"] = 0.26
    a = bundle_with_survey(base, "a", [record(task=53), record(task=12)])
    b = bundle_with_survey(base, "b", [slower], gpu="NVIDIA H100 80GB HBM3")
    none = bundle_with_survey(base, "none", [])
    return a, b, none


def test_bundle_holds_and_verifies_the_survey(bundles):
    a, _, _ = bundles
    report = verify_bundle(a)
    assert report["ok"], report


def test_compare_puts_two_surveys_side_by_side(bundles):
    a, b, _ = bundles
    tables = compare_bundles([a, b], ["a", "b"])
    survey = tables["survey"]
    assert list(zip(survey["numerics"], survey["task"], strict=True)) == [("strict", 53)]
    assert survey["best_ms[a]"].tolist() == [0.25]
    assert survey["best_ms[b]"].tolist() == [0.26]
    assert survey["changed"].tolist() == ["best_ms, outside_ms, outside_pct"]
    diff = tables["differences"]
    rows = diff[diff["section"] == "rows:survey"]
    assert rows[["key", "a", "b"]].values.tolist() == [
        ["numerics=strict, task=12", "present", "(absent)"]
    ]


def test_compare_without_surveys_gives_an_empty_survey_table(bundles):
    _, _, none = bundles
    tables = compare_bundles([none, none], ["x", "y"])
    assert tables["survey"].empty
    assert "rows:survey" not in set(tables["differences"]["section"])
