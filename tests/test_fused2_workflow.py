"""The second fused study's part of the workflow on the CPU (`fused2`, `fused2_cpu`).

Against the KernelBench-shaped fixture with the small tasks 4 and 65 (tests/kbrepo.py): the DAG
of `snakemake fused2` by dry run (every stage of the first study, once per task or variant of
the second, all under results/fused2/), its CPU part really run (the task pins, the contract,
the NVRTC compiles for sm_90, the direction witness), and the separation of the two studies:
the first study's `all` plans no job of the second, and an edit of a second-study kernel reruns
none of the first study's jobs. The GPU stages of the second study are the first study's
library functions (tests/test_fused2_stages.py runs them on the CPU with stand-ins).
"""

from __future__ import annotations

import re

import pytest
import yaml
from conftest import GPU_RULES, ROOT, copy_workflow, snakemake, write_test_config
from kbrepo import FUSED2_TASKS, make_kernelbench_repo
from test_workflow import _edit, jobs_in, planned_jobs, rules_of

from kbfuse.io import read_json, sha256_file

pytestmark = pytest.mark.slow

DEFAULT = yaml.safe_load((ROOT / "config/config.yaml").read_text())
FUSED2_VARIANTS = list(DEFAULT["fused2"]["variants"])
CPU_VARIANTS = [
    v for v in FUSED2_VARIANTS if DEFAULT["fused2"]["variants"][v]["route"] != "cupy-default"
]
SURVEY = ROOT / "results/reference/h200/survey/survey/summary"
FUSED2_GPU_RULES = {f"fused2_{rule}" for rule in GPU_RULES if rule != "witness81"}


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    """(url, commit) of the fixture repository with both studies' tasks."""
    root = tmp_path_factory.mktemp("kb-fused2")
    return make_kernelbench_repo(root / "kb", tasks=(53, 81, 95, *FUSED2_TASKS))


def overlay_for(workdir, repo):
    return write_test_config(workdir, *repo, fused2={"survey_summary": str(SURVEY)})


@pytest.fixture(scope="module")
def fused2_dag(tmp_path_factory, repo):
    workdir = copy_workflow(tmp_path_factory.mktemp("fused2-dag"))
    overlay = overlay_for(workdir, repo)
    return snakemake(workdir, "--dry-run", "--cores", "1", "fused2", "--configfile", str(overlay))


def test_the_fused2_target_runs_every_stage_for_the_second_study(fused2_dag):
    jobs = jobs_in(fused2_dag)
    n_tasks, n_variants = len(FUSED2_TASKS), len(FUSED2_VARIANTS)
    assert rules_of(jobs) == {
        "fused2": 1,
        "kernelbench_checkout": 1,  # the one checkout both studies pin from
        "fused2_kernelbench_task": n_tasks,
        "fused2_kernelbench_pin": 1,
        "fused2_kernelbench_contract": 1,
        "fused2_compile_variant": n_variants,
        "fused2_verify_variants": 1,
        "fused2_env_fingerprint": 1,
        "fused2_correctness_variants": n_tasks,
        "fused2_correctness_baselines": n_tasks,
        "fused2_timing": n_tasks,
        "fused2_controls": n_tasks,
        "fused2_direction_witness": 1,
        "fused2_margin_audit": 1,
        "fused2_survey_rows": 1,
        "fused2_summary": 1,
        "fused2_manifest": 1,
        "fused2_bundle": 1,
    }
    assert {w for rule, w in jobs if rule == "fused2_timing"} == {"task=4", "task=65"}
    assert {w for rule, w in jobs if rule == "fused2_compile_variant"} == {
        f"variant={v}" for v in FUSED2_VARIANTS
    }


def test_every_output_of_the_second_study_is_under_results_fused2(fused2_dag):
    outputs = [
        line.split("output: ")[1]
        for line in fused2_dag.stdout.splitlines()
        if line.strip().startswith("output: ")
    ]
    files = [f for line in outputs for f in line.split(", ")]
    shared = {"results/kernelbench/checkout", "results/kernelbench/checkout.json"}
    assert files and all(f.startswith("results/fused2/") or f in shared for f in files)
    assert "results/fused2/summary/contract.md" in files
    assert "results/fused2/summary/prediction.csv" in files
    assert "results/fused2/controls/65.json" in files
    # no task 81 in this study: no witness record (its summary table has no rows)
    assert not [
        f for f in files if "witness81" in f and not f.startswith("results/fused2/summary/")
    ]


@pytest.fixture(scope="module")
def cpu_runs(tmp_path_factory, repo):
    """A workflow copy where both studies' CPU parts really ran."""
    workdir = copy_workflow(tmp_path_factory.mktemp("fused2-cpu"))
    overlay = overlay_for(workdir, repo)
    snakemake(workdir, "--cores", "2", "fused2_cpu", "--configfile", str(overlay))
    snakemake(workdir, "--cores", "2", "cpu", "--configfile", str(overlay))
    return workdir, overlay


def test_fused2_cpu_pins_compiles_and_witnesses(cpu_runs, repo):
    workdir, _ = cpu_runs
    url, commit = repo
    pin = read_json(workdir / "results/fused2/kernelbench/pin.json")
    assert pin["commit"] == commit and sorted(pin["tasks"]) == ["4", "65"]
    assert pin["tasks"]["65"]["path"] == "KernelBench/level2/65_Conv2d_AvgPool_Sigmoid_Sum.py"
    contract = read_json(workdir / "results/fused2/kernelbench/contract.json")
    assert contract == read_json(workdir / "results/kernelbench/contract.json")
    for variant in CPU_VARIANTS:
        meta = read_json(workdir / f"results/fused2/compile/{variant}/meta.json")
        spec = DEFAULT["fused2"]["variants"][variant]
        assert (meta["variant"], meta["kernel"], meta["arch"]) == (variant, spec["kernel"], "sm_90")
        assert meta["expected_ftz"] is variant.endswith("-ftz")
        assert "eager_ops_conv.cuh" in meta["source_files"]
        if spec.get("nvrtc"):
            assert meta["compiler"]["version"] == spec["nvrtc"]
    assert not (workdir / "results/fused2/compile/cupy-default").exists()
    witness = read_json(workdir / "results/fused2/protocol/direction_witness.json")
    assert witness["allclose_a_b"] != witness["allclose_b_a"]
    survey = read_json(workdir / "results/fused2/prediction/survey_rows.json")
    assert survey["kind"] == "survey_rows" and sorted(survey["rows"]) == ["4", "65"]
    assert {row["numerics"] for row in survey["rows"].values()} == {
        "kernelbench-defaults",
        "strict",
    }
    assert survey["tables"]["strict"] == {
        "file": "survey_strict.csv",
        "sha256": sha256_file(SURVEY / "survey_strict.csv"),
    }
    # the first study's compiles are its own: other sources, other artifacts
    first = read_json(workdir / "results/compile/nvrtc-cubin-noftz/meta.json")
    second = read_json(workdir / "results/fused2/compile/nvrtc-cubin-noftz/meta.json")
    assert (first["kernel"], second["kernel"]) == ("naive", "fused2_naive")
    assert first["artifact_sha256"] != second["artifact_sha256"]


def test_the_first_studys_all_plans_nothing_of_the_second(cpu_runs):
    workdir, overlay = cpu_runs
    jobs = planned_jobs(workdir, "all", "--configfile", str(overlay))
    assert jobs and not [rule for rule, _ in jobs if rule.startswith("fused2")]


def test_editing_a_second_study_kernel_reruns_only_second_study_jobs(cpu_runs, tmp_path):
    import shutil

    workdir, overlay = cpu_runs
    copy = tmp_path / "wf"
    shutil.copytree(workdir, copy, symlinks=True)
    overlay = copy / overlay.name
    assert planned_jobs(copy, "cpu", "--configfile", str(overlay)) == set()
    assert planned_jobs(copy, "fused2_cpu", "--configfile", str(overlay)) == set()
    _edit(copy / "kernels/fused2_fast.cu")
    assert planned_jobs(copy, "cpu", "--configfile", str(overlay)) == set()
    fast = {v for v in CPU_VARIANTS if DEFAULT["fused2"]["variants"][v]["kernel"] == "fused2_fast"}
    assert planned_jobs(copy, "fused2_cpu", "--configfile", str(overlay)) == {
        ("fused2_cpu", ""),
        *(("fused2_compile_variant", f"variant={v}") for v in fast),
    }
    # the shared header reruns both studies' compiles
    _edit(copy / "kernels/eager_ops.cuh")
    first = planned_jobs(copy, "cpu", "--configfile", str(overlay))
    assert {rule for rule, _ in first} == {"cpu", "compile_variant"}


def test_a_second_study_source_without_a_tasks_kernel_is_refused(tmp_path, repo):
    workdir = copy_workflow(tmp_path / "wf")
    overlay = overlay_for(workdir, repo)
    broken = {"fused2": {"survey_summary": str(SURVEY), "tasks": [4, 65, 53]}}
    bad = workdir / "bad.yaml"
    bad.write_text(yaml.safe_dump(broken))
    proc = snakemake(
        workdir,
        "--dry-run",
        "fused2",
        "--configfile",
        str(overlay),
        "--configfile",
        str(bad),
        check=False,
    )
    assert proc.returncode != 0
    message = proc.stderr + proc.stdout
    assert re.search(
        r"config key fused2\.variants\.nvrtc-cubin-noftz\.kernel: \S*kernels/fused2_naive\.cu "
        r"does not define tail53 \(kernels of tasks \[4, 65, 53\]\)",
        message,
    ), message
    assert (
        "config key fused2.controls.small_shape: task 53 needs ['batch', 'in_features', "
        "'out_features'] (besides seed), got ['batch', 'height', 'width']" in message
    )
    assert "Building DAG" not in message  # refused before any job


_RULE_PARAMS = """
import json
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
    print(json.dumps({
        r.name: {k: v for k, v in r.params.items() if not callable(v)} for r in wf.rules
    }))
"""


def test_the_second_studys_rules_take_its_own_baselines(tmp_path, repo):
    """`use rule X as fused2_X with: params:` keeps every param of X it does not name, so a
    param left out silently takes the first study's value: with max-autotune only in the
    second study's baselines, its correctness job built none (the H200 run of session 12)."""
    import json
    import os
    import subprocess
    import sys

    workdir = copy_workflow(tmp_path / "wf")
    second = ["eager", "inductor-max-autotune-no-cudagraphs"]
    write_test_config(
        workdir,
        *repo,
        baselines=["eager", "torchscript", "inductor"],
        fused2={"survey_summary": str(SURVEY), "baselines": second},
    )
    proc = subprocess.run(
        [sys.executable, "-c", _RULE_PARAMS],
        cwd=workdir,
        env={**os.environ, "PYTHONPATH": str(workdir / "src")},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    params = json.loads(proc.stdout.splitlines()[-1])
    with_baselines = {rule for rule, p in params.items() if "baselines" in p}
    assert with_baselines == {
        "correctness_baselines",
        "timing",
        "controls",
        "fused2_correctness_baselines",
        "fused2_timing",
        "fused2_controls",
    }
    assert params["correctness_baselines"]["baselines"] == ["torchscript", "inductor"]
    assert params["fused2_correctness_baselines"]["baselines"] == second[1:]
    assert params["fused2_timing"]["baselines"] == second
    assert params["fused2_controls"]["baselines"] == second
    # the params both studies' rules name and that are equal are the shared config's alone
    same = {
        (rule, key)
        for rule in params
        if rule.startswith("fused2_") and rule[7:] in params
        for key in params[rule].keys() & params[rule[7:]].keys()
        if params[rule][key] == params[rule[7:]][key]
    }
    # (from the inherited arch, seeds, distributions and timing protocol: INHERITED)
    assert {key for _, key in same} == {"arch", "protocol", "distributions", "input_seed", "seeds"}
