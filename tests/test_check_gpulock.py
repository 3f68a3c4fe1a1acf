"""How a check holds the GPU lock (kbfuse.candidates.check, sandbox.Handoff, sandbox.Turns):
the reference shares the device with other jobs for each case's device work and writes its
cases holding nothing, the candidate shares it while it builds and runs its cases and has it
alone for its guards and timing, the parent shares it for each case's comparison and reads
the files holding nothing; the parent's wait for the lock is not counted against the
candidate's time limit, and the candidate's processes are stopped meanwhile."""

from __future__ import annotations

import contextlib
import tempfile
import time
from pathlib import Path

from contracts import contract_record

from kbfuse.candidates import compare, readback
from kbfuse.candidates.check import check_candidate

# checked as the pinned KernelBench's task file (the commit it names): the reference's turns
PINNED = "4e6d5c3b" * 5
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
        self.written: list[int] = []  # reference outputs on disk at each event
        self.holding: str | None = None
        self.waited_s = 0.0  # as gpulock.GpuLock counts its waits

    @contextlib.contextmanager
    def _hold(self, how):
        asked = time.perf_counter()
        if how == "alone":
            self.candidate_states = _candidate_process_states(self.logs.parent)
            time.sleep(self.alone_wait_s)
        elif self.shared_waits_s:
            time.sleep(self.shared_waits_s.pop(0))
        self.waited_s += time.perf_counter() - asked
        self.events.append((how, "begin", self._logs()))
        self.written.append(self._reference_outputs())
        self.holding = how
        try:
            yield
        finally:
            self.holding = None
            self.events.append((how, "end", self._logs()))
            self.written.append(self._reference_outputs())

    def _reference_outputs(self) -> int:
        return len(list(self.logs.parent.rglob("reference/out/reference/*.pt")))

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
    parent_calls = []  # what the parent did with the lock held or not
    for module, name in ((readback, "load_tensors"), (compare, "compare_case")):
        real = getattr(module, name)

        def recorded(*args, _real=real, _name=name, **kwargs):
            parent_calls.append((_name, lock.holding))
            return _real(*args, **kwargs)

        monkeypatch.setattr(module, name, recorded)
    record = check_candidate(
        FIXTURE / "good.py", 2, 53, TASK53, tmp_path / "good.json", CONTRACT, SETTINGS,
        device="cpu", log_dir=logs, lock=lock, commit=PINNED,
    )  # fmt: skip
    turn = [("shared", "begin"), ("shared", "end")]
    assert [(how, when) for how, when, _ in lock.events] == [
        *turn * 4,  # the reference: its 3 cases, then the trivial outputs on its trials
        ("shared", "begin"),  # the candidate: build and cases
        ("shared", "end"),
        ("alone", "begin"),  # the candidate: guards and timing
        ("alone", "end"),
        *turn * 4,  # the parent compares the 3 cases and the output after timing, one by one
    ]
    # the reference writes each case's output after its turn, before it asks for the next
    assert lock.written[0:8:2] == [0, 1, 2, 3]
    assert lock.events[8][2] == ["reference"]  # the candidate's process had not started
    assert lock.candidate_states == ["T"]  # stopped while the parent waits for the lock
    # the parent reads both sides' files outside its holds and compares inside them
    assert parent_calls == [
        ("load_tensors", None), ("load_tensors", None), ("compare_case", "shared")
    ] * 4  # fmt: skip
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
        device="cpu", log_dir=logs, lock=lock, commit=PINNED,
    )  # fmt: skip
    # the reference's 4 turns, the candidate's build; no comparison (no output to compare)
    assert [how for how, when, _ in lock.events if when == "begin"] == ["shared"] * 5
    assert record["failed_checks"] == ["build"]
    # only the moments its shared hold took to begin (on a loaded machine, milliseconds); the
    # wait to be alone it never made would be counted here too
    assert 0.0 <= record["processes"]["candidate"]["lock_wait_s"] < 0.5


def test_the_waits_for_the_lock_do_not_count_against_the_time_limit(tmp_path):
    # each child's own run takes a few seconds; with the lock's waits it would pass 12 s: the
    # reference's 4 turns 3.5 s each, the candidate's shared hold 7 s and its alone 7 s
    settings = {**SETTINGS, "time_limit_s": 12}
    lock = RecordingLock(tmp_path / "logs", alone_wait_s=7.0, shared_waits_s=[3.5] * 4 + [7.0])
    record = check_candidate(
        FIXTURE / "good.py", 2, 53, TASK53, tmp_path / "g.json", CONTRACT, settings, device="cpu",
        log_dir=tmp_path / "logs", lock=lock, commit=PINNED,
    )  # fmt: skip
    candidate = record["processes"]["candidate"]
    assert candidate["status"] == "exited" and record["verdict"] == "pass"
    assert candidate["lock_wait_s"] >= 14.0 and candidate["wall_s"] < 12
    # the reference ran 14 s and more with its waits and was not stopped at 12 (a reference
    # that fails raises instead of a verdict)
    assert record["phases_s"]["reference"] >= 14.0
    # the verdict says how much of each step was the wait for the lock
    waits = record["lock_wait_s"]
    assert 14.0 <= waits["reference"] < 15.0 and 14.0 <= waits["candidate"] < 15.0
    assert waits["witness"] == 0.0 and 0.0 <= waits["compare"] < 0.5  # no witness on the CPU
    assert waits["candidate"] <= record["phases_s"]["candidate"]


def test_a_reference_of_unknown_origin_holds_the_lock_for_its_whole_run(tmp_path, monkeypatch):
    """A task file that is not the pin's (no commit) may be anyone's code: it could give a turn
    back and go on using the device, so it gets no turns."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    logs = tmp_path / "logs"
    lock = RecordingLock(logs)
    record = check_candidate(
        FIXTURE / "good.py", 2, 53, TASK53, tmp_path / "good.json", CONTRACT, SETTINGS,
        device="cpu", log_dir=logs, lock=lock,
    )  # fmt: skip
    assert record["verdict"] == "pass" and record["task"]["commit"] is None
    assert [(how, when) for how, when, _ in lock.events][:4] == [
        ("shared", "begin"),  # the reference, its 3 cases written inside the one hold
        ("shared", "end"),
        ("shared", "begin"),  # the candidate
        ("shared", "end"),
    ]
    assert lock.written[:2] == [0, 3]
