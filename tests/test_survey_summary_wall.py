"""benchmarks/survey_wall.py on the files a finished survey leaves: Snakemake benchmark files,
job logs, records and the run log, built here as a survey run writes them."""

from __future__ import annotations

import json
import runpy
from pathlib import Path

import pytest
from survey_records import record, write_records

from kbfuse.errors import KbfuseError
from kbfuse.survey import wall

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "survey_wall.py"
HEADER = "s\th:m:s\tmax_rss\tmax_vms\tmax_uss\tmax_pss\tio_in\tio_out\tmean_load\tcpu_time\n"
RUN_LOG = """Building DAG of jobs...
[Tue Dec  1 16:53:16 2026]
localrule survey_task:
[Tue Dec  1 16:55:40 2026]
Finished jobid: 2 (Rule: survey_task)
Complete log(s): /somewhere/.snakemake/log/2026-12-01T165316.278328.snakemake.log
Elapsed time: 0:02:30.500000
"""


PHASES = {"load": 1.0, "wait_shared": 2.0, "reference_and_builds": 12.0, "wait_alone": 3.0,
          "timing": 10.0, "profile": 1.5}  # fmt: skip


def survey_run(root: Path, log_line: bool = True) -> Path:
    """Two jobs (tasks 1 and 53, both modes each) as a survey run leaves them under root;
    task 53's job also built max-autotune alone and timed its official trials apart (phases
    older records lack)."""
    for task, seconds, inside, scale in ((1, 40.0, 31.5, 1.0), (53, 20.0, 12.0, 0.5)):
        phases = {name: value * scale for name, value in PHASES.items()}
        if task == 53:  # a record made since session 11 also times the official trials
            phases["alone_builds"] = 4.0
            phases["official_trials"] = 2.5
            phases["warm_builds"] = 3.5  # since session 17: max-autotune's warm-up
            phases["profile_read"] = 0.75  # since session 21: read after the GPU hold
        recs = [record(task=task, mode=mode) for mode in ("strict", "kernelbench-defaults")]
        for rec in recs:
            rec["phases_s"] = phases
        write_records(root, recs)
        bench = root / "benchmarks/survey" / f"{task}.tsv"
        bench.parent.mkdir(parents=True, exist_ok=True)
        bench.write_text(HEADER + f"{seconds}\t0:00:40\t1688\t19260\t1659\t1667\t95\t0\t52\t15\n")
        log = root / "survey/logs/tasks" / f"{task}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        last = (
            f"wrote 2 records (results/survey/strict/tasks/{task}.json, "
            f"results/survey/kernelbench-defaults/tasks/{task}.json) in {inside} s\n"
        )
        log.write_text(
            f"task {task}, numerics both\nbaseline eager: build\n{last if log_line else ''}"
        )
    return root


def test_phases_per_job_and_totals(tmp_path):
    root = survey_run(tmp_path / "results")
    (tmp_path / "run.log").write_text(RUN_LOG)
    report = wall.survey_wall(root, tmp_path / "run.log")
    assert [
        (j["task"], j["job_s"], j["startup_s"], j["reference_and_builds_s"], j["alone_s"])
        for j in report["jobs"]
    ] == [(1, 40.0, 8.5, 12.0, 11.5), (53, 20.0, 8.0, 6.0, 9.75)]
    assert report["totals"] == {
        "job_s": 60.0,
        "startup_s": 16.5,
        "load_s": 1.5,
        "wait_shared_s": 3.0,
        "reference_and_builds_s": 18.0,
        "wait_alone_s": 4.5,
        "alone_builds_s": 4.0,
        "timing_s": 15.0,
        "profile_s": 2.25,
        "official_trials_s": 2.5,  # task 1's record does not say: not taken for 0
        "warm_builds_s": 3.5,
        "profile_read_s": 0.75,  # outside the GPU hold: not in alone_s
        "alone_s": 21.25,
    }
    assert [j["official_trials_s"] for j in report["jobs"]] == [None, 2.5]
    assert [j["profile_read_s"] for j in report["jobs"]] == [None, 0.75]
    assert report["wall_s"] == 150.5
    assert report["parallelism"] == pytest.approx(60.0 / 150.5)
    text = wall.report_markdown(report)
    assert "| startup | 16.5 | 28% |" in text
    assert "| official_trials (within the two builds phases) | 2.5 | 4% |" in text
    assert "| warm_builds (within reference_and_builds) | 3.5 | 6% |" in text
    assert "| profile_read | 0.8 | 1% |" in text
    assert "| 1 | 40.0 | 8.5 | 12.0 | 2.0 | 3.0 | 11.5 |  |" in text


def test_without_the_log_line_startup_is_unknown_and_said(tmp_path):
    report = wall.survey_wall(survey_run(tmp_path, log_line=False))
    job = report["jobs"][0]
    assert job["startup_s"] is None and job["timing_s"] == 10.0
    assert job["notes"] == "no 'wrote ... in N s' line in the log: start-up unknown"
    assert report["totals"]["startup_s"] is None and report["wall_s"] is None


def test_a_job_without_records_is_said(tmp_path):
    bench = tmp_path / "benchmarks/survey/7.tsv"
    bench.parent.mkdir(parents=True)
    bench.write_text(HEADER + "3.0\t0:00:03\t1\t1\t1\t1\t0\t0\t0\t1\n")
    job = wall.survey_wall(tmp_path)["jobs"][0]
    assert job["alone_s"] is None and job["notes"].startswith("no record (job failed?)")


def test_a_survey_run_in_pieces_sums_their_wall_times(tmp_path):
    root = survey_run(tmp_path / "results")
    (tmp_path / "a.log").write_text(RUN_LOG)
    (tmp_path / "b.log").write_text(RUN_LOG.replace("0:02:30.500000", "0:01:00"))
    report = wall.survey_wall(root, [tmp_path / "a.log", tmp_path / "b.log"])
    assert report["wall_s"] == 210.5 and report["runs"] == 2
    assert "| run wall (2 Snakemake log(s)) | 210.5 |" in wall.report_markdown(report)


def test_run_wall_falls_back_to_timestamps(tmp_path):
    log = tmp_path / "run.log"
    log.write_text(RUN_LOG.replace("Elapsed time: 0:02:30.500000\n", ""))
    assert wall.run_wall(log) == 144.0
    log.write_text("nothing\n")
    with pytest.raises(KbfuseError, match="neither 'Elapsed time:' nor two"):
        wall.run_wall(log)


def test_no_survey_and_a_bad_benchmark_file_are_refused(tmp_path):
    with pytest.raises(KbfuseError, match="no survey benchmark files under"):
        wall.survey_wall(tmp_path)
    bad = tmp_path / "benchmarks/survey/1.tsv"
    bad.parent.mkdir(parents=True)
    bad.write_text("x\ty\n")
    with pytest.raises(KbfuseError, match=r"1\.tsv: no wall seconds \(column s\)"):
        wall.survey_wall(tmp_path)


def test_the_script_prints_and_writes_json(tmp_path, capsys, monkeypatch):
    root = survey_run(tmp_path / "results")
    out = tmp_path / "wall.json"
    monkeypatch.setattr("sys.argv", ["survey_wall.py", "--results", str(root), "--json", str(out)])
    with pytest.raises(SystemExit, match="0"):
        runpy.run_path(str(SCRIPT), run_name="__main__")
    assert "| reference_and_builds | 18.0 | 30% |" in capsys.readouterr().out
    assert json.loads(out.read_text())["totals"]["job_s"] == 60.0


def test_the_report_sums_the_jobs_per_gpu_their_records_name(tmp_path):
    """On several GPUs each record names its job's GPU: jobs, seconds, alone seconds per GPU."""
    root = survey_run(tmp_path / "results")
    gpus = {1: {"index": 1, "uuid": "GPU-bbbb", "name": "NVIDIA H200"},
            53: {"index": 0, "uuid": "GPU-aaaa", "name": "NVIDIA H200"}}  # fmt: skip
    for path in root.glob("survey/*/tasks/*.json"):
        data = json.loads(path.read_text())
        data["environment"]["gpu"] = gpus[int(path.stem)]
        path.write_text(json.dumps(data))
    report = wall.survey_wall(root)
    assert [j["gpu"]["uuid"] for j in report["jobs"]] == ["GPU-bbbb", "GPU-aaaa"]
    assert report["devices"] == [
        {"index": 0, "uuid": "GPU-aaaa", "name": "NVIDIA H200", "jobs": 1, "job_s": 20.0,
         "alone_s": 9.75},
        {"index": 1, "uuid": "GPU-bbbb", "name": "NVIDIA H200", "jobs": 1, "job_s": 40.0,
         "alone_s": 11.5},
    ]  # fmt: skip
    text = wall.report_markdown(report)
    assert "| 0 | GPU-aaaa | NVIDIA H200 | 1 | 20.0 | 9.8 |" in text


def test_records_that_name_no_gpu_give_no_device_table(tmp_path):
    report = wall.survey_wall(survey_run(tmp_path / "results"))
    assert report["devices"] == [] and all(j["gpu"] is None for j in report["jobs"])
    assert "| GPU |" not in wall.report_markdown(report)
