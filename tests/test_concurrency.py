"""Issue 5: concurrent runs and the one-GPU-job-at-a-time cap.

(a) A second `snakemake` in the same directory is refused by Snakemake's lock while a first one
    runs; after the first is killed the lock is stale, and `snakemake --unlock` followed by a
    rerun recovers, as docs/running.md's "Concurrency and stale locks" says.
(b) Every GPU rule that times or measures the device declares `resources: gpu=1` and the
    default profile caps `gpu=1`; the rules that only compute declare `gpu_jobs=1`. Checked
    statically (the profile's YAML) and from each job's `resources:` line in a dry-run of `all`.
    Timing two GPU jobs against each other needs a GPU, so the cap's effect on the scheduler is
    shown on this machine with GPU jobs that fail (kbfuse.workflow.jobs.require_gpu, made to take
    SLOW_GPU_CHECK_S in the test's copy of the workflow, so that jobs running at once overlap
    in their logs): with --cores 8 under the profile they run one after the other, and with
    the cap lifted (--resources gpu=3) the same jobs overlap, which shows the check can see an
    overlap.
"""

from __future__ import annotations

import os
import re
import signal
import time
from datetime import datetime, timedelta
from pathlib import Path

import pytest
import snakefork
import torch
import yaml
from conftest import (
    ALONE_GPU_RULES,
    ROOT,
    SHARED_GPU_RULES,
    copy_workflow,
    snakemake,
    write_test_config,
)

from kbfuse.io import read_json

LOCKED = "Directory cannot be locked"
PIN = "results/kernelbench/pin.json"

# ------------------------------------------------------------------ (a) the lock


def _start_paused(workdir: Path, point: str, marker: Path, *args: str):
    """Start `snakemake --cores 1 *args` (tests/snakefork.py) and return once a job sits at
    kbfuse pause `point`."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(workdir / "src"), env.get("PYTHONPATH")]))
    env["KBFUSE_PAUSE_AT"] = point
    env["KBFUSE_PAUSE_MARKER"] = str(marker)
    # its own process group (session): the kill reaches the job too
    proc = snakefork.start(["--cores", "1", *args], workdir, env, Path(os.devnull),
                           new_session=True)  # fmt: skip
    deadline = time.monotonic() + 120
    while not marker.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise AssertionError(f"the first run never reached {point}")
        time.sleep(0.05)
    return proc


def _locks(workdir: Path) -> list[Path]:
    locks = workdir / ".snakemake/locks"
    return list(locks.iterdir()) if locks.exists() else []


def test_second_run_is_refused_by_the_lock_and_unlock_recovers(tmp_path, kb_repo):
    workdir = copy_workflow(tmp_path / "wf")
    config = write_test_config(workdir, *kb_repo, tasks=[81])
    args = (PIN, "--configfile", str(config))
    first = _start_paused(workdir, "clone:*", tmp_path / "marker", *args)
    try:
        second = snakemake(workdir, "--cores", "1", *args, check=False)
        assert first.poll() is None, "the first run must still be running"
        assert second.returncode != 0
        out = second.stdout + second.stderr
        assert LOCKED in out, out
        assert "--unlock" in out  # Snakemake says how to remove a stale lock
        assert not (workdir / "results/kernelbench/checkout.json").exists()
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.wait()
    assert _locks(workdir), "SIGKILL leaves the lock behind"

    stale = snakemake(workdir, "--cores", "1", *args, check=False)
    assert stale.returncode != 0 and LOCKED in stale.stdout + stale.stderr
    snakemake(workdir, "--unlock", *args)
    assert not _locks(workdir)
    rerun = snakemake(workdir, "--cores", "1", *args)
    pin = read_json(workdir / PIN)
    assert pin["commit"] == pin["head"] == kb_repo[1]
    assert sorted(pin["tasks"]) == ["81"]
    out = rerun.stdout + rerun.stderr
    redone = re.search(r"^(?:local)?rule kernelbench_checkout:$", out, re.MULTILINE)
    assert redone, "the cut-off checkout job was run again"


# ------------------------------------------------------------------ (b) gpu=1


def planned_resources(workdir: Path, *args: str) -> list[tuple[str, str, dict[str, str]]]:
    """(rule, wildcards, resources) of every job in a dry-run."""
    proc = snakemake(workdir, "--dry-run", "--cores", "8", *args)
    jobs: list[tuple[str, str, dict[str, str]]] = []
    for line in proc.stdout.splitlines():
        line = line.strip()
        if m := re.fullmatch(r"(?:local)?rule (\w+):", line):
            jobs.append((m.group(1), "", {}))
        elif jobs and (m := re.fullmatch(r"wildcards: (.*)", line)):
            jobs[-1] = (jobs[-1][0], m.group(1), jobs[-1][2])
        elif jobs and (m := re.fullmatch(r"resources: (.*)", line)):
            jobs[-1][2].update(kv.split("=", 1) for kv in m.group(1).split(", "))
    assert jobs, proc.stdout
    return jobs


def test_default_profile_caps_gpu_at_one():
    profile = yaml.safe_load((ROOT / "profiles/default/config.yaml").read_text())
    assert profile["resources"] == ["gpu=1", "gpu_jobs=6"]


@pytest.mark.parametrize("arch", ["sm_90", "auto"])
def test_exactly_the_gpu_jobs_ask_for_the_gpu(tmp_path, kb_repo, arch):
    workdir = copy_workflow(tmp_path / "wf")
    config = write_test_config(workdir, *kb_repo, arch=arch)
    jobs = planned_resources(workdir, "all", "--configfile", str(config))
    # the full default study, 3 tasks x 5 variants: one verify job, one correctness job per task
    assert len(jobs) == 27 + len(default_variants())
    # With a fixed arch only CuPy's route needs the GPU to compile; `auto` asks the GPU.
    gpu_compiles = (
        {"variant=cupy-default"}
        if arch == "sm_90"
        else {f"variant={v}" for v in default_variants()}
    )
    for rule, wildcards, resources in jobs:
        alone = rule in ALONE_GPU_RULES or (rule == "compile_variant" and wildcards in gpu_compiles)
        assert resources.get("gpu", "0") == ("1" if alone else "0"), (rule, wildcards)
        shared = rule in SHARED_GPU_RULES
        assert resources.get("gpu_jobs", "0") == ("1" if shared else "0"), (rule, wildcards)
    assert {r for r, _, res in jobs if res.get("gpu") == "1"} == ALONE_GPU_RULES | {
        "compile_variant"
    }
    assert {r for r, _, res in jobs if res.get("gpu_jobs") == "1"} == SHARED_GPU_RULES
    # env; per task: timing and controls; witness81 (correctness and verify share the GPU)
    assert sum(res.get("gpu") == "1" for _, _, res in jobs) == 8 + len(gpu_compiles)


def default_variants() -> list[str]:
    return list(yaml.safe_load((ROOT / "config/config.yaml").read_text())["variants"])


# Three GPU jobs with no inputs from other jobs when arch is auto.
GPU_TARGETS = {
    "results/env/fingerprint.json": "logs/env/fingerprint.log",
    "results/compile/nvrtc-ptx-ftz/meta.json": "logs/compile/nvrtc-ptx-ftz.log",
    "results/compile/nvrtc-cubin-ftz/meta.json": "logs/compile/nvrtc-cubin-ftz.log",
}


SLOW_GPU_CHECK_S = 3.0
_GPU_CHECK = "    from kbfuse.compilation import cudadriver\n\n    try:\n"


def slow_gpu_check(workdir: Path) -> None:
    """Make require_gpu in the copied workflow take SLOW_GPU_CHECK_S before it fails: a job
    that fails within milliseconds would not overlap another in its log even when both ran
    at once, and the overlap check below could not fail."""
    jobs = workdir / "src/kbfuse/workflow/jobs.py"
    text = jobs.read_text()
    assert text.count(_GPU_CHECK) == 1, "require_gpu changed: update slow_gpu_check"
    delay = f"    import time\n\n    time.sleep({SLOW_GPU_CHECK_S})\n"
    jobs.write_text(text.replace(_GPU_CHECK, delay + _GPU_CHECK))


def _job_spans(workdir: Path) -> list[tuple[datetime, datetime]]:
    """(first, last) log timestamp of each job: both lie inside the job's lifetime."""
    spans = []
    for log in GPU_TARGETS.values():
        stamps = re.findall(
            r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) kbfuse ",
            (workdir / "results" / log).read_text(),
            re.MULTILINE,
        )
        assert len(stamps) == 2, log  # "stage ...; CUDA cache" and "stage ... failed"
        first, last = (datetime.strptime(s, "%Y-%m-%d %H:%M:%S,%f") for s in stamps)
        spans.append((first, last))
    return sorted(spans)


@pytest.mark.skipif(torch.cuda.is_available(), reason="GPU jobs would run, not fail at once")
@pytest.mark.parametrize("cap", ["profile", "lifted"])
def test_gpu_cap_serialises_gpu_jobs_under_many_cores(tmp_path, kb_repo, cap):
    workdir = copy_workflow(tmp_path / "wf")
    slow_gpu_check(workdir)
    config = write_test_config(workdir, *kb_repo, arch="auto")
    extra = [] if cap == "profile" else ["--resources", "gpu=3"]
    proc = snakemake(
        workdir, "--cores", "8", "--keep-going", *GPU_TARGETS, *extra,
        "--configfile", str(config), check=False,
    )  # fmt: skip
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and out.count("needs a CUDA GPU") >= len(GPU_TARGETS), out
    assert f'gpu=Resource("gpu", {1 if cap == "profile" else 3})' in out
    spans = _job_spans(workdir)
    assert all(last - first >= timedelta(seconds=SLOW_GPU_CHECK_S) for first, last in spans)
    overlaps = [a[1] > b[0] for a, b in zip(spans, spans[1:], strict=False)]
    # The scheduler's own account: how many jobs it started at once.
    batches = [int(n) for n in re.findall(r"^Execute (\d+) jobs\.\.\.$", out, re.MULTILINE)]
    if cap == "profile":
        assert not any(overlaps), spans
        assert batches and max(batches) == 1, batches
    else:
        assert all(overlaps), spans  # started together, they run together
        assert max(batches) == len(GPU_TARGETS), batches
