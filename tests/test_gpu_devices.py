"""Placement on the GPUs of a real machine (run on the GPU machine: pytest -m gpu; the two
tests that need two GPUs or more are marked `multigpu`: pytest -m multigpu on such a machine).

On one GPU: nothing is listed or chosen, a job runs as before and names its GPU. On several:
the child's list is CUDA's (as torch sees it), each placed job sees exactly one GPU (its own,
by UUID), jobs spread over the GPUs, and the cross-device check times every GPU. Every GPU is
compared with nvidia-smi's list (UUIDs, names).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from kbfuse.results import records
from kbfuse.survey import agreement
from kbfuse.workflow import devices, gpulock

ROOT = Path(__file__).resolve().parents[1]


def smi() -> dict[str, str]:
    """{uuid: name} of every GPU nvidia-smi sees (CUDA_VISIBLE_DEVICES does not apply to it)."""
    out = subprocess.run(
        ["nvidia-smi", "--query-gpu=uuid,name", "--format=csv,noheader"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    return dict(tuple(part.strip() for part in line.split(",", 1)) for line in out.splitlines())


def at_least_two_gpus() -> list:
    """The GPUs listed; fails (never skips) on a machine with fewer than two: a test marked
    `multigpu` is asked for by name (pytest -m multigpu), so one GPU is a wrong machine."""
    listed = devices.list_in_child()
    if len(listed) < 2:
        pytest.fail(f"a multigpu test on a machine with {len(listed)} GPU: it needs two or more")
    return listed


def child_env(tmp_path) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), gpulock.LOCK_DIR_VARIABLE: str(tmp_path)}
    env.pop(devices.PLACED, None)
    return env


@pytest.mark.gpu
def test_the_child_lists_the_gpus_cuda_shows():
    import torch

    listed = devices.list_in_child()
    assert len(listed) == torch.cuda.device_count() >= 1
    names = smi()
    for i, device in enumerate(listed):
        assert device.index == i
        assert device.uuid in names
        assert device.name == names[device.uuid] == torch.cuda.get_device_name(i)


@pytest.mark.gpu
def test_several_visible_is_empty_on_one_gpu_and_every_gpu_on_several():
    import torch

    count = torch.cuda.device_count()
    assert len(devices.several_visible()) == (count if count > 1 else 0)


JOB = textwrap.dedent("""
    import json, os, sys, time
    from kbfuse.workflow import devices, jobs
    with jobs.job(sys.argv[1], "placement", gpu=True, gpu_lock=sys.argv[2]):
        import torch
        x = torch.ones(1 << 20, device="cuda")
        torch.cuda.synchronize()
        print(json.dumps({
            "visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "count": torch.cuda.device_count(),
            "current": devices.current("cuda"),
            "torch_name": torch.cuda.get_device_name(0),
        }), file=sys.__stdout__, flush=True)
        time.sleep(float(sys.argv[3]))
""")


def start_job(tmp_path, name, how="shared", hold_s=20.0) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", JOB, str(tmp_path / f"{name}.log"), how, str(hold_s)],
        stdout=subprocess.PIPE, text=True, env=child_env(tmp_path),
    )  # fmt: skip


@pytest.mark.gpu
def test_a_job_names_the_gpu_it_ran_on(tmp_path):
    child = start_job(tmp_path, "one", hold_s=0)
    line = json.loads(child.stdout.readline())
    assert child.wait(timeout=300) == 0, (tmp_path / "one.log").read_text()
    names = smi()
    current = line["current"]
    assert current["uuid"] in names and current["name"] == names[current["uuid"]]
    assert current["name"] == line["torch_name"]
    if len(devices.list_in_child()) == 1:  # one GPU: CUDA's view untouched, device 0
        assert line["visible"] == os.environ.get("CUDA_VISIBLE_DEVICES")
        assert current["index"] == 0
    else:  # several: the job sees its own GPU only
        assert line["visible"] == current["uuid"] and line["count"] == 1


@pytest.mark.multigpu
def test_jobs_spread_over_every_gpu(tmp_path):
    listed = at_least_two_gpus()
    children = [start_job(tmp_path, f"job{n}") for n in range(len(listed))]
    try:
        seen = [json.loads(child.stdout.readline())["current"]["uuid"] for child in children]
    finally:
        for child in children:
            child.kill()
            child.wait()
    assert sorted(seen) == sorted(d.uuid for d in listed)  # one job on each GPU


@pytest.mark.multigpu
def test_two_timing_jobs_time_on_two_gpus_at_once(tmp_path):
    at_least_two_gpus()  # on one, two timing jobs take turns (tests/test_gpulock.py)
    first, second = (start_job(tmp_path, f"t{n}", "alone") for n in range(2))
    try:
        a, b = (json.loads(c.stdout.readline())["current"]["uuid"] for c in (first, second))
    finally:
        for child in (first, second):
            child.kill()
            child.wait()
    assert a != b


@pytest.mark.gpu
def test_the_cross_device_check_on_this_machine(tmp_path, monkeypatch):
    monkeypatch.setenv(gpulock.LOCK_DIR_VARIABLE, str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", str(ROOT / "src"))
    out = tmp_path / "devices.json"
    record = agreement.run_agreement(out, "cuda", exclude=True, say=print)
    assert records.read_record(out, agreement.KIND) == record
    names = smi()
    assert [d["uuid"] in names for d in record["devices"]] == [True] * len(record["devices"])
    if len(record["devices"]) == 1:
        assert not record["timed"] and record["outliers"] == [] and record["excluded"] == []
    else:
        assert record["timed"]
        assert set(record["timings"]) == {d["uuid"] for d in record["devices"]}
        for figures in record["timings"].values():
            assert 0 < figures["gemm_ms"] < 1000 and 0 < figures["copy_ms"] < 1000
        assert len(record["excluded"]) <= len(record["devices"]) // 2
