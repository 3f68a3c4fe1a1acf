"""How a check holds the GPU lock (kbfuse.candidates.check): the reference and the candidate's
build-only process share the device with other jobs, the candidate's full run has it alone and
finds its build made, and a candidate that does not build never asks for the device alone."""

from __future__ import annotations

import contextlib
import json
import tempfile
from pathlib import Path

import pytest

from kbfuse.candidates.check import check_candidate

FIXTURE = Path(__file__).parent / "candidates" / "cpu"
TASK53 = FIXTURE / "task53_small.py"
SETTINGS = {
    "official_trials": 1,
    "seeds": [0],
    "distributions": ["uniform"],
    "baselines": ["eager"],
    "time_limit_s": 60,
    "memory_limit_mb": 4096,
    "timing": {"warmup": 1, "rounds": 2, "invocations_per_pair": 1},
}


class RecordingLock:
    """Stands in for gpulock.GpuLock: records each hold and which child logs existed when it
    began (so the order of the processes is known)."""

    def __init__(self, logs: Path):
        self.logs, self.events = logs, []

    @contextlib.contextmanager
    def _hold(self, how):
        seen = sorted(p.name.split(".")[1] for p in self.logs.glob("*.log"))
        self.events.append((how, seen))
        yield

    def shared(self):
        return self._hold("shared")

    def alone(self):
        return self._hold("alone")


@pytest.fixture
def scratch_root(tmp_path, monkeypatch):
    root = tmp_path / "tmp"
    root.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(root))
    return root


def test_the_build_shares_the_device_and_the_timed_run_has_it_alone(tmp_path, scratch_root):
    logs = tmp_path / "logs"
    lock = RecordingLock(logs)
    record = check_candidate(
        FIXTURE / "good.py", 2, 53, TASK53, tmp_path / "good.json", SETTINGS, device="cpu",
        keep_scratch=True, log_dir=logs, lock=lock,
    )  # fmt: skip
    assert lock.events == [
        ("shared", []),  # the reference
        ("shared", ["reference"]),  # the candidate's build
        ("alone", ["build", "reference"]),  # the candidate's full run
    ]
    assert record["verdict"] == "pass" and record["failed_checks"] == []
    build, full = record["processes"]["build"], record["processes"]["candidate"]
    assert build["status"] == full["status"] == "exited"
    assert build["returncode"] == full["returncode"] == 0
    assert "kbfuse check: stage build" in build["log_tail"]
    assert "stage correctness" not in build["log_tail"]
    assert "kbfuse check: stage timing" in full["log_tail"]
    (scratch,) = scratch_root.glob("kbfuse-check-*")
    ran = {
        out: json.loads((scratch / "candidate" / out / "runner.json").read_text())["stages_done"]
        for out in ("build", "out")
    }
    assert ran == {"build": ["build"], "out": ["build", "correctness", "guards", "timing"]}


def test_a_candidate_that_does_not_build_is_judged_on_its_build_run(tmp_path, scratch_root):
    logs = tmp_path / "logs"
    lock = RecordingLock(logs)
    record = check_candidate(
        FIXTURE / "probe.py", 2, 53, TASK53, tmp_path / "probe.json", SETTINGS, device="cpu",
        log_dir=logs, lock=lock,
    )  # fmt: skip
    assert [how for how, _ in lock.events] == ["shared", "shared"]  # never alone
    assert record["failed_checks"] == ["build"]
    assert record["failure"]["stage"] == "build"
    assert record["processes"]["build"] is None
    assert record["processes"]["candidate"]["status"] == "exited"
    assert sorted(p.name for p in logs.glob("*.log")) == ["probe.build.log", "probe.reference.log"]
