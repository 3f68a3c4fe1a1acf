"""The survey end to end through Snakemake, on the CPU, on the KernelBench-shaped fixture.

`survey_records` builds one record per task and numerics mode; an unchanged tree has nothing
to do; editing one task file, adding a task or changing the protocol reruns exactly the jobs
that depend on it; bad survey configs stop Snakemake before any job, naming the key.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

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


def test_survey_records_runs_one_job_per_task_and_mode(surveyed):
    workdir, _, jobs, _ = surveyed
    assert jobs == {
        ("kernelbench_checkout", ""),
        ("survey_task_list", ""),
        *{("survey_pin", f"survey_task={t}") for t in (1, 7, 66)},
        *{("survey_task", f"numerics=strict, survey_task={t}") for t in (1, 7, 66)},
        ("survey_records", ""),
    }
    for task in (1, 7, 66):
        rec = records.read_record(
            workdir / f"results/survey/strict/tasks/{task}.json", "survey_task"
        )
        assert rec["task"] == task and rec["numerics"]["mode"] == "strict"
        log = (workdir / f"results/survey/strict/logs/{task}.log").read_text()
        assert "timing wall: ['eager'" in log and "wrote results/survey/strict" in log
    assert read_json(workdir / "results/survey/task_list.json")["tasks"] == {
        "1": "1_Conv2D_ReLU_BiasAdd.py",
        "7": "7_Gemm_Scale_By_Int.py",
        "66": "66_Matmul_Dropout_Mean_Softmax.py",
    }
    assert (workdir / "results/survey/.cache/inductor").is_dir()


def test_unchanged_tree_has_nothing_to_do(settled):
    workdir, overlay, _ = settled
    assert run(workdir, overlay, dry=True) == set()


def test_editing_one_task_file_reruns_that_task_only(settled):
    workdir, overlay, _ = settled
    task_file = next((workdir / "results/kernelbench/checkout/KernelBench/level2").glob("7_*.py"))
    task_file.write_text(task_file.read_text().replace("range(repeats)", "range(repeats + 1)"))
    assert run(workdir, overlay, dry=True) == {
        ("survey_pin", "survey_task=7"),
        ("survey_task", "numerics=strict, survey_task=7"),
        ("survey_records", ""),
    }


def test_adding_a_task_adds_only_that_tasks_jobs(settled):
    workdir, overlay, repo = settled
    more = _overlay(workdir, *repo, name="more.yaml", tasks=[1, 7, 23, 66])
    assert run(workdir, more) == {
        ("survey_task_list", ""),
        ("survey_pin", "survey_task=23"),
        ("survey_task", "numerics=strict, survey_task=23"),
        ("survey_records", ""),
    }


def test_changing_the_protocol_reruns_every_task_job_but_no_pin(settled):
    workdir, overlay, repo = settled
    longer = _overlay(workdir, *repo, name="longer.yaml", rounds=3)
    assert run(workdir, longer, dry=True) == {
        *{("survey_task", f"numerics=strict, survey_task={t}") for t in (1, 7, 66)},
        ("survey_records", ""),
    }


def test_a_second_numerics_mode_adds_its_records_only(settled):
    workdir, overlay, repo = settled
    both = _overlay(workdir, *repo, name="both.yaml", numerics=["strict", "kernelbench-defaults"])
    assert run(workdir, both, dry=True) == {
        *{("survey_task", f"numerics=kernelbench-defaults, survey_task={t}") for t in (1, 7, 66)},
        ("survey_records", ""),
    }


def test_inductor_is_compiled_by_its_own_job_before_the_timing_job(settled):
    workdir, overlay, repo = settled
    compiled = _overlay(workdir, *repo, name="inductor.yaml", tasks=[53],
                        baselines=["eager", "inductor"], precompile=True)  # fmt: skip
    assert run(workdir, compiled) == {
        ("survey_task_list", ""),
        ("survey_pin", "survey_task=53"),
        ("survey_compile", "numerics=strict, survey_task=53"),
        ("survey_task", "numerics=strict, survey_task=53"),
        ("survey_records", ""),
    }
    first = read_json(workdir / "results/survey/strict/compiled/53.json")
    assert first["baselines"]["inductor"]["status"] == "ok"
    rec = records.read_record(workdir / "results/survey/strict/tasks/53.json", "survey_task")
    assert rec["precompiled"] == {
        "inductor": {"status": "ok", "build_s": first["baselines"]["inductor"]["build_s"]}
    }
    assert rec["baselines"]["inductor"]["status"] == "ok"
    # one FX-graph cache lookup in each job, counted (whether the timing job's is a hit is
    # what the counters are for: on the CPU its key differs from the compile job's)
    assert first["compile_cache"]["fxgraph_cache_miss"] == 1
    assert sum(rec["compile_cache"][k] for k in ("fxgraph_cache_hit", "fxgraph_cache_miss")) == 1
    assert any((workdir / "results/survey/.cache/inductor").iterdir())
    log = (workdir / "results/survey/strict/logs/53.compile.log").read_text()
    assert "task 53 strict: compiling inductor" in log


def test_tasks_all_lists_every_level_2_task_at_the_pin(settled):
    workdir, overlay, repo = settled
    every = _overlay(workdir, *repo, name="all.yaml", tasks="all")
    snakemake(workdir, "--cores", "1", "results/survey/task_list.json", "--configfile", str(every))
    listed = read_json(workdir / "results/survey/task_list.json")["tasks"]
    assert sorted(map(int, listed)) == [1, 7, 9, 23, 53, 66, 81, 95]


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


def test_survey_jobs_ask_for_the_gpu_on_cuda_and_not_on_cpu(settled):
    workdir, overlay, repo = settled
    gpu = _overlay(workdir, *repo, name="gpu.yaml", device="cuda", rounds=5,
                   baselines=["eager", "inductor"], precompile=True)  # fmt: skip
    proc = snakemake(workdir, "--dry-run", "--cores", "1", "survey_records", "--configfile",
                     str(gpu))  # fmt: skip
    blocks = _job_blocks(proc.stdout, "survey_task")
    assert len(blocks) == 3 and all("gpu=1" in b for b in blocks)
    # the compile jobs run beside the timing jobs: they do not take the GPU resource
    compiles = _job_blocks(proc.stdout, "survey_compile")
    assert len(compiles) == 3 and not any("gpu=1" in b for b in compiles)
    proc = snakemake(workdir, "--dry-run", "--cores", "1", "survey_records", "--configfile",
                     str(_overlay(workdir, *repo, name="cpu.yaml", rounds=5)))  # fmt: skip
    blocks = proc.stdout.split("rule survey_task:")[1:]
    assert len(blocks) == 3 and all("gpu=0" in b.split("\n\n")[0] for b in blocks)


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
        ({"speed": 1}, "config key survey.speed: unknown key (known here: tasks, semantics"),
        # the checkout is there: unknown numbers are refused before any job
        ({"tasks": [1, 500]}, "config key survey.tasks: [500] have no task file at the pin"),
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
