"""The workflow end to end on the CPU, and what a change makes it rerun.

The CPU rules (KernelBench pin, NVRTC compiles for sm_90, direction witness) really run
against a small KernelBench-shaped git repository. The GPU part of the DAG is checked by
dry-run: for the regeneration tests its outputs are stood in for by placeholder files
(never read: only their existence and age matter to the scheduler), so the jobs a
change would rerun can be listed exactly.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest
import yaml
from conftest import GPU_RULES, snakemake, write_test_config

from kbfuse.io import read_json

ROOT = Path(__file__).resolve().parents[1]
DEFAULT = yaml.safe_load((ROOT / "config/config.yaml").read_text())
# The study's variants, in config order; all but CuPy's route compile on the CPU for sm_90.
ALL_VARIANTS = list(DEFAULT["variants"])
CPU_VARIANTS = [v for v in ALL_VARIANTS if DEFAULT["variants"][v]["route"] != "cupy-default"]
TASKS = [int(t) for t in DEFAULT["tasks"]]
# Jobs that read every result, so any change upstream reruns them.
AGGREGATES = {("margin_audit", ""), ("summary", ""), ("manifest", ""), ("bundle", "")}


def dry_run(workdir: Path, *args: str) -> subprocess.CompletedProcess:
    return snakemake(workdir, "--dry-run", "--cores", "1", *args)


def planned_jobs(workdir: Path, *args: str) -> set[tuple[str, str]]:
    """(rule, wildcards) of every job a dry-run would run."""
    return jobs_in(dry_run(workdir, *args))


def jobs_in(proc: subprocess.CompletedProcess) -> set[tuple[str, str]]:
    """(rule, wildcards) of every job in a dry-run's output."""
    jobs, rule = set(), None
    for line in proc.stdout.splitlines():
        if m := re.match(r"^(?:local)?rule (\w+):$", line.strip()):
            rule = m.group(1)
            jobs.add((rule, ""))
        elif rule and (m := re.match(r"^wildcards: (.*)$", line.strip())):
            jobs.discard((rule, ""))
            jobs.add((rule, m.group(1)))
    if not jobs:
        assert "Nothing to be done" in proc.stdout + proc.stderr, proc.stdout
    return jobs


def outputs_in(proc: subprocess.CompletedProcess) -> dict[tuple[str, str], list[str]]:
    """(rule, wildcards) -> output files of every job in a dry-run's output."""
    outputs: dict[tuple[str, str], list[str]] = {}
    rule = wildcards = files = None
    for line in [*proc.stdout.splitlines(), ""]:
        line = line.strip()
        # A job's block ends at a blank line, a timestamp line or the next job's rule line.
        if rule and (not line or line.startswith("[") or re.match(r"^(?:local)?rule ", line)):
            outputs[(rule, wildcards)] = files
            rule = None
        if m := re.match(r"^(?:local)?rule (\w+):$", line):
            rule, wildcards, files = m.group(1), "", []
        elif rule and (m := re.match(r"^output: (.*)$", line)):
            files = m.group(1).split(", ")
        elif rule and (m := re.match(r"^wildcards: (.*)$", line)):
            wildcards = m.group(1)
    return outputs


def rules_of(jobs) -> dict[str, int]:
    counts: dict[str, int] = {}
    for rule, _ in jobs:
        counts[rule] = counts.get(rule, 0) + 1
    return counts


@pytest.fixture(scope="module")
def default_dag(tmp_path_factory, kb_repo) -> subprocess.CompletedProcess:
    """The dry-run of `all` for the default study in a fresh copy of the workflow (one run for
    the tests that read its jobs and their outputs)."""
    from conftest import copy_workflow

    workdir = copy_workflow(tmp_path_factory.mktemp("default-dag"))
    overlay = write_test_config(workdir, *kb_repo)
    return dry_run(workdir, "all", "--configfile", str(overlay))


def test_full_default_dag_by_dry_run(default_dag):
    jobs = jobs_in(default_dag)
    n_tasks = len(TASKS)
    assert TASKS == [53, 81, 95]
    assert rules_of(jobs) == {
        "all": 1,
        "kernelbench_checkout": 1,
        "kernelbench_task": n_tasks,
        "kernelbench_pin": 1,
        "kernelbench_contract": 1,
        "compile_variant": len(ALL_VARIANTS),
        "verify_variants": 1,  # every variant in one job
        "env_fingerprint": 1,
        "correctness_variants": n_tasks,  # one job per task for every variant
        "correctness_baselines": n_tasks,
        "timing": n_tasks,
        "controls": n_tasks,
        "witness81": 1,
        "direction_witness": 1,
        "margin_audit": 1,
        "summary": 1,
        "manifest": 1,
        "bundle": 1,
    }
    # GPU jobs besides the compiles: one verify, one env, two correctness jobs per task
    # (variants, baselines), timing and controls per task, the task-81 witness.
    assert sum(n for rule, n in rules_of(jobs).items() if rule in GPU_RULES) == 4 * n_tasks + 3
    assert len(jobs) == 12 + 5 * n_tasks + len(ALL_VARIANTS)


def test_one_job_writes_every_variants_correctness_and_verify_file(default_dag):
    outputs = outputs_in(default_dag)
    for task in TASKS:
        assert sorted(outputs[("correctness_variants", f"task={task}")]) == sorted(
            f"results/correctness/{task}/{v}.json" for v in ALL_VARIANTS
        )
        assert outputs[("correctness_baselines", f"task={task}")] == [
            f"results/correctness/{task}/baselines.json"
        ]
    assert sorted(outputs[("verify_variants", "")]) == sorted(
        f"results/verify/{v}.json" for v in ALL_VARIANTS
    )


@pytest.fixture(scope="module")
def cpu_run(tmp_path_factory, kb_repo):
    """A workflow copy whose CPU part really ran (tasks 53 and 81 only)."""
    from conftest import copy_workflow

    workdir = copy_workflow(tmp_path_factory.mktemp("cpu-run"))
    overlay = write_test_config(workdir, *kb_repo, tasks=[53, 81])
    snakemake(workdir, "--cores", "2", "cpu", "--configfile", str(overlay))
    return workdir, overlay


def test_cpu_target_produces_pin_compiles_and_witness(cpu_run, kb_repo):
    workdir, _ = cpu_run
    url, commit = kb_repo
    pin = read_json(workdir / "results/kernelbench/pin.json")
    assert pin["commit"] == pin["head"] == commit
    assert sorted(pin["tasks"]) == ["53", "81"]
    metas = {v: read_json(workdir / f"results/compile/{v}/meta.json") for v in CPU_VARIANTS}
    for variant, meta in metas.items():
        assert meta["variant"] == variant
        assert meta["arch"] == "sm_90"
        assert meta["cuda_cache"]["CUDA_CACHE_DISABLE"] == "1"
        assert meta["expected_ftz"] is variant.endswith("-ftz")
    for route in ("nvrtc-cubin", "nvrtc-ptx"):
        on, off = metas[f"{route}-ftz"], metas[f"{route}-noftz"]
        # Without --ftz only libdevice's approximate ex2/rcp keep .ftz (they exist in no
        # other form); with it every float instruction carries it.
        assert set(off["ptx_ftz_opcodes"]) <= {"ex2.approx.ftz.f32", "rcp.approx.ftz.f32"}
        assert on["ptx_ftz_count"] > 5 * off["ptx_ftz_count"]
        assert "mul.rn.ftz.f32" in on["ptx_ftz_opcodes"]
    assert not (workdir / "results/compile/cupy-default").exists()
    witness = read_json(workdir / "results/protocol/direction_witness.json")
    assert witness["allclose_a_b"] != witness["allclose_b_a"]
    assert planned_jobs(workdir, "cpu", "--configfile", str(cpu_run[1])) == set()


def _stand_in_for_gpu_outputs(workdir: Path, overlay: Path) -> None:
    """Create the outputs that only a GPU could make, newer than everything else."""
    pending = planned_jobs(workdir, "all", "--configfile", str(overlay))
    assert {rule for rule, _ in pending} <= {
        "all",
        "compile_variant",  # cupy-default needs CuPy and a GPU
        *GPU_RULES,
        "margin_audit",
        "summary",
        "manifest",
        "bundle",
    }
    summary = snakemake(workdir, "--summary", "all", "--configfile", str(overlay)).stdout
    later = time.time() + 5
    for line in summary.splitlines()[1:]:
        path = line.split("\t")[0]
        if path.startswith("results/") and not Path(workdir, path).exists():
            target = Path(workdir, path)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text("placeholder\n")
            os.utime(target, (later, later))


@pytest.fixture(scope="module")
def settled_run(cpu_run):
    workdir, overlay = cpu_run
    _stand_in_for_gpu_outputs(workdir, overlay)
    assert planned_jobs(workdir, "all", "--configfile", str(overlay)) == set()
    return workdir, overlay


@pytest.fixture
def settled(settled_run, tmp_path):
    """A private copy (mtimes and Snakemake metadata kept) of the settled run."""
    workdir, overlay = settled_run
    copy = tmp_path / "wf"
    shutil.copytree(workdir, copy, symlinks=True)
    return copy, copy / overlay.name


def _overlay_with(workdir: Path, base: Path, name: str, **changes) -> Path:
    cfg = yaml.safe_load(base.read_text())
    cfg.update(changes)
    path = workdir / name
    path.write_text(yaml.safe_dump(cfg))
    return path


def test_unchanged_tree_has_nothing_to_do(settled):
    workdir, overlay = settled
    assert planned_jobs(workdir, "all", "--configfile", str(overlay)) == set()


def test_changing_one_variant_reruns_only_its_compile_and_dependents(settled):
    workdir, overlay = settled
    options = ["--std=c++11", "--fmad=false", "--ftz=true", "-lineinfo"]
    changed = _overlay_with(
        workdir,
        overlay,
        "changed.yaml",
        variants={"nvrtc-ptx-ftz": {"route": "nvrtc-ptx", "options": options}},
    )
    jobs = planned_jobs(workdir, "all", "--configfile", str(changed))
    assert jobs == {
        ("all", ""),
        ("compile_variant", "variant=nvrtc-ptx-ftz"),
        # one job checks every variant: a changed artifact reruns the whole job
        ("verify_variants", ""),
        ("correctness_variants", "task=53"),
        ("correctness_variants", "task=81"),
        ("timing", "task=53"),
        ("timing", "task=81"),
        ("controls", "task=53"),
        ("controls", "task=81"),
        ("witness81", ""),
        *AGGREGATES,
    }
    cpu_jobs = planned_jobs(workdir, "cpu", "--configfile", str(changed))
    assert cpu_jobs == {("cpu", ""), ("compile_variant", "variant=nvrtc-ptx-ftz")}


def test_adding_a_task_adds_only_that_tasks_jobs(settled):
    workdir, overlay = settled
    more = _overlay_with(workdir, overlay, "more.yaml", tasks=[53, 81, 95])
    jobs = planned_jobs(workdir, "all", "--configfile", str(more))
    assert jobs == {
        ("all", ""),
        ("kernelbench_task", "task=95"),
        ("kernelbench_pin", ""),
        ("correctness_variants", "task=95"),
        ("correctness_baselines", "task=95"),
        ("timing", "task=95"),
        ("controls", "task=95"),
        *AGGREGATES,
    }


def _edit(path: Path) -> None:
    """A real edit (Snakemake skips inputs whose mtime moved but whose checksum did not)."""
    comment = "// edited\n" if path.suffix == ".cu" else "# edited\n"
    path.write_text(path.read_text() + comment)
    later = time.time() + 60
    os.utime(path, (later, later))


def test_editing_a_library_module_reruns_the_rules_that_use_it(settled):
    workdir, overlay = settled
    _edit(workdir / "src/kbfuse/checks/protocol.py")
    jobs = planned_jobs(workdir, "all", "--configfile", str(overlay))
    assert jobs == {("all", ""), ("direction_witness", ""), *AGGREGATES}


def test_editing_the_kernel_source_reruns_every_compile_and_gpu_stage(settled):
    workdir, overlay = settled
    _edit(workdir / "kernels/naive.cu")
    jobs = planned_jobs(workdir, "all", "--configfile", str(overlay))
    naive = {v for v in ALL_VARIANTS if DEFAULT["variants"][v].get("kernel", "naive") == "naive"}
    assert {w for rule, w in jobs if rule == "compile_variant"} == {f"variant={v}" for v in naive}
    assert {job for job in jobs if job[0] in GPU_RULES} == {
        ("verify_variants", ""),
        ("correctness_variants", "task=53"),
        ("correctness_variants", "task=81"),
        ("timing", "task=53"),
        ("timing", "task=81"),
        ("controls", "task=53"),
        ("controls", "task=81"),
        ("witness81", ""),
    }
    counts = rules_of(jobs)
    assert "kernelbench_task" not in counts and "direction_witness" not in counts
    assert "correctness_baselines" not in counts and "env_fingerprint" not in counts
