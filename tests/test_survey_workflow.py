"""The survey end to end through Snakemake, on the CPU, on the KernelBench-shaped fixture.

`survey_records` runs one job per task, which writes one record per numerics mode; an
unchanged tree has nothing to do; editing one task file, adding a task or changing the
protocol reruns exactly the jobs that depend on it; bad survey configs stop Snakemake before
any job, naming the key.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pandas as pd
import pytest
import yaml
from conftest import copy_workflow, snakemake
from survey_kbrepo import make_survey_repo

from kbfuse.io import read_json
from kbfuse.results import records

pytestmark = pytest.mark.slow

SURVEY = {
    "device": "cpu",
    "tasks": [1, 7, 66],
    "numerics": ["strict"],
    "baselines": ["eager", "torchscript"],
    "rounds": 2,
    "warmup": 1,
    "invocations_per_pair": 1,
    "profile": False,
}


def _overlay(workdir: Path, url: str, commit: str, name="test-config.yaml", **survey) -> Path:
    cfg = {
        "kernelbench": {"url": url, "commit": commit},
        "arch": "sm_90",
        "survey": {**SURVEY, **survey},
    }
    path = workdir / name
    path.write_text(yaml.safe_dump(cfg))
    return path


def jobs_of(output: str) -> set[tuple[str, str]]:
    """(rule, wildcards) of every job a Snakemake run or dry-run printed."""
    jobs, rule = set(), None
    for line in output.splitlines():
        line = line.strip()
        if m := re.match(r"^(?:local)?(?:rule|checkpoint) (\w+):$", line):
            rule = m.group(1)
            jobs.add((rule, ""))
        elif rule and (m := re.match(r"^wildcards: (.*)$", line)):
            jobs.discard((rule, ""))
            jobs.add((rule, m.group(1)))
    return jobs


def run(workdir: Path, overlay: Path, *args: str, dry=False) -> set[tuple[str, str]]:
    extra = ("--dry-run",) if dry else ()
    proc = snakemake(workdir, "--cores", "2", *extra, "survey_records", "--configfile",
                     str(overlay), *args)  # fmt: skip
    return jobs_of(proc.stdout + proc.stderr)


@pytest.fixture(scope="module")
def surveyed(tmp_path_factory):
    root = tmp_path_factory.mktemp("survey-wf")
    url, commit = make_survey_repo(root / "kb")
    workdir = copy_workflow(root / "wf")
    overlay = _overlay(workdir, url, commit)
    jobs = run(workdir, overlay)
    return workdir, overlay, jobs, (url, commit)


@pytest.fixture
def settled(surveyed, tmp_path):
    """A private copy (mtimes and Snakemake metadata kept) of the surveyed tree."""
    workdir, overlay, _, repo = surveyed
    copy = tmp_path / "wf"
    shutil.copytree(workdir, copy, symlinks=True)
    return copy, copy / overlay.name, repo


def test_survey_records_runs_one_job_per_task(surveyed):
    workdir, _, jobs, _ = surveyed
    assert jobs == {
        ("kernelbench_checkout", ""),
        ("kernelbench_contract", ""),  # every survey job judges with the pinned contract
        ("survey_task_list", ""),
        ("survey_devices", ""),  # the cross-device check: on the CPU it only passes
        *{("survey_pin", f"survey_task={t}") for t in (1, 7, 66)},
        *{("survey_task", f"survey_task={t}") for t in (1, 7, 66)},
        ("survey_records", ""),
    }
    for task in (1, 7, 66):
        rec = records.read_record(
            workdir / f"results/survey/strict/tasks/{task}.json", "survey_task"
        )
        assert rec["task"] == task and rec["numerics"]["mode"] == "strict"
        log = (workdir / f"results/survey/logs/tasks/{task}.log").read_text()
        assert "timing wall: ['eager'" in log
        assert f"wrote 1 records (results/survey/strict/tasks/{task}.json)" in log
    assert read_json(workdir / "results/survey/task_list.json")["tasks"] == {
        "1": "1_Conv2D_ReLU_BiasAdd.py",
        "7": "7_Gemm_Scale_By_Int.py",
        "66": "66_Matmul_Dropout_Mean_Softmax.py",
    }
    assert (workdir / "results/survey/.cache/inductor").is_dir()
    check = records.read_record(workdir / "results/survey/devices.json", "survey_devices")
    assert check["device"] == "cpu" and check["devices"] == [] and check["excluded"] == []


def test_unchanged_tree_has_nothing_to_do(settled):
    workdir, overlay, _ = settled
    assert run(workdir, overlay, dry=True) == set()


def test_editing_one_task_file_reruns_that_task_only(settled):
    workdir, overlay, _ = settled
    task_file = next((workdir / "results/kernelbench/checkout/KernelBench/level2").glob("7_*.py"))
    task_file.write_text(task_file.read_text().replace("range(repeats)", "range(repeats + 1)"))
    assert run(workdir, overlay, dry=True) == {
        ("survey_pin", "survey_task=7"),
        ("survey_task", "survey_task=7"),
        ("survey_records", ""),
    }


def test_adding_a_task_adds_only_that_tasks_jobs(settled):
    workdir, overlay, repo = settled
    more = _overlay(workdir, *repo, name="more.yaml", tasks=[1, 7, 23, 66])
    assert run(workdir, more) == {
        ("survey_task_list", ""),
        ("survey_pin", "survey_task=23"),
        ("survey_task", "survey_task=23"),
        ("survey_records", ""),
    }


def test_changing_the_protocol_reruns_every_task_job_but_no_pin(settled):
    workdir, overlay, repo = settled
    longer = _overlay(workdir, *repo, name="longer.yaml", rounds=3)
    assert run(workdir, longer, dry=True) == {
        *{("survey_task", f"survey_task={t}") for t in (1, 7, 66)},
        ("survey_records", ""),
    }


def test_a_second_numerics_mode_reruns_each_tasks_one_job(settled):
    workdir, overlay, repo = settled
    both = _overlay(workdir, *repo, name="both.yaml", tasks=[53],
                    numerics=["strict", "kernelbench-defaults"])  # fmt: skip
    assert run(workdir, both) == {
        ("survey_task_list", ""),
        ("survey_pin", "survey_task=53"),
        ("survey_task", "survey_task=53"),
        ("survey_records", ""),
    }
    for mode, tf32 in (("strict", False), ("kernelbench-defaults", True)):
        rec = records.read_record(workdir / f"results/survey/{mode}/tasks/53.json", "survey_task")
        assert rec["numerics"]["cudnn_tf32"] is tf32
        assert rec["job"] == {
            "modes": ["strict", "kernelbench-defaults"],
            "built_in": "strict",
            "rerun_alone": False,
        }
    assert (workdir / "results/benchmarks/survey/53.tsv").is_file()


def test_tasks_all_lists_every_level_2_task_at_the_pin(settled):
    workdir, overlay, repo = settled
    every = _overlay(workdir, *repo, name="all.yaml", tasks="all")
    snakemake(workdir, "--cores", "1", "results/survey/task_list.json", "--configfile", str(every))
    listed = read_json(workdir / "results/survey/task_list.json")["tasks"]
    assert sorted(map(int, listed)) == [1, 7, 9, 23, 53, 66, 81, 95]


def test_another_level_is_surveyed_beside_level_2(settled):
    """survey.level: 3 runs level 3's tasks into survey/level3/ (records, summary, task list,
    pins, logs, benchmarks), reusing the checkout, leaving level 2's files as they are."""
    workdir, overlay, repo = settled
    before = read_json(workdir / "results/survey/strict/tasks/1.json")
    three = _overlay(workdir, *repo, name="level3.yaml", level=3, tasks="all")
    proc = snakemake(workdir, "--cores", "2", "survey", "--configfile", str(three))
    jobs = jobs_of(proc.stdout + proc.stderr)
    assert ("kernelbench_checkout", "") not in jobs and ("survey_task", "survey_task=1") in jobs
    level3 = workdir / "results/survey/level3"
    rec = records.read_record(level3 / "strict/tasks/1.json", "survey_task")
    assert (rec["level"], rec["file"]) == (3, "1_MLP.py")
    assert read_json(level3 / "task_list.json") == {
        "commit": repo[1],
        "level": 3,
        "tasks": {"1": "1_MLP.py"},
    }
    assert (level3 / "pins/1.json").is_file() and (level3 / "logs/tasks/1.log").is_file()
    floor = records.read_record(level3 / "floors/1.json", "survey_floor")
    assert (floor["level"], floor["file"], floor["problem"]) == (3, "1_MLP.py", None)
    assert (workdir / "results/benchmarks/survey/level3/1.tsv").is_file()
    main = (level3 / "summary/survey_strict.csv").read_text()
    assert "1_MLP.py" in main and (level3 / "summary/where_to_fuse_strict.png").is_file()
    row = pd.read_csv(level3 / "summary/survey_strict.csv").iloc[0]
    assert row["floor_bytes"] == floor["floor"]["floor_bytes"] > 0
    assert read_json(workdir / "results/survey/strict/tasks/1.json") == before
    assert run(workdir, overlay, dry=True) == set()  # level 2 still has nothing to do


def _job_blocks(stdout: str, rule: str) -> list[str]:
    """The resources line of each job of `rule` in a dry-run's output."""
    found, current = [], None
    for line in stdout.splitlines():
        line = line.strip()
        if re.match(r"^(?:local)?(?:rule|checkpoint) \w+:$", line):
            current = line.endswith(f" {rule}:")
        elif current and line.startswith("resources: "):
            found.append(line)
            current = False
    return found


def test_on_slurm_each_survey_job_asks_for_a_gpu_of_its_own():
    profile = yaml.safe_load(
        (Path(__file__).resolve().parents[1] / "profiles/slurm/config.yaml").read_text()
    )
    assert profile["set-resources"]["survey_task"]["gpu"] == 1
    assert "survey_compile" not in profile["set-resources"]


def test_survey_jobs_share_the_gpu_up_to_the_profiles_cap(settled):
    workdir, overlay, repo = settled
    gpu = _overlay(workdir, *repo, name="gpu.yaml", device="cuda", rounds=5)
    proc = snakemake(workdir, "--dry-run", "--cores", "1", "survey_records", "--configfile",
                     str(gpu))  # fmt: skip
    blocks = _job_blocks(proc.stdout, "survey_task")
    # gpu_jobs, not gpu: the survey's jobs run side by side, timing alone under the GPU lock
    assert len(blocks) == 3 and all("gpu_jobs=1" in b and "gpu=" not in b for b in blocks)
    # the cross-device check before them takes each GPU's lock itself: no GPU resource
    (check,) = _job_blocks(proc.stdout, "survey_devices")
    assert "gpu" not in check
    profile = yaml.safe_load((workdir / "profiles/default/config.yaml").read_text())
    assert "gpu_jobs=6" in profile["resources"] and "gpu=1" in profile["resources"]


@pytest.mark.parametrize(
    ("survey", "message"),
    [
        ({"tasks": []}, "config key survey.tasks: [] is invalid: [] should be non-empty"),
        ({"tasks": "some"}, "config key survey.tasks: 'some' is invalid: 'all' was expected"),
        (
            {"numerics": ["fast"]},
            "config key survey.numerics[0]: 'fast' is invalid: 'fast' is not one of "
            "['strict', 'kernelbench-defaults']",
        ),
        ({"baselines": ["inductor"]}, "config key survey.baselines: ['inductor'] is invalid"),
        ({"semantics": "train"}, "config key survey.semantics: 'train' is invalid"),
        ({"rounds": 0}, "config key survey.rounds: 0 is invalid: 0 is less than the minimum"),
        ({"speed": 1}, "config key survey.speed: unknown key (known here: level, tasks, "),
        ({"level": 0}, "config key survey.level: 0 is invalid: 0 is less than the minimum"),
        # the checkout is there: unknown numbers, a level it lacks are refused before any job
        ({"tasks": [1, 500]}, "config key survey.tasks: [500] have no task file at the pin"),
        ({"level": 4}, "config key survey.level: 4: checkout "),
        ({"level": 3, "tasks": [2]}, "config key survey.tasks: [2] have no task file at the pin"),
    ],
)
def test_bad_survey_configs_stop_before_any_job(settled, survey, message):
    workdir, overlay, repo = settled
    bad = _overlay(workdir, *repo, name="bad.yaml", **survey)
    proc = snakemake(workdir, "--cores", "1", "survey_records", "--configfile", str(bad),
                     check=False)  # fmt: skip
    assert proc.returncode == 1
    assert message in proc.stderr
    assert jobs_of(proc.stdout + proc.stderr) == set()


def test_an_unknown_task_without_a_checkout_stops_at_the_task_list(tmp_path, surveyed):
    _, _, _, repo = surveyed
    workdir = copy_workflow(tmp_path / "wf")
    bad = _overlay(workdir, *repo, tasks=[1, 500])
    proc = snakemake(workdir, "--cores", "1", "survey_records", "--configfile", str(bad),
                     check=False)  # fmt: skip
    assert proc.returncode == 1
    assert "survey_task_list failed: config key survey.tasks: [500] have no task file" in (
        proc.stderr
    )
    assert not (workdir / "results/survey/task_list.json").exists()
    assert not (workdir / "results/survey/pins").exists()
