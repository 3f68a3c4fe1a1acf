"""profiles/slurm on its own, and envs/kbfuse.yaml against pyproject.toml.

The Slurm profile is checked with Snakemake's dry run under the Slurm executor plugin (no
cluster needed): it must be the only profile loaded (profiles/default's `gpu=1` cap is for one
machine), give every job the resources the profile declares, and the plugin must turn a GPU
job's resources into a one-GPU sbatch call. Which rules run on the submitting host is read
from the parsed workflow, since a dry run deliberately does not say.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from conftest import GPU_RULES, ROOT, copy_workflow, snakemake, write_test_config
from packaging.requirements import Requirement

LOCAL_RULES = {
    "kernelbench_checkout",
    "kernelbench_task",
    "kernelbench_pin",
    "kernelbench_contract",
    "direction_witness",
    "margin_audit",
    "summary",
    "manifest",
    "bundle",
}
# The survey's task list, pins, cross-device check (each cluster job has its own GPU: nothing
# to place) and aggregate (not part of the study's `all`).
SURVEY_LOCAL_RULES = {
    "survey_task_list",
    "survey_devices",
    "survey_pin",
    "survey_floor",
    "survey_records",
    "survey_summary",
}
# The second fused study's (workflow/rules/fused2.smk): the first study's local rules, reused,
# and the copy of the survey rows its prediction reads.
FUSED2_LOCAL_RULES = {f"fused2_{rule}" for rule in LOCAL_RULES - {"kernelbench_checkout"}}
FUSED2_LOCAL_RULES.add("fused2_survey_rows")
GPU_JOB = {"gpu": 1, "cpus_per_task": 4, "mem_mb": 16000, "runtime": 30}
CPU_JOB = {"cpus_per_task": 1, "mem_mb": 4000, "runtime": 10}


def parse_value(text: str):
    return int(text) if text.isdigit() else text


def planned_jobs(output: str) -> list[tuple[str, dict]]:
    """(rule, resources) of every job in a dry run's output."""
    jobs = []
    for rule, body in re.findall(r"^(?:local)?rule (\w+):\n((?:    .*\n?)+)", output, re.M):
        m = re.search(r"^    resources: (.*)$", body, re.M)
        pairs = (item.split("=", 1) for item in m.group(1).split(", ")) if m else ()
        jobs.append((rule, {k: parse_value(v) for k, v in pairs}))
    return jobs


@pytest.fixture(scope="module")
def slurm_dry_run(tmp_path_factory, kb_repo) -> tuple[Path, str]:
    workdir = copy_workflow(tmp_path_factory.mktemp("slurm") / "wf")
    overlay = write_test_config(workdir, *kb_repo)
    proc = snakemake(
        workdir, "--workflow-profile", "profiles/slurm", "-n", "all", "--configfile", str(overlay)
    )
    return workdir, proc.stdout + proc.stderr


def test_slurm_profile_is_the_only_profile_loaded(slurm_dry_run):
    _, out = slurm_dry_run
    assert "Using workflow specific profile profiles/slurm" in out
    assert "profiles/default" not in out
    profile = yaml.safe_load((ROOT / "profiles/slurm/config.yaml").read_text())
    assert profile["executor"] == "slurm"
    assert "resources" not in profile  # no cluster-wide cap on GPU jobs


def test_every_job_gets_the_profiles_resources(slurm_dry_run):
    _, out = slurm_dry_run
    jobs = planned_jobs(out)
    assert {rule for rule, _ in jobs} >= GPU_RULES | LOCAL_RULES | {"compile_variant"}
    for rule, res in jobs:
        if rule in GPU_RULES:
            assert {k: res.get(k) for k in GPU_JOB} == GPU_JOB, rule
        elif rule != "all":
            assert {k: res.get(k) for k in CPU_JOB} == CPU_JOB, rule
    compile_gpus = sorted(res["gpu"] for rule, res in jobs if rule == "compile_variant")
    # arch sm_90: the NVRTC compiles need no GPU, the CuPy route (cupy-default) does
    assert compile_gpus == [0] * 10 + [1]  # 10 NVRTC variants (5 with NVRTC 12.9), 1 CuPy


def sbatch_call(res: dict) -> str:
    from snakemake_executor_plugin_slurm.submit_string import get_submit_command
    from snakemake_executor_plugin_slurm.utils import set_gres_string

    class Resources(dict):
        __getattr__ = dict.__getitem__

    job = SimpleNamespace(resources=Resources(res), threads=1)
    params = {
        "run_uuid": "kbfuse",
        "slurm_logfile": "log",
        "comment_str": "rule",
        "account": "",
        "partition": "",
        "workdir": ".",
    }
    return get_submit_command(job, params) + set_gres_string(job)


def test_the_slurm_plugin_asks_one_gpu_for_a_gpu_job_and_none_for_a_compile(slurm_dry_run):
    _, out = slurm_dry_run
    jobs = dict(planned_jobs(out))
    timing = sbatch_call(jobs["timing"]).split()
    for arg in ("--gpus=1", "--cpus-per-task=4", "16000", "30"):
        assert arg in timing
    assert timing[timing.index("--mem") + 1] == "16000"
    assert timing[timing.index("-t") + 1] == "30"
    nvrtc = next(r for rule, r in planned_jobs(out) if rule == "compile_variant" and not r["gpu"])
    call = sbatch_call(nvrtc)
    assert "--gpus" not in call and "--cpus-per-task=1" in call and "--mem 4000" in call


_LOCAL_RULES = """
from pathlib import Path
from snakemake.api import SnakemakeApi
from snakemake.settings.types import ConfigSettings, OutputSettings, ResourceSettings
with SnakemakeApi(OutputSettings()) as api:
    wf = api.workflow(
        resource_settings=ResourceSettings(),
        config_settings=ConfigSettings(configfiles=[Path("test-config.yaml")]),
        snakefile=Path("Snakefile"),
        workdir=Path("."),
    )._workflow
    print(" ".join(sorted(r.name for r in wf.rules if r.name in wf._localrules)))
"""


def test_network_and_aggregation_steps_are_local_rules(slurm_dry_run):
    workdir, _ = slurm_dry_run
    proc = subprocess.run(
        [sys.executable, "-c", _LOCAL_RULES],
        cwd=workdir,
        env={**os.environ, "PYTHONPATH": str(workdir / "src")},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert set(proc.stdout.split()) == (
        LOCAL_RULES | SURVEY_LOCAL_RULES | FUSED2_LOCAL_RULES | {"check_summary", "audit_summary"}
    )


# ---------------------------------------------------------------- envs/kbfuse.yaml


def pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def study_extras() -> list[str]:
    """The extras README's study command installs (`pip install -e '.[cuda13,...]'`)."""
    readme = (ROOT / "README.md").read_text()
    block = next(b for b in readme.split("```bash\n")[1:] if "snakemake --cores 1 all" in b)
    return re.search(r"-e '\.\[([\w,-]+)\]'", block).group(1).split(",")


def test_conda_env_lists_exactly_the_study_dependencies_of_pyproject():
    """The env runs the workflow's jobs: pyproject's dependencies and the extras of README's
    study command, same specifiers, less snakemake (the jobs' script preamble finds the
    running Snakemake)."""
    env = yaml.safe_load((ROOT / "envs/kbfuse.yaml").read_text())
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    project = pyproject()
    assert "cuda13" in study_extras()
    extras = [r for e in study_extras() for r in project["optional-dependencies"][e]]
    wanted = [*project["dependencies"], *extras]
    expected = {str(Requirement(r)) for r in wanted if Requirement(r).name != "snakemake"}
    assert {str(Requirement(r)) for r in pip} == expected
