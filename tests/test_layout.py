"""kbfuse.layout is the one place for paths, record kinds and summary tables.

What the rest of the repository says about them must agree with it: the record schemas, the
record table of docs/contracts.md, the summary's table builders and the report's captions,
and no rule file spells a path under results/ itself.
"""

import json
import re
from pathlib import Path

import pytest

from kbfuse import layout
from kbfuse.errors import KbfuseError
from kbfuse.results import records, summary

ROOT = Path(__file__).resolve().parents[1]
CONFIG = {"tasks": [53, 95], "variants": {"a": {}, "b": {}}}


def test_paths_keep_the_wildcards_not_given():
    assert layout.record("correctness") == "results/correctness/{task}/{variant}.json"
    assert layout.record("correctness", variant="a") == "results/correctness/{task}/a.json"
    assert layout.record("timing", "elsewhere", task=53) == "elsewhere/timing/53.json"
    assert layout.file("summary", name="x.csv") == "results/summary/x.csv"
    assert layout.file("artifact", variant="a") == "results/compile/a/tails.bin"
    assert layout.log("timing/{task}") == "results/logs/timing/{task}.log"
    assert layout.benchmark("verify/variants") == "results/benchmarks/verify/variants.tsv"


def test_result_paths_cover_every_record_in_config_order():
    paths = layout.result_paths(CONFIG)
    assert paths[("correctness", 95, "b")] == "correctness/95/b.json"
    assert paths[("kernelbench_pin",)] == "kernelbench/pin.json"
    assert [key for key in paths if key[0] == "correctness"] == [
        ("correctness", 53, "a"),
        ("correctness", 53, "b"),
        ("correctness", 95, "a"),
        ("correctness", 95, "b"),
    ]
    assert ("witness81",) not in paths  # task 81 is not in the study
    with_81 = layout.result_paths({**CONFIG, "tasks": [81]})
    assert with_81[("witness81",)] == "controls/witness81.json"
    assert len(paths) == 5 + 2 * 2 + 2 * 2 + 3 * 2  # single, per variant, per pair, per task


def test_record_files_go_kind_by_kind():
    assert layout.record_files(CONFIG, ["timing", "verify"]) == [
        "results/timing/53.json",
        "results/timing/95.json",
        "results/verify/a.json",
        "results/verify/b.json",
    ]


def test_every_record_kind_has_its_schema():
    # the survey's records are read by its own summary, not the study's (layout.FILES)
    survey = ("survey_task", "survey_devices", "survey_floor")
    assert (*layout.RECORDS, "manifest", *survey) == records.SCHEMA_KINDS
    for kind in records.SCHEMA_KINDS:
        assert (ROOT / "src/kbfuse/schemas" / f"{kind}.schema.json").is_file(), kind


def test_the_contracts_record_table_is_the_layout():
    text = (ROOT / "docs/contracts.md").read_text()
    rows = re.findall(r"^\| `([^`]+)`[^|]*\| `(\w+)` \| `\w+\.schema\.json`", text, re.M)
    documented = {kind: path for path, kind in rows}
    assert documented.pop("manifest") == layout.FILES["manifest"]
    assert documented.pop("survey_task") == layout.FILES["survey_record"]
    assert documented.pop("survey_devices") == layout.FILES["survey_devices"]
    assert documented == {kind: entry.path for kind, entry in layout.RECORDS.items()}


def test_every_table_has_a_builder_and_a_caption():
    assert list(summary.builders()) == list(layout.TABLES)
    for output in layout.summary_outputs({"tasks": [53]}):
        assert (ROOT / "workflow/report" / layout.caption_name(output)).is_file(), output
    assert {table.category for table in layout.TABLES.values()} <= {"Bits", "Time", "Environment"}


def test_a_table_without_a_builder_is_named(monkeypatch):
    monkeypatch.setitem(layout.TABLES, "new_table_x", layout.Table("new", "Bits"))
    with pytest.raises(KbfuseError, match=r"summary tables \['new_table_x'\] have no builder"):
        summary.builders()


def test_report_categories_come_from_the_tables():
    assert layout.report_category("timing_tail.md") == "Time"
    assert layout.report_category("environment.csv") == "Environment"
    assert layout.report_category("tail_time_53.png") == "Plots"
    assert layout.report_category("exhaustive.csv") == "Bits"


@pytest.mark.parametrize("path", sorted((ROOT / "workflow").rglob("*.smk")), ids=lambda p: p.name)
def test_no_rule_file_spells_a_result_path(path):
    assert '"results/' not in path.read_text()


def test_every_schema_is_titled_with_its_records_path():
    for kind in layout.RECORDS:
        schema = json.loads(records.schema_text(f"{kind}.schema.json"))
        assert schema["title"] == layout.record(kind), kind
