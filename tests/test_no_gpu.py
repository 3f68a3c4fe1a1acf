"""Issue 5: GPU stages on a machine without a GPU.

Asking Snakemake for a GPU output here must fail within seconds with
kbfuse.workflow.jobs.require_gpu's
message (which names the stage and points to the `cpu` target), leave no output of the job,
and start nothing that depends on it. These tests can only run where CUDA sees no device.
"""

from __future__ import annotations

import re
import shutil
import time
from pathlib import Path

import pytest
import torch
import yaml
from conftest import copy_workflow, snakemake, write_test_config

from kbfuse.io import sha256_file

pytestmark = pytest.mark.skipif(
    torch.cuda.is_available(),
    reason="a CUDA GPU is visible: the no-GPU failure cannot be provoked here",
)

MESSAGE = "needs a CUDA GPU, but the CUDA driver sees none"
ADVICE = "build only the CPU part: snakemake --cores 1 cpu"
FAST_S = 30  # one snakemake run, start-up included; the failing job itself takes ~2 s


def started(out: str, rule: str) -> int:
    return len(re.findall(rf"^(?:local)?rule {rule}:$", out, re.MULTILINE))


def run_failing(workdir: Path, *args: str) -> tuple[str, float]:
    t0 = time.monotonic()
    proc = snakemake(workdir, "--cores", "1", "--keep-going", *args, check=False)
    elapsed = time.monotonic() - t0
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    assert not list(workdir.glob(".snakemake/incomplete/*"))
    return out, elapsed


def test_env_fingerprint_fails_fast_with_a_clear_message(workflow_copy):
    workdir, config = workflow_copy
    out, elapsed = run_failing(workdir, "results/env/fingerprint.json", "--configfile", str(config))
    assert elapsed < FAST_S
    assert f"kbfuse: env failed: stage 'env' {MESSAGE}" in out
    assert ADVICE in out
    assert "Error in rule env_fingerprint" in out
    assert MESSAGE in (workdir / "results/logs/env/fingerprint.log").read_text()
    assert not (workdir / "results/env").exists()
    assert not (workdir / "results/benchmarks/env/fingerprint.tsv").exists()


@pytest.fixture(scope="module")
def cpu_built(tmp_path_factory, kb_repo) -> tuple[Path, Path]:
    """A workflow copy after `snakemake cpu` (pin, NVRTC compiles, direction witness), for a
    study with the default NVRTC only: its NVRTC 12.9 twins would be five more compiles of the
    same kind (test_workflow.py runs them). Tests get copies of it (cpu_done, ...)."""
    workdir = copy_workflow(tmp_path_factory.mktemp("no-gpu") / "built")
    config = write_test_config(workdir, *kb_repo, tasks=[53, 81], nvrtc_versions=[])
    snakemake(workdir, "--cores", "2", "cpu", "--configfile", str(config))
    return workdir, config


def copy_of(built: tuple[Path, Path], dest: Path) -> tuple[Path, Path]:
    """A copy of a built workflow, its files' times and Snakemake's metadata kept."""
    workdir, config = built
    shutil.copytree(workdir, dest, symlinks=True)
    return dest, dest / config.name


@pytest.fixture
def cpu_done(cpu_built, tmp_path):
    return copy_of(cpu_built, tmp_path / "wf")


@pytest.fixture
def cpu_done_without_cupy(cpu_built, tmp_path):
    """The same, for a study without CuPy's route: the CPU part has compiled every variant,
    and stays complete (the test checks it)."""
    workdir, config = copy_of(cpu_built, tmp_path / "wf")
    study = workdir / "config/config.yaml"
    cfg = yaml.safe_load(study.read_text())
    del cfg["variants"]["cupy-default"]  # a --configfile overlay can add variants, not drop them
    study.write_text(yaml.safe_dump(cfg))
    return workdir, config


# One output of every GPU rule whose inputs the CPU part provides (the CuPy route's compile
# needs a GPU too) ...
GPU_JOBS = {
    "correctness_baselines": ("results/correctness/53/baselines.json", "correctness_baselines"),
    "compile_variant": ("results/compile/cupy-default/meta.json", "compile"),
}
# ... and the jobs that load every variant, so depend on the failing cupy-default compile:
# they must never start.
DOWNSTREAM = {
    "verify_variants": "results/verify/nvrtc-cubin-noftz.json",
    "correctness_variants": "results/correctness/81/nvrtc-ptx-ftz.json",
}


def new_files(workdir: Path, before: dict) -> list[str]:
    """Files under results/ that are not in `before`, relative to results/logs; and check that
    nothing in `before` changed."""
    after = {p: sha256_file(p) for p in (workdir / "results").rglob("*") if p.is_file()}
    assert {p: after[p] for p in before} == before
    return sorted(
        p.relative_to(workdir / "results/logs").as_posix() for p in set(after) - set(before)
    )


def test_gpu_stages_after_the_cpu_target_fail_fast_and_leave_nothing(cpu_done):
    workdir, config = cpu_done
    before = {p: sha256_file(p) for p in (workdir / "results").rglob("*") if p.is_file()}
    targets = [path for path, _ in GPU_JOBS.values()]
    out, elapsed = run_failing(workdir, *targets, *DOWNSTREAM.values(), "--configfile", str(config))
    assert elapsed < 2 * FAST_S  # two GPU jobs, one at a time (gpu=1)
    for rule, (path, stage) in GPU_JOBS.items():
        assert started(out, rule) == 1, rule
        assert f"Error in rule {rule}" in out
        assert f"kbfuse: {stage} failed: stage {stage!r} {MESSAGE}" in out
        assert not (workdir / path).exists(), path
    assert out.count(ADVICE) >= len(GPU_JOBS)
    assert not (workdir / "results/compile/cupy-default/tails.bin").exists()
    for rule in DOWNSTREAM:  # not started: no log, no output
        assert started(out, rule) == 0, rule
    for name in ("verify", "correctness"):
        assert not [p for p in (workdir / "results" / name).rglob("*") if p.is_file()]
    # Nothing the CPU part made was touched; the only new files are the failed jobs' logs.
    new = new_files(workdir, before)
    assert new == ["compile/cupy-default.log", "correctness/53/baselines.log"]
    for rel in new:
        assert MESSAGE in (workdir / "results/logs" / rel).read_text(), rel
    # ... and the CPU target is still complete.
    dry = snakemake(workdir, "--dry-run", "--cores", "1", "cpu", "--configfile", str(config))
    assert "Nothing to be done" in dry.stdout + dry.stderr


def test_jobs_of_every_variant_fail_fast_and_leave_none_of_their_files(cpu_done_without_cupy):
    """verify_variants and correctness_variants write one file per variant: none survives."""
    workdir, config = cpu_done_without_cupy
    before = {p: sha256_file(p) for p in (workdir / "results").rglob("*") if p.is_file()}
    out, elapsed = run_failing(workdir, *DOWNSTREAM.values(), "--configfile", str(config))
    assert elapsed < 2 * FAST_S  # two GPU jobs, one at a time (gpu=1)
    for rule, stage in (("verify_variants", "verify"), ("correctness_variants", "correctness")):
        assert started(out, rule) == 1, rule
        assert f"Error in rule {rule}" in out
        assert f"kbfuse: {stage} failed: stage {stage!r} {MESSAGE}" in out
    for name in ("verify", "correctness"):
        assert not [p for p in (workdir / "results" / name).rglob("*") if p.is_file()]
    new = new_files(workdir, before)
    assert new == ["correctness/81/variants.log", "verify/variants.log"]
    for rel in new:
        assert MESSAGE in (workdir / "results/logs" / rel).read_text(), rel
    # ... and the CPU target is still complete.
    dry = snakemake(workdir, "--dry-run", "--cores", "1", "cpu", "--configfile", str(config))
    assert "Nothing to be done" in dry.stdout + dry.stderr
