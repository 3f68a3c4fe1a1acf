"""The side-stream guard on the GPU: what a candidate's first call does apart from its later
calls. A candidate that captures a CUDA graph on its first call (PyTorch's capture bookkeeping
runs on the capture stream) and replays it on the caller's stream afterwards passes, with the
finding `side_stream_first_call`; one that queues every call on a stream of its own still
fails `side_stream`. Each runs `kbfuse check` alone, against a clone of the pinned KernelBench
(from $KBFUSE_CHECK_KERNELBENCH, else the .kb/KernelBench.git mirror tools/h200-run.sh
carries), timed against eager in a few short rounds.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parent.parent
CANDIDATES = ROOT / "tests" / "candidates"
PIN = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())["kernelbench"]["commit"]
CHECK = {
    "official_trials": 5,
    "seeds": [0],
    "distributions": ["uniform"],
    "baselines": ["eager"],
    "time_limit_s": 590,
    "timing": {"warmup": 1, "rounds": 3, "invocations_per_pair": 2},
}


@pytest.fixture(scope="module")
def checkout(tmp_path_factory) -> Path:
    mirror = os.environ.get("KBFUSE_CHECK_KERNELBENCH") or str(ROOT / ".kb" / "KernelBench.git")
    assert Path(mirror).exists(), "no KernelBench repository: set KBFUSE_CHECK_KERNELBENCH"
    dest = tmp_path_factory.mktemp("kb") / "KernelBench"
    subprocess.run(["git", "clone", "-q", "--no-checkout", mirror, str(dest)], check=True)
    subprocess.run(["git", "-C", str(dest), "checkout", "-q", PIN], check=True)
    return dest


def check(candidate: Path, checkout: Path, tmp_path: Path) -> dict:
    config = tmp_path / "check.yaml"
    config.write_text(yaml.safe_dump({"check": CHECK}))
    out = tmp_path / f"{candidate.stem}.json"
    command = [
        sys.executable, "-m", "kbfuse.workflow.cli", "check", str(candidate), "--task", "2/53",
        "--kernelbench", str(checkout), "--out", str(out), "--config", str(config),
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=900)
    assert out.exists(), done.stdout + done.stderr
    return json.loads(out.read_text())


def test_a_graph_captured_on_the_first_call_is_not_side_stream_work(checkout, tmp_path):
    record = check(CANDIDATES / "streams" / "graph_capture_53.py", checkout, tmp_path)
    assert record["verdict"] == "pass", record["failed_checks"]
    side = record["guards"]["side_stream"]
    assert side["detected"] is False and side["off_stream"] == []
    assert side["candidate_streams"] == side["caller_streams"]
    first = side["first_call"]
    assert first["detected"] is True
    assert set(first["candidate_streams"]) - set(side["caller_streams"])
    assert all("FillFunctor" in k["name"] for k in first["off_stream"]), first["off_stream"]
    assert "side_stream_first_call" in record["findings"]
    assert record["checks"]["side_stream"]["detail"].startswith(
        f"all GPU work on {side['caller_streams']} after the first call (the first also on"
    )
    cases = record["correctness"]["cases"]
    assert all(c["bit_identical"] for c in cases.values())  # eager's kernels, replayed


def test_work_queued_on_a_stream_of_its_own_still_fails(checkout, tmp_path):
    record = check(CANDIDATES / "side_stream_53.py", checkout, tmp_path)
    assert record["verdict"] == "fail" and "side_stream" in record["failed_checks"]
    side = record["guards"]["side_stream"]
    assert side["detected"] is True and side["first_call"]["detected"] is True
    assert "side_stream_first_call" not in record["findings"]
