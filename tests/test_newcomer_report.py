"""tools/reference_report.py: the HTML report of the committed H200 run in one command.

Built on the CPU from results/reference/h200 with a checkout whose current config differs from
the recorded one (tasks [53] only), to show that the report carries the recorded config, its
environment and its tables (each also as an HTML table shown in the page), and that Snakemake
prints no "Missing metadata" warning. With `--aggregates`, the same copy rebuilds the run's
summary, manifest and bundle in place, as committed.
"""

from __future__ import annotations

import base64
import html
import importlib.util
import json
import re
import shutil
from pathlib import Path

import pandas as pd
import pytest
import yaml
from conftest import copy_workflow

from kbfuse.errors import KbfuseError
from kbfuse.results.bundle import verify_bundle

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "results/reference/h200"


def load_tool():
    spec = importlib.util.spec_from_file_location(
        "reference_report", ROOT / "tools/reference_report.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def script_data(page: str, script_id: str):
    m = re.search(rf'<script id="{script_id}">\s*var \w+ = (.*?);\s*</script>', page, re.S)
    assert m, f"no data script {script_id!r} in the report"
    return json.loads(m.group(1))


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """(page, snakemake's output, recorded config) of the report, made from a checkout whose
    config/config.yaml asks for task 53 only."""
    tool = load_tool()
    tmp = tmp_path_factory.mktemp("newcomer-report")
    checkout = copy_workflow(tmp / "checkout")
    current = yaml.safe_load((checkout / "config/config.yaml").read_text())
    current["tasks"] = [53]
    (checkout / "config/config.yaml").write_text(yaml.safe_dump(current))
    tool.ROOT = checkout
    out = tmp / "out/report.html"
    log = tool.build_report(REFERENCE, out, tmp / "wf")
    recorded = json.loads((REFERENCE / "manifest.json").read_text())["config"]
    return out.read_text(), log, recorded


def test_report_has_no_missing_metadata_warning(built):
    _, log, _ = built
    assert "Report created" in log
    assert "Missing metadata" not in log
    assert "Warning" not in log


def test_report_describes_the_recorded_config_not_the_current_one(built):
    page, _, recorded = built
    text = html.unescape(re.sub(r"<[^>]+>", "", script_data(page, "workflow-desc")))
    assert "level-2 tasks [53, 81, 95]" in text
    assert f"tasks: {recorded['tasks']}" in text and "tasks: [53]\n" not in text
    assert f"kernelbench: {recorded['kernelbench']}" in text
    for name, spec in recorded["variants"].items():
        line = f"variant {name}: route {spec['route']}, kernel {spec['kernel']}, options "
        assert line + " ".join(spec["options"]) in text


def test_report_embeds_the_recorded_environment_and_every_task(built):
    page, _, _ = built
    results = script_data(page, "results")
    env = results["results/summary/environment.md"]["data_uri"].partition(",")[2]
    assert base64.b64decode(env) == (REFERENCE / "summary/environment.md").read_bytes()
    assert "NVIDIA H200" in base64.b64decode(env).decode()
    assert {f"results/summary/tail_time_{t}.png" for t in (53, 81, 95)} <= set(results)
    assert sorted(script_data(page, "rules")) == ["bundle", "manifest", "report_tables", "summary"]


def test_every_summary_table_is_shown_in_the_page_as_html(built):
    page, _, _ = built
    results = script_data(page, "results")
    csvs = sorted(p for p in (REFERENCE / "summary").iterdir() if p.suffix == ".csv")
    assert len(csvs) == 18
    for csv in csvs:
        entry = results[f"results/report/{csv.stem}.html"]
        assert entry["mime_type"] == "text/html"  # shown in the page, not a download
        assert entry["job_properties"]["rule"] == "report_tables"
        table = base64.b64decode(entry["data_uri"].partition(",")[2]).decode()
        header = csv.read_text().splitlines()[0].split(",")
        assert re.findall(r"<th>(.*?)</th>", table) == header, csv.name
        rows = len(pd.read_csv(csv))
        assert table.count("<tr>") == rows, csv.name
        summary = results[f"results/summary/{csv.name}"]
        assert entry["caption"] == summary["caption"], csv.name
    categories = script_data(page, "categories")
    assert "results/report/environment.html" in categories["Environment"]["Tables"]


def test_a_run_without_manifest_is_refused_before_any_output(tmp_path):
    tool = load_tool()
    (tmp_path / "run").mkdir()
    out = tmp_path / "report.html"
    with pytest.raises(KbfuseError, match=r"run/manifest.json: no manifest"):
        tool.build_report(tmp_path / "run", out, tmp_path / "wf")
    assert not out.exists() and not (tmp_path / "wf").exists()
    assert tool.main(["--reference", str(tmp_path / "run"), "--out", str(out)]) == 1
    assert not out.exists()


def test_an_existing_workdir_is_refused_before_any_output(tmp_path):
    tool = load_tool()
    (tmp_path / "wf").mkdir()
    out = tmp_path / "report.html"
    with pytest.raises(KbfuseError, match=r"--workdir .*/wf: exists"):
        tool.build_report(REFERENCE, out, tmp_path / "wf")
    assert not out.exists() and list((tmp_path / "wf").iterdir()) == []


def test_aggregates_rebuild_the_committed_summary_manifest_and_bundle_in_place(tmp_path):
    """`--aggregates` on a copy of the reference, its summary, manifest and bundle removed:
    they come back as committed (tables, manifest and bundle byte for byte where the plots'
    bytes match, which depends on matplotlib), and in the config's order of variants."""
    tool = load_tool()
    copy = tmp_path / "h200"
    shutil.copytree(
        REFERENCE,
        copy,
        ignore=lambda d, names: ("summary", "bundle") if d == str(REFERENCE) else (),
    )
    manifest = REFERENCE / "manifest.json"
    shutil.copyfile(manifest, copy / "manifest.json")  # the recorded config is read from it
    args = ["--aggregates", "--reference", str(copy), "--workdir", str(tmp_path / "wf")]
    assert tool.main(args) == 0
    committed = {p.name: p.read_bytes() for p in (REFERENCE / "summary").iterdir()}
    rebuilt = {p.name: p.read_bytes() for p in (copy / "summary").iterdir()}
    assert sorted(rebuilt) == sorted(committed)
    for name, data in committed.items():
        if not name.endswith(".png"):
            assert rebuilt[name] == data, name
    report = verify_bundle(copy / "bundle/kbfuse-results.tar.gz")
    assert report["ok"] and report["checked"] == 121, report
    recorded, written = (
        json.loads(manifest.read_text()),
        json.loads((copy / "manifest.json").read_text()),
    )
    assert written["config"] == recorded["config"]
    for rel, entry in recorded["files"].items():
        if not rel.endswith(".png"):
            assert written["files"][rel] == entry, rel


def test_a_recorded_config_takes_the_checkouts_order_of_variants():
    tool = load_tool()
    order = list(yaml.safe_load((ROOT / "config/config.yaml").read_text())["variants"])
    recorded = {"tasks": [53], "variants": {name: {"x": name} for name in sorted(order + ["new"])}}
    ordered = tool.in_checkout_order(recorded)
    assert list(ordered["variants"]) == [*order, "new"]
    assert ordered["variants"]["new"] == {"x": "new"} and ordered["tasks"] == [53]
