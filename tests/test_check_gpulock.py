"""How a check holds the GPU lock (kbfuse.candidates.check, sandbox.Handoff): the reference
shares the device with other jobs, the candidate shares it while it builds and runs its cases
and has it alone for its guards and timing; the parent's wait for the lock is not counted
against the candidate's time limit, and the candidate's processes are stopped meanwhile."""

from __future__ import annotations

import contextlib
import tempfile
import time
from pathlib import Path

from contracts import contract_record

from kbfuse.candidates.check import check_candidate

CONTRACT = contract_record(None)  # the test evaluator's: 1e-4, seed 42, 5 trials
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


def _candidate_process_states(root: Path) -> list[str]:
    """The state letter (/proc/PID/stat) of every candidate child process working under
    `root` (not another test's, running beside this one), bwrap's own processes left out."""
    states = []
    for proc in Path("/proc").iterdir():
        try:
            command = (proc / "cmdline").read_bytes().split(b"\0")
            cwd = (proc / "cwd").resolve()
            stat = (proc / "stat").read_text()
        except OSError:
            continue
        sandbox = command[0].endswith(b"bwrap")  # bwrap itself, outside and as init inside
        child = b"kbfuse.candidates.child" in command and b"candidate" in command and not sandbox
        if child and cwd.is_relative_to(root):
            states.append(stat.rsplit(")", 1)[1].split()[0])
    return states


class RecordingLock:
    """Stands in for gpulock.GpuLock: records each hold, when it began and ended, and which
    child logs existed then; `alone_wait_s` makes asking to be alone take that long (another
    job timing)."""

    def __init__(self, logs: Path, alone_wait_s: float = 0.0, shared_waits_s=()):
        self.logs, self.alone_wait_s = logs, alone_wait_s
        self.shared_waits_s = list(shared_waits_s)  # one per shared hold, in order
        self.events: list[tuple[str, str, list[str]]] = []

    @contextlib.contextmanager
    def _hold(self, how):
        if how == "alone":
            self.candidate_states = _candidate_process_states(self.logs.parent)
            time.sleep(self.alone_wait_s)
        elif self.shared_waits_s:
            time.sleep(self.shared_waits_s.pop(0))
        self.events.append((how, "begin", self._logs()))
        try:
            yield
        finally:
            self.events.append((how, "end", self._logs()))

    def _logs(self) -> list[str]:
        return sorted(p.name.split(".")[1] for p in self.logs.glob("*.log"))

    def shared(self):
        return self._hold("shared")

    def alone(self):
        return self._hold("alone")


def test_the_candidate_shares_the_device_until_its_guards_and_times_it_alone(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the scratch folder here
    logs = tmp_path / "logs"
    lock = RecordingLock(logs, alone_wait_s=3.0)
    record = check_candidate(
        FIXTURE / "good.py", 2, 53, TASK53, tmp_path / "good.json", CONTRACT, SETTINGS,
        device="cpu", log_dir=logs, lock=lock,
    )  # fmt: skip
    assert [(how, when) for how, when, _ in lock.events] == [
        ("shared", "begin"),  # the reference
        ("shared", "end"),
        ("shared", "begin"),  # the candidate: build and cases
        ("shared", "end"),
        ("alone", "begin"),  # the candidate: guards and timing
        ("alone", "end"),
        ("shared", "begin"),  # the parent compares the cases on the device
        ("shared", "end"),
    ]
    assert lock.events[2][2] == ["reference"]  # the candidate's process had not started
    assert lock.candidate_states == ["T"]  # stopped while the parent waits for the lock
    assert record["verdict"] == "pass" and record["failed_checks"] == []
    candidate = record["processes"]["candidate"]
    log = candidate["log_tail"]
    order = [log.index(f"kbfuse check: {line}") for line in
             ("stage correctness", "stage guards", "the GPU alone", "stage timing")]  # fmt: skip
    assert order == sorted(order)
    # the three seconds the parent waited for the lock are not the candidate's time
    assert 3.0 <= candidate["lock_wait_s"] < 6.0
    assert candidate["wall_s"] > 0


def test_a_candidate_that_does_not_build_never_asks_for_the_device_alone(tmp_path):
    logs = tmp_path / "logs"
    lock = RecordingLock(logs)
    record = check_candidate(
        FIXTURE / "probe.py", 2, 53, TASK53, tmp_path / "probe.json", CONTRACT, SETTINGS,
        device="cpu", log_dir=logs, lock=lock,
    )  # fmt: skip
    # the reference, the candidate's build, the comparison (of nothing: no output)
    assert [how for how, when, _ in lock.events if when == "begin"] == ["shared"] * 3
    assert record["failed_checks"] == ["build"]
    # only the moments its shared hold took to begin (on a loaded machine, milliseconds); the
    # wait to be alone it never made would be counted here too
    assert 0.0 <= record["processes"]["candidate"]["lock_wait_s"] < 0.5


def test_the_waits_for_the_lock_do_not_count_against_the_time_limit(tmp_path):
    # the candidate's own run takes a few seconds; with the lock's 7 + 7 s it would pass 12 s
    settings = {**SETTINGS, "time_limit_s": 12}
    lock = RecordingLock(tmp_path / "logs", alone_wait_s=7.0, shared_waits_s=[0.0, 7.0])
    record = check_candidate(
        FIXTURE / "good.py", 2, 53, TASK53, tmp_path / "g.json", CONTRACT, settings, device="cpu",
        log_dir=tmp_path / "logs", lock=lock,
    )  # fmt: skip
    candidate = record["processes"]["candidate"]
    assert candidate["status"] == "exited" and record["verdict"] == "pass"
    assert candidate["lock_wait_s"] >= 14.0 and candidate["wall_s"] < 12
