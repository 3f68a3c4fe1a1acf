"""`snakemake --report` on the recorded H200 results: one self-contained HTML file.

The report is built in a copy of the workflow holding the recorded results, after the
summary, manifest and bundle rules have really run there on the recorded files (as in
test_reference_summary.py). That run is what makes the report honest: Snakemake 9 does
*not* refuse to build a report without job metadata, it warns "Missing metadata for file
..." and still embeds every `report()` output, but then its rules, runtimes and timeline are
empty, so nothing in the report says which job made the tables. With the aggregates run for
real, the metadata exists and the report shows the summary, manifest and bundle jobs
(the last test: the same report without that run, for contrast). The GPU stages themselves
have no metadata here; their results are inputs.

The HTML is checked as data: every summary output is embedded (PNG payloads decode to the
plot files byte for byte), each carries the caption of workflow/report/, and nothing is
loaded from outside the file.
"""

from __future__ import annotations

import base64
import html
import json
import re
import shutil
from pathlib import Path

import pytest
from conftest import snakemake
from test_reference_summary import REFERENCE, make_recorded_copy, run_aggregates

from kbfuse.layout import caption_name, summary_outputs
from kbfuse.workflow.config import load_config

ROOT = Path(__file__).resolve().parents[1]
CAPTIONS = ROOT / "workflow/report"
PLOTS = ("tail_time_53.png", "tail_time_81.png", "tail_time_95.png", "control_bit_equality.png")


def build_report(workdir: Path, overlay: Path) -> tuple[str, str]:
    """(html, snakemake's output) of `snakemake --report` in workdir."""
    out = workdir / "report.html"
    proc = snakemake(workdir, "--report", str(out), "--configfile", str(overlay))
    return out.read_text(), proc.stdout + proc.stderr


def script_data(page: str, script_id: str):
    """The JSON assigned in one of the report's data scripts (`var x = {...};`)."""
    m = re.search(rf'<script id="{script_id}">\s*var \w+ = (.*?);\s*</script>', page, re.S)
    assert m, f"no data script {script_id!r} in the report"
    return json.loads(m.group(1))


def words(text: str) -> str:
    return " ".join(text.split())


def html_text(fragment: str) -> str:
    return words(html.unescape(re.sub(r"<[^>]+>", "", fragment)))


def rst_text(source: str) -> str:
    """The words of a caption as docutils renders them (inline literal and strong markup off)."""
    return words(source.replace("``", "").replace("**", ""))


@pytest.fixture(scope="module")
def config() -> dict:
    return load_config(ROOT / "config/config.yaml", ROOT / "kernels")


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> tuple[Path, str, str]:
    workdir, overlay = make_recorded_copy(tmp_path_factory.mktemp("report") / "wf")
    run_aggregates(workdir, overlay)
    page, log = build_report(workdir, overlay)
    return workdir, page, log


def test_report_embeds_every_summary_output_with_its_caption(report, config):
    workdir, page, log = report
    results = script_data(page, "results")
    expected = {f"results/summary/{name}" for name in summary_outputs(config)}
    assert set(results) == expected and len(results) == 40
    for key, entry in results.items():
        name = Path(key).name
        head, _, payload = entry["data_uri"].partition(",")
        mime = {"png": "image/png", "csv": "text/csv", "md": "text/markdown"}[name.split(".")[1]]
        assert head.startswith(f"data:{mime};") and head.endswith(";base64"), head
        assert base64.b64decode(payload) == (workdir / key).read_bytes(), name
        caption = (CAPTIONS / caption_name(name)).read_text()
        assert html_text(entry["caption"]) == rst_text(caption), name
        assert entry["job_properties"]["rule"] == "summary"
    for plot in PLOTS:
        data = base64.b64decode(results[f"results/summary/{plot}"]["data_uri"].partition(",")[2])
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000  # a drawn figure
        assert f"Adding {plot} (" in log
    assert page.count("data:image/png;") == len(PLOTS)


def test_report_files_are_sorted_into_the_declared_categories(report):
    _, page, _ = report
    categories = script_data(page, "categories")
    assert set(categories) == {"Bits", "Time", "Environment", "Plots"}
    listed = {
        cat: sorted(f for files in sub.values() for f in files) for cat, sub in categories.items()
    }
    assert listed["Plots"] == sorted(f"results/summary/{p}" for p in PLOTS)
    assert "results/summary/timing_tail.csv" in listed["Time"]
    assert "results/summary/compiler_contract.md" in listed["Bits"]
    assert listed["Environment"] == [
        "results/summary/environment.csv",
        "results/summary/environment.md",
    ]
    assert sum(len(files) for files in listed.values()) == 40


def test_report_is_self_contained_and_names_the_jobs_that_ran(report):
    _, page, _ = report
    # No script, style sheet or image is fetched from elsewhere: no <script src> or <link>
    # at all, and no src/href attribute anywhere (the bundled JavaScript included) that
    # points at another host.
    assert not re.search(r"<script\b[^>]*\bsrc=|<link\b", page)
    assert not re.search(r"""\b(?:src|href)=\\?["']?(?:https?:)?//""", page)
    description = html_text(script_data(page, "workflow-desc"))
    assert description.startswith(
        "kbfuse: fused pointwise CUDA tails on KernelBench level-2 tasks [53, 81, 95], "
    )
    rules = script_data(page, "rules")
    assert sorted(rules) == ["bundle", "manifest", "summary"]
    assert "results/timing/53.json" in rules["summary"]["input"]
    runtimes = script_data(page, "runtimes")["data"]["values"]
    assert sorted(r["rule"] for r in runtimes) == ["bundle", "manifest", "summary"]
    assert all(r["runtime"] > 0 for r in runtimes)


def test_without_job_metadata_the_report_embeds_files_but_names_no_job(tmp_path):
    """The contrast: the committed summary copied in, no rule run, no .snakemake/metadata."""
    workdir, overlay = make_recorded_copy(tmp_path / "wf")
    shutil.copytree(REFERENCE / "summary", workdir / "results/summary")
    page, log = build_report(workdir, overlay)
    assert "Missing metadata for file results/summary/tail_time_53.png" in log
    assert len(script_data(page, "results")) == 40
    assert script_data(page, "rules") == {}
    assert script_data(page, "runtimes")["data"]["values"] == []
