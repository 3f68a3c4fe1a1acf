"""tools/survey_findings.py prints the figures README quotes from the committed H200 survey;
README quotes what it prints. And tools/survey_reference.py refuses a run without the
machine's fingerprint, naming the target that makes it."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SUMMARY = ROOT / "results/reference/h200/survey/survey/summary"


def _tool(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "tools" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def printed():
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert _tool("survey_findings").main([str(SUMMARY)]) == 0
    return out.getvalue()


def test_the_figures_of_the_reference_survey(printed):
    strict, defaults = printed.split("## KernelBench's defaults (TF32 on)\n- tasks")
    assert "({'inductor': 90, 'torchscript': 9})" in strict
    assert "outside library kernels, median: 6.2 %" in strict
    assert "tasks over half outside: 0" in strict
    assert "most time outside: 65 (Conv2d_AvgPool_Sigmoid_Sum, 5.3 ms, 47 %" in strict
    assert "anchor agrees on 50 of 100 tasks" in strict
    assert "outside library kernels, median: 21.1 %" in defaults
    assert "tasks over half outside: 24" in defaults
    assert "19 (ConvTranspose2d_GELU_GroupNorm, 4.7 ms, 65 %, ceiling 2.9x)" in defaults
    assert "anchor agrees on 96 of 100 tasks (eager over anchor, median 0.96)" in defaults
    assert "not deterministic: 66, 78" in defaults
    spots = "blind spots: 9, 23, 36, 38, 42, 65, 80, 83"
    assert spots in strict and spots in defaults
    assert "eager on 63 convolution tasks, strict over defaults: median 2.05, max 7.65" in printed
    assert "torchscript on 63 convolution tasks, strict over defaults: median 2.11, max 7.66" in (
        printed
    )
    assert "inductor on 63 convolution tasks, strict over defaults: median 2.75, max 11.57" in (
        printed
    )
    assert "- 17 failed baselines" in printed
    assert "- 12 x kernelbench-defaults inductor: official check" in printed


def test_readme_quotes_those_figures(printed):
    readme = (ROOT / "README.md").read_text()
    section = readme.split("### What the H200 reference survey found")[1].split("\n## ")[0]
    for quoted in ("median 6.2 %", "median 21.1 %", "over half on\n  24 tasks",
                   "would be 2.9x", "up to 7.7x", "median 2.11x, up to 7.66x", "up to 11.6x",
                   "on 96 of 100 tasks", "only 50", "9, 23, 36, 38, 42, 65, 80, 83",
                   "Inductor with TF32 on 12\n  tasks"):  # fmt: skip
        assert quoted in section, quoted
    short = readme.split("## Findings in short")[1].split("\n## ")[0]
    assert "a median 6.2 % of its time outside library kernels in strict FP32 and 21.1 %" in short


def _flat(text: str) -> str:
    return " ".join(text.split())


def test_readme_leads_the_survey_section_with_where_to_fuse(printed):
    """README's survey section opens with "Where to fuse" and quotes every line the tool
    prints there for the committed reference (a summary made before the where-to-fuse table
    says so, and README says what the tool says)."""
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## The survey: every level-2 task")[1].split("\n## ")[0]
    assert section.split("### ")[1].startswith("Where to fuse\n")
    where = section.split("### Where to fuse")[1].split("### ")[0]
    lines = printed.split("## Where to fuse\n")[1].split("\n## ")[0].splitlines()
    assert len(lines) >= 2
    for line in lines:
        assert _flat(line) in _flat(where), line


def test_where_to_fuse_figures_of_a_summary_that_has_the_table(tmp_path):
    import pandas as pd

    from kbfuse.survey import headroom

    def row(task, value, spread):
        return {"task": task, "file": f"{task}_Conv2d_Tail.py", "headroom_ms": value,
                "headroom_q1_ms": value - spread, "headroom_q3_ms": value + spread,
                "ceiling_realistic": 1.5, "ceiling_upper_bound": 2.0}  # fmt: skip

    rows = [row(1, 3.0, 0.1), row(2, 2.0, 0.1), row(3, 0.5, 0.2), row(4, 0.4, 0.2)]
    pd.DataFrame(headroom.where_rows(rows)).to_csv(tmp_path / "where_to_fuse_strict.csv")
    tool = _tool("survey_findings")
    lines = tool.where_to_fuse(tmp_path)
    assert lines[0] == (
        "strict FP32, the most headroom: 1 Conv2d_Tail 3.00 ms (2.90-3.10; realistic ceiling "
        "1.50x, upper bound 2.00x), 2 Conv2d_Tail 2.00 ms (1.90-2.10; realistic ceiling 1.50x, "
        "upper bound 2.00x), 3 Conv2d_Tail 0.50 ms (0.30-0.70, not rank-safe; realistic ceiling "
        "1.50x, upper bound 2.00x), 4 Conv2d_Tail 0.40 ms (0.20-0.60, not rank-safe; realistic "
        "ceiling 1.50x, upper bound 2.00x)"
    )
    assert lines[1] == (
        "strict FP32: the ranking is rank-safe down to rank 2; 2 of its 4 tasks have over 1 ms"
    )
    assert lines[2].startswith("KernelBench's defaults (TF32 on): no where_to_fuse_kernelbench")
    empty = pd.DataFrame(columns=headroom.WHERE_COLUMNS)
    assert tool.where_to_fuse_figures(empty, "strict FP32") == [
        "strict FP32: no task has a headroom (no floor or no copy bandwidth: see notes)"
    ]


def test_a_missing_table_is_named(tmp_path, capsys):
    assert _tool("survey_findings").main([str(tmp_path)]) == 1
    assert f"{tmp_path}/survey_strict.csv is missing" in capsys.readouterr().err


def test_a_run_without_the_fingerprint_is_refused_naming_the_target(tmp_path, capsys):
    results = tmp_path / "results"
    shutil.copytree(ROOT / "results/reference/h200/survey/kernelbench", results / "kernelbench")
    code = _tool("survey_reference").main(["--results", str(results), "--out", str(tmp_path / "o")])
    assert code == 1
    err = capsys.readouterr().err
    assert "env/fingerprint.json is missing" in err
    assert "snakemake survey results/env/fingerprint.json" in err
    assert not (tmp_path / "o").exists()


def test_survey_doc_quotes_the_strict_mode_figures_of_the_convolutions(printed):
    conv = "eager, strict over defaults, aten.convolution: 63 tasks, median 2.05 (quartiles"
    assert conv + " 1.00-2.40), range 0.98-7.65 (max: task 77), 23 of 63 below 1.5x" in printed
    gemm = "eager, strict over defaults, GEMM (aten.addmm, aten.mm): 37 tasks, median 1.00"
    assert gemm + " (quartiles 0.99-1.00), range 0.98-1.00" in printed
    doc = " ".join((ROOT / "docs/survey.md").read_text().split())
    assert "eager's convolution tasks run a median 2.05x slower" in doc
    assert "(quartiles 1.00-2.40, up to 7.65x on task 77; 23 of the 63 move less than 1.5x)" in doc
    assert "its 37 GEMM tasks as fast (0.98-1.00)" in doc
    assert "2-4x" not in doc


def test_survey_doc_quotes_the_wall_time_of_the_committed_run():
    """The committed survey is the run of benchmarks/results/h200/survey_wall.json: its job
    and phase totals are what the committed records and benchmark files give, and docs/survey.md
    quotes its wall time."""
    from kbfuse.io import read_json
    from kbfuse.survey.wall import survey_wall

    run = read_json(ROOT / "benchmarks/results/h200/survey_wall.json")
    again = survey_wall(ROOT / "results/reference/h200/survey")
    for phase in ("job_s", "wait_shared_s", "reference_and_builds_s", "wait_alone_s", "alone_s"):
        assert again["totals"][phase] == pytest.approx(run["totals"][phase]), phase
    assert again["wall_s"] is None and round(run["wall_s"]) == 1167
    doc = " ".join((ROOT / "docs/survey.md").read_text().split())
    assert "where its 1,167 s went" in doc and "842" not in doc
    assert f"{round(run['totals']['job_s'])} s in all" in doc


def test_a_run_of_level_3_alone_is_a_reference_of_its_own(tmp_path, capsys):
    """A level-3 run's results (here: the level-2 reference's files moved under
    survey/level3/) are copied with a manifest; a run with no summary of any level is not."""
    reference = ROOT / "results/reference/h200/survey"
    results = tmp_path / "results"
    for part in ("kernelbench", "env"):
        shutil.copytree(reference / part, results / part)
    level3 = results / "survey/level3"
    for part in ("strict/tasks", "summary"):
        shutil.copytree(reference / "survey" / part, level3 / part)
    tool = _tool("survey_reference")
    assert tool.main(["--results", str(results), "--out", str(tmp_path / "o")]) == 0
    out = tmp_path / "o"
    assert (out / "survey/level3/summary/survey_strict.csv").is_file()
    assert (out / "survey/level3/strict/tasks/53.json").is_file()
    assert not (out / "survey/summary").exists()
    manifest = (out / "manifest.json").read_text()
    assert "survey/level3/summary/where_to_fuse_strict.png" in manifest
    shutil.rmtree(level3 / "summary")
    assert tool.main(["--results", str(results), "--out", str(tmp_path / "p")]) == 1
    assert "holds nothing: run the survey to its end" in capsys.readouterr().err
    assert not (tmp_path / "p").exists()
