"""The cluster submission path without a cluster: the Slurm profile's jobs submitted through
Snakemake's generic cluster executor, with a submit command that runs each job script here.

profiles/slurm runs every job but the `localrules` as one cluster job with the resources it
declares. Here the same profile is used with `--executor cluster-generic` in place of the
Slurm plugin (command-line options win over the profile's), and the submit command, given each
job's rule and resources, records them and runs the job script at once. The CPU part of the
study (`cpu`: KernelBench pin, NVRTC compiles, direction witness) goes through it end to end:
the compiles are submitted with the profile's resources, the checkout, pin and protocol steps
are not submitted (they run on the submitting host), and the results are those of a local run.
The survey goes through it the same way (on the CPU, on the KernelBench-shaped fixture): one
submitted job per task, asking for a GPU of its own, its task list, pins and aggregate run on
the submitting host.
"""

from __future__ import annotations

import os
import stat

import pytest
import yaml
from conftest import copy_workflow, snakemake, write_test_config
from survey_kbrepo import make_survey_repo

from kbfuse.io import read_json
from kbfuse.results import records

pytestmark = pytest.mark.slow
SUBMIT = """#!/bin/sh
# submit.sh RULE MEM_MB RUNTIME CPUS JOBSCRIPT: record the request, run the job script here
echo "$1 mem_mb=$2 runtime=$3 cpus_per_task=$4" >> "$KBFUSE_SUBMITTED"
bash "$5" > "$5.out" 2>&1
echo "local-$$"
"""
COMPILED = ("nvrtc-cubin-noftz", "fast-nvrtc-cubin-noftz")
LOCAL = {"kernelbench_checkout", "kernelbench_task", "kernelbench_pin", "direction_witness"}


@pytest.fixture(scope="module")
def submitted(tmp_path_factory, kb_repo):
    # Two variants of the default config (a naive and a fast kernel): every compile job is
    # submitted alike, so more would only repeat the same submission.
    workdir = copy_workflow(tmp_path_factory.mktemp("cluster") / "wf", list(COMPILED))
    overlay = write_test_config(workdir, *kb_repo, nvrtc_versions=[])
    submit = workdir.parent / "submit.sh"
    submit.write_text(SUBMIT)
    submit.chmod(submit.stat().st_mode | stat.S_IXUSR)
    log = workdir.parent / "submitted.txt"
    env = {**os.environ, "KBFUSE_SUBMITTED": str(log)}
    proc = snakemake(
        workdir,
        "--workflow-profile",
        "profiles/slurm",
        "--executor",
        "cluster-generic",
        "--cluster-generic-submit-cmd",
        f"{submit} {{rule}} {{resources.mem_mb}} {{resources.runtime}} {{resources.cpus_per_task}}",
        "--jobs",
        "2",
        "--latency-wait",
        "5",
        "--seconds-between-status-checks",
        "1",
        "cpu",
        "--configfile",
        str(overlay),
        env=env,
    )
    lines = log.read_text().splitlines() if log.exists() else []
    return workdir, lines, proc.stdout + proc.stderr


def test_compiles_are_submitted_with_the_profiles_resources(submitted):
    workdir, lines, _ = submitted
    compiles = [line for line in lines if line.startswith("compile_variant ")]
    assert read_json(workdir / "results/kernelbench/pin.json")["kind"] == "kernelbench_pin"
    assert compiles, lines
    assert set(compiles) == {"compile_variant mem_mb=4000 runtime=10 cpus_per_task=1"}


def test_local_rules_are_not_submitted(submitted):
    _, lines, _ = submitted
    assert {line.split()[0] for line in lines}.isdisjoint(LOCAL)


def test_the_submitted_jobs_wrote_the_cpu_targets(submitted):
    workdir, lines, _ = submitted
    metas = sorted(workdir.glob("results/compile/*/meta.json"))
    assert sorted(meta.parent.name for meta in metas) == sorted(COMPILED)
    assert len(metas) == len([line for line in lines if line.startswith("compile_variant ")])
    for meta in metas:
        record = read_json(meta)
        assert record["kind"] == "compile" and record["arch"] == "sm_90"
    witness = read_json(workdir / "results/protocol/direction_witness.json")
    assert witness["kind"] == "direction_witness"


SURVEY_SUBMIT = """#!/bin/sh
# submit.sh RULE GPU MEM_MB CPUS JOBSCRIPT: record the request, run the job script here
echo "$1 gpu=$2 mem_mb=$3 cpus_per_task=$4" >> "$KBFUSE_SUBMITTED"
bash "$5" > "$5.out" 2>&1
echo "local-$$"
"""


def test_the_survey_is_submitted_one_job_per_task_with_a_gpu_each(tmp_path):
    url, commit = make_survey_repo(tmp_path / "kb")
    workdir = copy_workflow(tmp_path / "wf")
    overlay = workdir / "survey.yaml"
    survey = {"device": "cpu", "tasks": [1, 53], "numerics": ["strict"], "rounds": 2,
              "warmup": 1, "invocations_per_pair": 1, "profile": False,
              "baselines": ["eager", "torchscript"]}  # fmt: skip
    overlay.write_text(yaml.safe_dump({"kernelbench": {"url": url, "commit": commit},
                                       "arch": "sm_90", "survey": survey}))  # fmt: skip
    submit = tmp_path / "submit.sh"
    submit.write_text(SURVEY_SUBMIT)
    submit.chmod(submit.stat().st_mode | stat.S_IXUSR)
    log = tmp_path / "submitted.txt"
    snakemake(
        workdir, "--workflow-profile", "profiles/slurm", "--executor", "cluster-generic",
        "--cluster-generic-submit-cmd",
        f"{submit} {{rule}} {{resources.gpu}} {{resources.mem_mb}} {{resources.cpus_per_task}}",
        "--jobs", "2", "--latency-wait", "5", "--seconds-between-status-checks", "1",
        "survey_records", "--configfile", str(overlay),
        env={**os.environ, "KBFUSE_SUBMITTED": str(log)},
    )  # fmt: skip
    lines = sorted(log.read_text().splitlines())
    # only the task jobs went to the cluster; the checkout, list, pins and aggregate did not
    assert lines == ["survey_task gpu=1 mem_mb=16000 cpus_per_task=4"] * 2
    for task in (1, 53):
        rec = records.read_record(workdir / f"results/survey/strict/tasks/{task}.json",
                                  "survey_task")  # fmt: skip
        assert rec["task"] == task and rec["baselines"]["torchscript"]["status"] == "ok"
