"""benchmarks/study_wall.py on the files a finished study leaves: the jobs' Snakemake benchmark
files (a survey's beside them, left out) and the run log, built here as a run writes them."""

from __future__ import annotations

import json
import re
import runpy
from pathlib import Path

import pytest

from kbfuse.errors import KbfuseError
from kbfuse.results import jobtimes

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "study_wall.py"
HEADER = "s\th:m:s\tmax_rss\tmax_vms\tmax_uss\tmax_pss\tio_in\tio_out\tmean_load\tcpu_time\n"
JOBS = {
    "correctness/53/variants": 30.5,
    "correctness/53/baselines": 20.0,
    "compile/nvrtc-cubin-ftz": 1.5,
    "timing/53": 38.0,
    "controls/53": 25.0,
    "controls/witness81": 4.0,
    "env/fingerprint": 31.0,
    "survey/53": 99.0,  # the survey's: benchmarks/survey_wall.py
}
RUN_LOG = "Building DAG of jobs...\n[Wed Dec  2 00:47:09 2026]\nElapsed time: 0:01:40.000000\n"


def study_run(root: Path) -> Path:
    for name, seconds in JOBS.items():
        tsv = root / "benchmarks" / f"{name}.tsv"
        tsv.parent.mkdir(parents=True, exist_ok=True)
        tsv.write_text(HEADER + f"{seconds}\t0:00:30\t1688\t19260\t1659\t1667\t0\t0\t52\t15\n")
    return root


def test_seconds_per_stage_the_alone_floor_and_the_parallelism(tmp_path):
    (tmp_path / "run.log").write_text(RUN_LOG)
    report = jobtimes.study_wall(study_run(tmp_path / "results"), tmp_path / "run.log")
    assert report["stages"] == {
        "compile": {"jobs": 1, "s": 1.5, "alone": False},
        "controls": {"jobs": 2, "s": 29.0, "alone": True},
        "correctness": {"jobs": 2, "s": 50.5, "alone": False},
        "env": {"jobs": 1, "s": 31.0, "alone": True},
        "timing": {"jobs": 1, "s": 38.0, "alone": True},
    }
    assert {"stage": "correctness", "job": "53/variants", "s": 30.5} in report["jobs"]
    assert report["job_s"] == 150.0 and report["alone_s"] == 98.0
    assert report["wall_s"] == 100.0 and report["parallelism"] == 1.5


def test_the_script_writes_the_table_and_the_json(tmp_path, capsys, monkeypatch):
    study_run(tmp_path / "results")
    (tmp_path / "run.log").write_text(RUN_LOG)
    argv = ["--results", str(tmp_path / "results"), "--snakemake-log", str(tmp_path / "run.log"),
            "--json", str(tmp_path / "w.json"), "--markdown", str(tmp_path / "w.md")]  # fmt: skip
    monkeypatch.setattr("sys.argv", ["study_wall.py", *argv])
    with pytest.raises(SystemExit, match="^0$"):
        runpy.run_path(str(SCRIPT), run_name="__main__")
    out = capsys.readouterr().out
    assert out == (tmp_path / "w.md").read_text()
    lines = out.splitlines()
    assert lines[2] == "| correctness | 2 | 50.5 | 34% |  |"
    assert "| alone stages (the floor) | | 98.0 | 65% | yes |" in lines
    assert lines[-1] == "| run wall (Snakemake's Elapsed time) | | 100.0 | parallelism 1.50 | |"
    assert json.loads((tmp_path / "w.json").read_text())["alone_s"] == 98.0


def test_without_the_run_log_there_is_no_wall_time(tmp_path):
    report = jobtimes.study_wall(study_run(tmp_path / "results"))
    assert report["wall_s"] is None and report["parallelism"] is None
    assert not jobtimes.study_markdown(report).rstrip().endswith("| |")


def test_no_benchmark_files_is_named(tmp_path, capsys):
    with pytest.raises(KbfuseError, match=r"no Snakemake benchmark files under .*benchmarks/$"):
        jobtimes.study_wall(tmp_path)
    spec = runpy.run_path(str(SCRIPT))
    assert spec["main"](["--results", str(tmp_path)]) == 1
    assert "study_wall: no Snakemake benchmark files" in capsys.readouterr().err


def test_alone_stages_are_the_rules_that_declare_gpu_1():
    """ALONE_STAGES restates the rules: every rule with `gpu=1` writes its benchmark file under
    one of them, and every one of them has such a rule."""
    stages = set()
    for smk in (ROOT / "workflow" / "rules").glob("*.smk"):
        for block in re.split(r"^rule ", smk.read_text(), flags=re.M)[1:]:
            if re.search(r"^\s+gpu=1,", block, re.M):
                stages.add(re.search(r'layout\.benchmark\("([^/"]+)/', block).group(1))
    assert stages == set(jobtimes.ALONE_STAGES)
