"""The survey_summary rule and the `survey` target, run by Snakemake on hand-built records.

survey.smk (the record rules) defines SURVEY, SURVEY_CHECKOUT and survey_record_files; here a
small Snakefile defines them over records written by hand, so that this file tests the summary
rule alone: its outputs are the declared ones, it reruns when a record changes, and not when
nothing did.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pandas as pd
import pytest
from conftest import ROOT, snakemake
from survey_records import record, write_records

from kbfuse.io import write_json
from kbfuse.survey.summary import summary_outputs

pytestmark = pytest.mark.slow
MODES = ["strict", "kernelbench-defaults"]
STUB = f"""
from kbfuse import layout
from kbfuse.workflow.deps import module_files

MODES = {MODES!r}
ENV = "../../envs/kbfuse.yaml"
SURVEY = {{"numerics": MODES}}
SURVEY_CHECKOUT = "checkout"


def survey_record_files(wildcards):
    return expand("results/survey/{{m}}/tasks/{{t}}.json", m=SURVEY["numerics"], t=[1, 53])


def survey_floor_files(wildcards):
    return expand("results/survey/floors/{{t}}.json", t=[1, 53])


def survey_path(name, **wildcards):
    return layout.survey_file(name, 2, **wildcards)


include: "workflow/rules/survey_summary.smk"
"""


@pytest.fixture
def stub_workflow(tmp_path) -> Path:
    for name in ("src", "workflow", "envs"):
        shutil.copytree(ROOT / name, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "Snakefile").write_text(STUB)
    shutil.copytree(ROOT / "tests/data/kernelbench_timing", tmp_path / "checkout/results/timing")
    write_records(
        tmp_path / "results",
        [record(task=t, mode=m) for m in MODES for t in (1, 53)],
    )
    for task in (1, 53):
        write_json(tmp_path / f"results/survey/floors/{task}.json", floor_of(record(task=task)))
    return tmp_path


def floor_of(rec: dict, floor_bytes: int = 4096 * 128 * 4 * 2) -> dict:
    """The survey_floor record of a hand-built record's task (the GEMM's output read, the
    task's written)."""
    return {
        "kind": "survey_floor", "schema_version": 1, "task": rec["task"], "level": rec["level"],
        "file": rec["file"], "sha256": rec["sha256"], "semantics": rec["semantics"],
        "floor": {
            "floor_bytes": floor_bytes, "read_library_bytes": floor_bytes // 2,
            "read_input_bytes": 0, "read_parameter_bytes": 0, "written_bytes": floor_bytes // 2,
            "library_outputs": [
                {"op": "aten.addmm", "shape": [128, 4096], "bytes": floor_bytes // 2, "count": 1}
            ],
        },
        "problem": None,
    }  # fmt: skip


def test_survey_target_writes_the_declared_summary_and_reruns_on_change(stub_workflow):
    snakemake(stub_workflow, "--cores", "1", "survey")
    out = stub_workflow / "results/survey/summary"
    assert sorted(p.name for p in out.iterdir()) == sorted(summary_outputs(MODES))
    main = pd.read_csv(out / "survey_kernelbench-defaults.csv")
    assert list(main["anchor_eager_ms"]) == [4.35, 5.53]  # tasks 1 and 53 at the pin
    assert list(main["floor_bytes"]) == [4096 * 128 * 4 * 2] * 2  # from the floor records

    again = snakemake(stub_workflow, "--cores", "1", "survey", "-n")
    assert "Nothing to be done" in again.stdout + again.stderr

    rec = record(task=53, mode="strict", blind_spot=True)
    write_records(stub_workflow / "results", [rec])
    plan = snakemake(stub_workflow, "--cores", "1", "survey", "-n")
    assert "survey_summary" in plan.stdout
    snakemake(stub_workflow, "--cores", "1", "survey")
    main = pd.read_csv(out / "survey_strict.csv")
    assert dict(zip(main["task"], main["blind_spot"], strict=True)) == {1: False, 53: True}


def test_a_changed_floor_record_reruns_the_summary_with_its_floor(stub_workflow):
    snakemake(stub_workflow, "--cores", "1", "survey")
    write_json(stub_workflow / "results/survey/floors/53.json", floor_of(record(task=53), 1 << 20))
    plan = snakemake(stub_workflow, "--cores", "1", "survey", "-n")
    assert "survey_summary" in plan.stdout
    snakemake(stub_workflow, "--cores", "1", "survey")
    main = pd.read_csv(stub_workflow / "results/survey/summary/survey_strict.csv")
    assert dict(zip(main["task"], main["floor_bytes"], strict=True)) == {
        1: 4096 * 128 * 4 * 2,
        53: 1 << 20,
    }


def test_a_bad_record_fails_the_job_naming_it_and_leaves_no_summary(stub_workflow):
    bad = stub_workflow / "results/survey/strict/tasks/53.json"
    bad.write_text(bad.read_text().replace('"kind": "survey_task"', '"kind": "timing"'))
    proc = snakemake(stub_workflow, "--cores", "1", "survey", check=False)
    assert proc.returncode != 0
    log = (stub_workflow / "results/survey/logs/summary.log").read_text()
    assert "53.json: field kind is not 'survey_task'" in log
    assert not (stub_workflow / "results/survey/summary/survey_strict.csv").exists()
