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
    best = "({'inductor-max-autotune-no-cudagraphs': 62, 'inductor': 29, 'torchscript': 8})"
    assert best in strict
    assert "outside library kernels, median: 5.8 %" in strict
    assert "tasks over half outside: 0" in strict
    assert "most time outside: 65 (Conv2d_AvgPool_Sigmoid_Sum, 5.3 ms, 47 %" in strict
    assert "idle between kernels (99 tasks): median 0.004 ms, max 0.243 ms (task 42)" in strict
    assert "anchor agrees on 53 of 100 tasks" in strict
    assert "outside library kernels, median: 18.4 %" in defaults
    assert "tasks over half outside: 24" in defaults
    assert "82 (Conv2d_Tanh_Scaling_BiasAdd_Max, 4.1 ms, 61 %, ceiling 2.5x)" in defaults
    assert "anchor agrees on 89 of 100 tasks (eager over anchor, median 0.93)" in defaults
    assert "not deterministic: 66, 78" in defaults
    spots = "blind spots: 9, 23, 36, 38, 42, 65, 80, 83"
    assert spots in strict and spots in defaults
    assert "eager on 63 convolution tasks, strict over defaults: median 2.04, max 7.73" in printed
    for name, figures in (
        ("torchscript", "median 2.11, max 7.70 (task 77)"),
        ("inductor", "median 2.78, max 11.59 (task 34)"),
        ("inductor-max-autotune-no-cudagraphs", "median 2.88, max 11.82 (task 34)"),
    ):
        assert f"{name} on 63 convolution tasks, strict over defaults: {figures}" in printed
    autotune = printed.split("## Max-autotune\n")[1].split("\n## ")[0]
    assert "max 1.22 (task 24, 0.85 -> 0.70 ms), 8 over 1.05, 1 under 1/1.05" in autotune
    assert "max 1.39 (task 92, 1.32 -> 0.95 ms), 11 over 1.05, 1 under 1/1.05" in autotune
    assert "(warm_build_s, both modes): 200 builds, median 7.4 s, max 55.9 s" in autotune
    # level 2's reference: Inductor's own backends, and never a Triton convolution template
    assert "max-autotune's convolution backends: ATEN,TRITON in 200 records" in autotune
    assert "triton_tem_fused_addmm_t_0 in 2; convolution templates: 0" in autotune
    assert "- 32 failed baselines" in printed
    assert "- 12 x kernelbench-defaults inductor: official check" in printed
    assert "- 13 x kernelbench-defaults inductor-max-autotune-no-cudagraphs: official" in printed


def test_readme_quotes_those_figures(printed):
    readme = (ROOT / "README.md").read_text()
    section = readme.split("### What the H200 reference survey found")[1].split("\n## ")[0]
    for quoted in ("median 5.8 %", "median 18.4 %", "over half on\n  24 tasks",
                   "would be 2.5x", "up to 7.7x", "median 2.11x, up to 7.70x", "up to 11.6x",
                   "on 89 of 100 tasks", "strict mode on 53", "9, 23, 36, 38, 42, 65, 80, 83",
                   "max-autotune on\n  62 tasks", "32 in all", "1,195 s", "816 s"):  # fmt: skip
        assert quoted in section, quoted
    short = readme.split("## Findings in short")[1].split("\n## ")[0]
    assert "median 5.8 % of its time\n  outside library kernels in strict FP32 and 18.4 %" in short
    where = readme.split("### Where to fuse")[1].split("### ")[0]
    for quoted in ("median 1.00 in both modes", "at most 1.22x on task 24", "1.39x on task 92",
                   "(4287\nGB/s)", "median 0.004 ms", "0.24 ms on task 42"):  # fmt: skip
        assert quoted in where, quoted


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
    conv = "eager, strict over defaults, aten.convolution: 63 tasks, median 2.04 (quartiles"
    assert conv + " 1.00-2.40), range 0.98-7.73 (max: task 77), 23 of 63 below 1.5x" in printed
    gemm = "eager, strict over defaults, GEMM (aten.addmm, aten.mm): 37 tasks, median 1.00"
    assert gemm + " (quartiles 0.99-1.00), range 0.98-1.01" in printed
    doc = " ".join((ROOT / "docs/survey.md").read_text().split())
    assert "eager's convolution tasks run a median 2.04x slower" in doc
    assert "(quartiles 1.00-2.40, up to 7.73x on task 77; 23 of the 63 move less than 1.5x)" in doc
    assert "its 37 GEMM tasks as fast (0.98-1.01)" in doc
    assert "2-4x" not in doc


def test_survey_doc_quotes_the_job_time_of_the_reference_and_its_last_piece():
    """benchmarks/results/h200/survey_wall.json is what the committed records and benchmark
    files give (no log: no wall time); survey_wall_session20.json is the last piece's 27 jobs
    with that piece's Snakemake log, the same jobs as the reference's; docs/survey.md and
    README quote both."""
    from kbfuse.io import read_json
    from kbfuse.survey.wall import survey_wall

    run = read_json(ROOT / "benchmarks/results/h200/survey_wall.json")
    again = survey_wall(ROOT / "results/reference/h200/survey")
    for phase in ("job_s", "wait_shared_s", "reference_and_builds_s", "wait_alone_s", "alone_s"):
        assert again["totals"][phase] == pytest.approx(run["totals"][phase]), phase
    assert again["wall_s"] is None and run["wall_s"] is None
    assert round(run["totals"]["job_s"]) == 14122 and round(run["totals"]["alone_s"]) == 1195
    assert len({d["uuid"] for d in run["devices"]}) == 3 and len(run["jobs"]) == 100
    piece = read_json(ROOT / "benchmarks/results/h200/survey_wall_session20.json")
    assert round(piece["wall_s"]) == 816 and len(piece["jobs"]) == 27
    jobs = {j["task"]: j["job_s"] for j in run["jobs"]}
    assert all(jobs[j["task"]] == pytest.approx(j["job_s"]) for j in piece["jobs"])
    doc = " ".join((ROOT / "docs/survey.md").read_text().split())
    assert "14,122 s in all" in doc and "1,195 s in all" in doc and "816 s of wall time" in doc
    assert "1,167" not in doc


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


def test_a_run_of_two_levels_keeps_the_finished_ones_or_the_one_asked_for(tmp_path, capsys):
    """Level 2 finished beside a level 3 with records but no summary (a run stopped in level
    3): the reference keeps level 2 and names level 3 as left out; `--level 3` refuses, naming
    level 3's summary; with level 3 finished too, `--level 3` keeps level 3 alone."""
    reference = ROOT / "results/reference/h200/survey"
    results = tmp_path / "results"
    for part in ("kernelbench", "env", "survey", "benchmarks"):
        shutil.copytree(reference / part, results / part)
    level3 = results / "survey/level3"
    shutil.copytree(reference / "survey/strict/tasks", level3 / "strict/tasks")
    shutil.copytree(reference / "benchmarks/survey", results / "benchmarks/survey/level3")
    tool = _tool("survey_reference")
    assert tool.main(["--results", str(results), "--out", str(tmp_path / "two")]) == 0
    assert "level 3 left out (no summary: unfinished)" in capsys.readouterr().err
    kept = (tmp_path / "two/manifest.json").read_text()
    assert "survey/summary/where_to_fuse_strict.csv" in kept and "level3" not in kept
    args = ["--results", str(results), "--level", "3", "--out", str(tmp_path / "three")]
    assert tool.main(args) == 1
    assert f"{results}/survey/level3/summary holds nothing" in capsys.readouterr().err
    assert not (tmp_path / "three").exists()
    shutil.copytree(reference / "survey/summary", level3 / "summary")
    assert tool.main(args) == 0
    assert "level 2 left out\n" in capsys.readouterr().err
    three = tmp_path / "three"
    assert (three / "survey/level3/summary/survey_strict.csv").is_file()
    assert (three / "benchmarks/survey/level3/53.tsv").is_file()
    assert not (three / "survey/summary").exists() and not (three / "survey/strict").exists()
    assert not (three / "benchmarks/survey/53.tsv").exists()
    assert (three / "env/fingerprint.json").is_file()


def test_autotune_and_idle_figures_say_when_a_summary_lacks_them():
    import pandas as pd

    tool = _tool("survey_findings")
    old = pd.DataFrame({"task": [1, 2], "inductor_ms": [1.0, 2.0], "idle_ms": [None, None]})
    assert tool.autotune_figures(old, "strict") == [
        "strict: max-autotune was not among the baselines"
    ]
    assert tool.idle_figure(old).startswith("idle between kernels: not measured")
    new = old.assign(
        **{
            "inductor_official": [True, True],
            f"{tool.AUTOTUNE}_official": [True, False],
            f"{tool.AUTOTUNE}_ms": [0.5, 1.0],
            "idle_ms": [0.2, 0.01],
        }
    )
    # task 2's max-autotune fails the official check: only task 1 is compared
    (line,) = tool.autotune_figures(new, "strict")
    assert "on 1 tasks where both pass: median 2.00, max 2.00 (task 1, 1.00 -> 0.50 ms)" in line
    assert tool.idle_figure(new) == (
        "idle between kernels (2 tasks): median 0.105 ms, max 0.200 ms (task 1), over 0.1 ms on 1"
    )


def test_the_chosen_templates_and_backends_are_counted_per_record(tmp_path):
    import json

    findings = _tool("survey_findings")
    autotune = findings.AUTOTUNE
    entries = {
        ("strict", 1): {"conv_backends": "ATEN", "kernels": ["triton_tem_fused_mm_0", "mm"]},
        ("strict", 2): {"kernels": ["triton_tem_fused_convolution_0", "triton_tem_fused_mm_0"]},
        ("kernelbench-defaults", 1): {"conv_backends": "ATEN", "kernels": []},
        ("kernelbench-defaults", 2): {"status": "failed", "kernels": None},
    }
    for (mode, task), entry in entries.items():
        folder = tmp_path / mode / "tasks"
        folder.mkdir(parents=True, exist_ok=True)
        kernels = entry.get("kernels")
        entry = {
            "status": "ok",
            **entry,
            "kernels": None
            if kernels is None
            else [{"name": n, "device_us": 1.0, "calls": 1} for n in kernels],
        }
        (folder / f"{task}.json").write_text(json.dumps({"baselines": {autotune: entry}}))
    assert findings.autotune_choice_figures(findings.record_baselines(tmp_path)) == [
        "max-autotune's convolution backends: ATEN in 2 records, ATEN,TRITON in 1 records",
        "its Triton templates chosen (triton_tem_* kernels, records): "
        "triton_tem_fused_convolution_0 in 1, triton_tem_fused_mm_0 in 2; convolution "
        "templates: 1",
    ]
    assert findings.autotune_choice_figures(findings.record_baselines(tmp_path / "none")) == []
