"""kbfuse.candidates.check, the parent of a check, with its children played in this process:
the reference child runs the real reference code (kbfuse.candidates.reference) on the small
task 53, the candidate and witness children are stand-ins that leave the files a candidate or
a witness would. So what the parent plans, asks, hides, reads and decides is checked in
milliseconds (these are the tests mutation testing runs on kbfuse.candidates.check; the real
children run in tests/test_check_candidates.py and tests/test_check_hostile.py).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import shutil
import threading
import time
import types
from pathlib import Path

import pytest
import torch
from contracts import contract_record

from kbfuse.candidates import check, evidence, reference, verdict, witness
from kbfuse.candidates.sandbox import Outcome
from kbfuse.errors import KbfuseError

CONTRACT = contract_record(None)  # the test evaluator's: 1e-4, seed 42, 5 trials
JUDGED = {**CONTRACT, "trials": 2}  # with SETTINGS' official_trials
FIXTURE = Path(__file__).parent / "candidates" / "cpu"
TASK53 = FIXTURE / "task53_small.py"
SETTINGS = {
    "official_trials": 2,
    "seeds": [0],
    "distributions": ["uniform"],
    "baselines": ["eager"],
    "memory_limit_mb": 512,
    "time_limit_s": 30,
    "witness_cache": None,
}
GOOD_REPORT = {
    "failure": None,
    "patched": {"after_import": [], "after_calls": []},
    "lazy": [],
    "stages_done": ["build", "correctness", "guards", "timing"],
    "builds": [],
    "ninja": [],
    "skipped_cases": {},
    "timing": {
        "wall": {
            "candidate": {"median_ms": 1.0, "q1_ms": 1.0, "q3_ms": 1.0, "samples_ms": [1.0, 1.0]},
            "eager": {"median_ms": 2.0, "q1_ms": 2.0, "q3_ms": 2.0, "samples_ms": [2.0, 2.0]},
        }
    },
}


class Children:
    """Stands in for sandbox.run_child: the reference child's real code, a candidate that
    returns the reference's outputs changed by `change` (and leaves `report`), a witness that
    leaves `witness`. Records every call (role, request, view, binary, env)."""

    def __init__(self, change=None, report=GOOD_REPORT, witness=None, outcome=None, after=None):
        self.change, self.report, self.witness = change, report, witness
        self.outcome, self.after = outcome or {}, after or {}
        self.calls: list[dict] = []

    def __call__(self, role, request_path, view, limits, log, binary, env=None, handoff=None):
        request = json.loads(Path(request_path).read_text())
        copied = {
            key: Path(request[key]).read_text()
            for key in ("candidate", "task_file")
            if key in request
        }
        self.calls.append(
            {"role": role, "request": request, "view": view, "binary": binary, "env": env,
             "limits": limits, "log": log, "request_path": request_path, "handoff": handoff,
             "copied": copied}
        )  # fmt: skip
        out = Path(request["out"])
        out.mkdir(parents=True, exist_ok=True)
        if role == "reference":  # on the CPU, whatever device the parent names
            run = functools.partial(reference.run_reference, {**request, "device": "cpu"}, out)
            if handoff is None:
                run()
            else:
                _with_turns(handoff, run)
        elif role == "candidate":
            self._candidate(request, out)
        elif self.witness is not None:
            (out / "witness.json").write_text(json.dumps(self.witness))
        if role in self.after:
            self.after[role](out)
        status, code = self.outcome.get(role, ("exited", 0))
        return Outcome(role, status, code, 0.5, 10.0, f"{role} log")

    def _candidate(self, request: dict, out: Path) -> None:
        if self.change is not None:
            reference_request = [c for c in self.calls if c["role"] == "reference"][-1]
            theirs = Path(reference_request["request"]["out"]) / "reference"
            outputs = out / "outputs"
            outputs.mkdir()
            for case in [*request["cases"], {"name": "after_timing"}]:
                source = "official_0" if case["name"] == "after_timing" else case["name"]
                value = self.change(torch.load(theirs / f"{source}.pt"), case["name"])
                if value is not None:
                    torch.save(value, outputs / f"{case['name']}.pt")
        if self.report is not None:
            (out / "runner.json").write_text(json.dumps(self.report))


def _with_turns(turns, work) -> None:
    """What run_child does for a child with sandbox.Turns: ask `waiting()` while it works."""
    turns.start()
    failed = []

    def target():
        try:
            work()
        except BaseException as exc:  # noqa: BLE001 - raised again in the caller's thread
            failed.append(exc)

    thread = threading.Thread(target=target)
    thread.start()
    while thread.is_alive():
        turns.waiting()
        time.sleep(0.001)
    turns.close()
    if failed:
        raise failed[0]


def same(value, name):
    return value


@pytest.fixture
def children(monkeypatch):
    def install(**kwargs) -> Children:
        fake = Children(**kwargs)
        monkeypatch.setattr(check, "run_child", fake)
        return fake

    return install


def judge(tmp_path, settings=None, **kwargs) -> dict:
    candidate = tmp_path / "mine.py"
    candidate.write_text("# kbfuse-task: 2/53\n")
    given = {**SETTINGS, "unsandboxed": True, **(settings or {})}
    return check.check_candidate(
        candidate, 2, 53, TASK53, tmp_path / "out" / "mine.json", CONTRACT, given, device="cpu",
        **kwargs,
    )  # fmt: skip


def test_a_candidate_that_returns_the_reference_passes(tmp_path, children):
    fake = children(change=same)
    record = judge(tmp_path)
    assert record["verdict"] == "pass" and record["failed_checks"] == []
    assert record["sandbox"] == {"used": "none", "version": None}
    assert record["findings"] == ["unsandboxed"]
    assert sorted(record["correctness"]["cases"]) == [
        "after_timing", "official_0", "official_1", "uniform_s0", "weights",
    ]  # fmt: skip
    assert [c["role"] for c in fake.calls] == ["reference", "candidate"]  # no GPU: no witness
    assert json.loads((tmp_path / "out" / "mine.json").read_text()) == record
    assert record["speedup"]["wall"]["over_eager"]["median"] == 2.0
    assert record["processes"]["candidate"]["log_tail"] == "candidate log"
    assert "lock_wait_s" not in record  # no GPU lock, no waits for it


def test_the_waits_for_the_lock_are_read_from_its_count():
    assert check.lock_waited(None) is None
    assert check.lock_waited(types.SimpleNamespace(waited_s=2)) == 2.0
    assert check.lock_waited(types.SimpleNamespace(waited_s="2")) is None
    assert check.lock_waited(types.SimpleNamespace()) is None


def test_the_parent_plans_the_cases_and_the_candidate_is_asked_for_them(tmp_path, children):
    fake = children(change=same)
    judge(tmp_path)
    planned = check.plan({**check.check_settings(None), **SETTINGS}, JUDGED)
    asked = fake.calls[1]["request"]["cases"]
    assert [c["name"] for c in asked] == [c["name"] for c in planned]
    weights = next(c for c in asked if c["name"] == "weights")
    assert weights["perturbed"] == ["gemm.bias", "gemm.weight"]  # the reference's names
    assert all("perturbed" not in c for c in asked if c["name"] != "weights")
    ref = fake.calls[0]["request"]
    assert {k: ref[k] for k in check.PLAN_KEYS} == {"seeds": [0], "distributions": ["uniform"]}
    assert ref["contract"] == JUDGED  # the pinned contract, the settings' 2 trials
    assert (ref["contract"]["atol"], ref["contract"]["trials"]) == (1e-4, 2)
    assert fake.calls[1]["request"]["contract"] == JUDGED


def test_what_each_child_is_given(tmp_path, children):
    fake = children(change=same)
    judge(tmp_path, {"time_limit_s": 12, "memory_limit_mb": 300})
    ref, cand = fake.calls
    for call in fake.calls:
        assert call["limits"] == check.Limits(12, 300)
        assert call["request_path"] == call["view"].folder / "request.json"
        assert call["request"]["out"] == str(call["view"].folder / "out")
        assert call["binary"] is None  # unsandboxed
        assert call["log"] == tmp_path / "out" / f"mine.{call['role']}.log"
        hidden = call["view"].hidden
        assert call["view"].folder.parent in hidden and tmp_path / "out" in hidden
    assert ref["view"].folder.name == "reference" and cand["view"].folder.name == "candidate"
    assert ref["request"]["task_file"].endswith("reference/task.py")
    request = cand["request"]
    assert request["candidate"].endswith("candidate/candidate.py")
    assert request["task_file"].endswith("candidate/task.py")
    assert "inputs_dir" not in request  # it draws each case's inputs itself
    assert request["contract"]["seed"] == 42 and request["baselines"] == ["eager"]
    assert request["gpu_memory_fraction"] == 0.5 and request["handoff"] is None
    assert request["timing"]["rounds"] == 20


def test_sandboxed_the_candidate_sees_nothing_of_the_reference(tmp_path, children, monkeypatch):
    monkeypatch.setattr(check.bwrap, "require", lambda: ("/bin/bwrap", "bubblewrap 9"))
    fake = Children(change=None, report=None)
    monkeypatch.setattr(check, "run_child", fake)
    record = judge(tmp_path, {"unsandboxed": False})
    assert record["sandbox"] == {"used": "bwrap", "version": "bubblewrap 9"}
    cand = fake.calls[1]
    assert cand["binary"] == "/bin/bwrap"
    assert "inputs_dir" not in cand["request"]
    assert cand["view"].writable == () and cand["view"].folder.name == "candidate"
    assert record["report_problem"] == "runner.json was not written"
    assert record["checks"]["build"]["status"] == "fail"


def test_a_wrong_output_fails_its_case_and_a_missing_one_fails_as_no_output(tmp_path, children):
    def change(value, name):
        if name == "uniform_s0":
            return None
        return value + 1 if name == "official_1" else value

    children(change=change)
    record = judge(tmp_path)
    cases = record["correctness"]["cases"]
    assert cases["official_1"]["official_pass"] is False
    assert cases["uniform_s0"] == {"numel": 1024, "problem": "no output", "official_pass": False}
    assert record["failed_checks"] == ["official", "distributions"]
    assert record["verdict"] == "fail"


def test_reported_other_inputs_name_a_failing_case_and_decide_nothing(tmp_path, children):
    """The candidate's report of the inputs it drew is compared with the reference's digests:
    it only explains a failing case; right outputs pass whatever it says."""
    other = {"official_1": "0" * 64, "weights": "0" * 64}
    (tmp_path / "right").mkdir()
    (tmp_path / "wrong").mkdir()
    children(change=same, report={**GOOD_REPORT, "inputs_sha256": other})
    record = judge(tmp_path / "right")
    assert record["verdict"] == "pass"
    assert record["correctness"]["inputs_differ"] == ["official_1", "weights"]
    children(
        change=lambda value, name: value + 1 if name == "official_1" else value,
        report={**GOOD_REPORT, "inputs_sha256": other},
    )
    record = judge(tmp_path / "wrong")
    assert record["failed_checks"] == ["official"]
    assert record["checks"]["official"]["detail"].endswith(
        "; the candidate's process reports other inputs for official_1: its import changed "
        "how the task draws them (self-reported))"
    )
    assert record["checks"]["changed_weights"]["status"] == "pass"


def test_a_malformed_inputs_digest_makes_the_report_unusable(tmp_path, children):
    children(change=same, report={**GOOD_REPORT, "inputs_sha256": {"official_0": "xyz"}})
    record = judge(tmp_path)
    assert record["report_problem"].startswith("field inputs_sha256.official_0: 'xyz' does not")
    assert record["failed_checks"] == ["build"]


def test_after_a_failure_missing_outputs_are_not_run_not_failed(tmp_path, children):
    report = {**GOOD_REPORT, "failure": {"stage": "correctness", "error": "E", "message": "m"}}
    children(change=lambda value, name: value if name == "official_0" else None, report=report)
    record = judge(tmp_path)
    assert sorted(record["correctness"]["cases"]) == ["official_0"]
    assert record["failed_checks"] == ["runtime_error"]
    assert record["checks"]["distributions"]["status"] == "not_run"
    assert record["verdict"] == "fail"


@pytest.mark.parametrize("status, code", [("exited", 3), ("time_limit", -9)])
def test_a_process_that_did_not_end_well_leaves_missing_outputs_not_run(
    tmp_path, children, status, code
):
    children(change=lambda v, n: None, outcome={"candidate": (status, code)})
    record = judge(tmp_path)
    assert record["correctness"]["cases"] == {}
    assert record["verdict"] == "fail"


def test_an_unusable_report_fails_the_build_and_is_not_used(tmp_path, children):
    report = {**GOOD_REPORT, "builds": [{"route": "torch.utils.cpp_extension.load_inline"}]}
    children(change=same, report=report)
    record = judge(tmp_path)
    assert record["report_problem"].startswith("field builds.0: 'extra_cuda_cflags' is a")
    assert record["failed_checks"] == ["build"]
    assert record["timing"] is None and record["guards"] is None


def test_timing_that_does_not_pair_makes_the_report_unusable(tmp_path, children):
    timing = json.loads(json.dumps(GOOD_REPORT["timing"]))
    timing["wall"]["eager"]["samples_ms"] = [2.0]
    children(change=same, report={**GOOD_REPORT, "timing": timing})
    record = judge(tmp_path)
    assert record["report_problem"].startswith("its timing does not pair: paired_ratios: 1 ")
    assert record["speedup"] is None


def test_a_failing_reference_is_a_harness_error_naming_it(tmp_path, children):
    children(change=same, outcome={"reference": ("time_limit", -9)})
    with pytest.raises(
        KbfuseError, match=r"the reference process for .*failed \(time_limit, exit -9\)"
    ):
        judge(tmp_path)
    assert not (tmp_path / "out" / "mine.json").exists()


def test_a_reference_whose_cases_are_not_the_plan_is_refused(tmp_path, children, monkeypatch):
    planned = reference.build_cases
    monkeypatch.setattr(reference, "build_cases", lambda request: planned(request)[:-1])
    children(change=same)
    with pytest.raises(KbfuseError, match=r"cases \['official_0', .*\] are not the plan"):
        judge(tmp_path)


def test_reference_cases_without_the_changed_parameters_are_refused(tmp_path):
    planned = check.plan({**check.check_settings(None), **SETTINGS}, JUDGED)
    folder = tmp_path / "reference"
    (folder / "out").mkdir(parents=True)
    bare = [{k: v for k, v in c.items() if k != "perturbed"} for c in planned]
    (folder / "out" / "cases.json").write_text(json.dumps(bare))
    with pytest.raises(KbfuseError, match="reference process's weights case names no parameters"):
        check._reference_cases(planned, folder / "out", folder)
    bare[2]["perturbed"] = ["w", 3]
    (folder / "out" / "cases.json").write_text(json.dumps(bare))
    with pytest.raises(KbfuseError, match="names no parameters"):
        check._reference_cases(planned, folder / "out", folder)
    (folder / "out" / "cases.json").write_text(json.dumps([1, 2]))
    with pytest.raises(KbfuseError, match=r"cases None are not the plan"):
        check._reference_cases(planned, folder / "out", folder)


def test_logs_of_an_earlier_run_go_and_the_scratch_folder_is_removed(tmp_path, children, capsys):
    (tmp_path / "out").mkdir()
    stale = tmp_path / "out" / "mine.witness.log"
    stale.write_text("old")
    fake = children(change=same)
    judge(tmp_path)
    assert not stale.exists()
    root = fake.calls[0]["view"].folder.parent
    assert not root.exists() and root.name.startswith("kbfuse-check-")
    judge(tmp_path, keep_scratch=True)
    kept = fake.calls[-1]["view"].folder.parent
    assert kept.is_dir() and f"scratch kept: {kept}" in capsys.readouterr().out
    shutil.rmtree(kept)


def test_logs_go_where_asked_and_the_lock_folder_is_hidden(tmp_path, children, monkeypatch):
    monkeypatch.setenv("KBFUSE_GPU_LOCK_DIR", str(tmp_path))
    fake = children(change=same)
    judge(tmp_path, log_dir=tmp_path / "logs")
    assert fake.calls[0]["log"] == tmp_path / "logs" / "mine.reference.log"
    assert tmp_path in fake.calls[0]["view"].hidden
    assert tmp_path / "logs" in fake.calls[1]["view"].hidden


def test_inputs_that_are_refused_before_any_child(tmp_path, children):
    fake = children(change=same)
    with pytest.raises(KbfuseError, match=r"candidate file \S+nope\.py does not exist"):
        check.check_candidate(
            tmp_path / "nope.py", 2, 53, TASK53, tmp_path / "v.json", CONTRACT, SETTINGS
        )
    big = tmp_path / "big.py"
    big.write_bytes(b"#")
    os.truncate(big, check.CANDIDATE_BYTES + 1)
    with pytest.raises(KbfuseError, match=r"candidate file \S+big\.py is over 16777216 bytes"):
        check.check_candidate(big, 2, 53, TASK53, tmp_path / "v.json", CONTRACT, SETTINGS)
    long = tmp_path / ("v" * 250 + ".json")
    with pytest.raises(KbfuseError, match="too long for its log and temporary files"):
        check.check_candidate(TASK53, 2, 53, TASK53, long, CONTRACT, SETTINGS)
    assert fake.calls == []


def test_without_bwrap_and_not_unsandboxed_nothing_runs(tmp_path, children, monkeypatch):
    monkeypatch.setenv("KBFUSE_BWRAP", str(tmp_path / "none"))
    fake = children(change=same)
    with pytest.raises(KbfuseError, match="is not an executable file: install bubblewrap"):
        judge(tmp_path, {"unsandboxed": False})
    assert fake.calls == []


# ---------------------------------------------------------------- the witness


def _scratch(tmp_path: Path, device: str = "cuda") -> check.Scratch:
    return check.Scratch(tmp_path, None, device, check.Limits(5, 100), (tmp_path / "hidden",))


LOAD_INLINE = "torch.utils.cpp_extension.load_inline"
BUILDS = {"builds": [{"route": LOAD_INLINE, "extra_cuda_cflags": ["-O3"], "extra_cflags": []}]}


def test_the_witness_measures_the_reported_flags_on_a_gpu_only(tmp_path, monkeypatch):
    witness = [{"route": "load_inline", "flags": ["-O3"], "effective_ftz": True, "output": 0.0}]
    fake = Children(witness=witness)
    monkeypatch.setattr(check, "run_child", fake)
    settings = {"witness_cache": None}
    assert check.run_witness(
        settings, BUILDS, _scratch(tmp_path, "cpu"), tmp_path / "w.log", None
    ) == (None, None)
    assert check.run_witness(settings, {}, _scratch(tmp_path), tmp_path / "w.log", None) == (
        None,
        None,
    )
    found, outcome = check.run_witness(
        settings, BUILDS, _scratch(tmp_path), tmp_path / "w.log", None
    )
    assert found == witness and outcome.role == "witness"
    assert fake.calls[0]["request"]["builds"] == [{"route": "load_inline", "flags": ["-O3"]}]
    assert fake.calls[0]["view"].gpu is True and fake.calls[0]["env"] is None


@pytest.mark.parametrize("witness", [{"x": 1}, [{"effective_ftz": "yes"}], ["x"]])
def test_a_malformed_witness_file_is_no_measurement(tmp_path, monkeypatch, witness):
    monkeypatch.setattr(check, "run_child", Children(witness=witness))
    found, outcome = check.run_witness(
        {"witness_cache": None}, BUILDS, _scratch(tmp_path), tmp_path / "w", None
    )
    assert found is None and outcome.status == "exited"


def test_the_shared_witness_cache_is_writable_one_flag_set_at_a_time(tmp_path, monkeypatch):
    fake = Children(witness=[])
    monkeypatch.setattr(check, "run_child", fake)
    cache = tmp_path / "cache"
    check.run_witness(
        {"witness_cache": str(cache)}, BUILDS, _scratch(tmp_path), tmp_path / "w", None
    )
    call = fake.calls[0]
    assert call["env"] == {"TORCH_EXTENSIONS_DIR": str(cache.resolve())}
    (folder,) = call["view"].writable
    assert folder.parent == cache.resolve() and folder.name.startswith("kbfuse_witness_")
    assert folder.is_dir()
    env, writable = check.witness_env(
        {"witness_cache": str(cache)}, [{"route": "cupy", "options": []}]
    )
    assert env is not None and writable == []
    assert check.witness_env({"witness_cache": None}, [{"route": "load_inline", "flags": []}]) == (
        None,
        [],
    )


class RecordingLock:
    """A GPU lock that records whether each child ran while it was held shared."""

    def __init__(self):
        self.held = False

    @contextlib.contextmanager
    def shared(self):
        self.held = True
        yield
        self.held = False


def _witness_children(lock: RecordingLock):
    """Children that record (build_only, lock held) for each witness child."""
    runs = []
    fake = Children(witness=[])

    def child(role, request_path, *args, **kwargs):
        request = json.loads(Path(request_path).read_text())
        runs.append((bool(request.get("build_only")), lock.held))
        return fake(role, request_path, *args, **kwargs)

    return child, runs


def test_the_witness_builds_outside_the_lock_and_measures_under_it(tmp_path, monkeypatch):
    lock = RecordingLock()
    child, runs = _witness_children(lock)
    monkeypatch.setattr(check, "run_child", child)
    check.run_witness({"witness_cache": None}, BUILDS, _scratch(tmp_path), tmp_path / "w", lock)
    assert runs == [(True, False), (False, True)]


def test_a_witness_the_shared_cache_has_is_only_measured(tmp_path, monkeypatch):
    lock = RecordingLock()
    child, runs = _witness_children(lock)
    monkeypatch.setattr(check, "run_child", child)
    settings = {"witness_cache": str(tmp_path / "cache")}
    name = witness.extension_name(["-O3"])
    assert not check.witness_built(settings, [{"route": "load_inline", "flags": ["-O3"]}])
    (tmp_path / "cache" / name).mkdir(parents=True)
    (tmp_path / "cache" / name / f"{name}.so").write_bytes(b"")
    assert check.witness_built(settings, [{"route": "load_inline", "flags": ["-O3"]}])
    assert not check.witness_built(settings, [{"route": "load_inline", "flags": ["-O2"]}])
    check.run_witness(settings, BUILDS, _scratch(tmp_path), tmp_path / "w", lock)
    assert runs == [(False, True)]


def test_a_cupy_witness_has_nothing_to_build_first():
    cupy = [{"route": "cupy.RawKernel", "options": []}]
    assert check.witness_built({"witness_cache": None}, cupy)
    assert not check.witness_built({"witness_cache": None}, [{"route": "load_inline", "flags": []}])


def test_the_build_only_witness_builds_each_torch_flag_set_and_measures_nothing(
    tmp_path, monkeypatch
):
    built = []
    monkeypatch.setattr(witness, "_torch_module", built.append)
    monkeypatch.setattr(witness, "_cupy_witness", lambda options: pytest.fail("measured"))
    builds = [
        {"route": "load_inline", "flags": ["-O3"]},
        {"route": "cupy.RawKernel", "options": []},
        {"route": "load_inline", "flags": ["--use_fast_math"]},
    ]
    witness.run_witness({"builds": builds, "build_only": True}, tmp_path / "out")
    assert built == [["-O3"], ["--use_fast_math"]]
    assert not (tmp_path / "out").exists()


# ---------------------------------------------------------------- small helpers


def test_the_task_file_is_found_only_when_one_matches(tmp_path):
    folder = tmp_path / "KernelBench" / "level2"
    folder.mkdir(parents=True)
    (folder / "53_Gemm.py").write_text("")
    assert check.find_task_file(tmp_path, 2, 53) == folder / "53_Gemm.py"
    with pytest.raises(KbfuseError, match=r"task 2/5: 0 files match \S+/5_\*\.py \(need one\)"):
        check.find_task_file(tmp_path, 2, 5)
    (folder / "53_Other.py").write_text("")
    with pytest.raises(KbfuseError, match=r"task 2/53: 2 files match"):
        check.find_task_file(tmp_path, 2, 53)


def test_the_checkout_commit_or_none(tmp_path):
    assert check.checkout_commit(tmp_path / "nowhere") is None
    root = Path(__file__).resolve().parents[1]
    commit = check.checkout_commit(root)
    assert commit is None or (len(commit) == 40 and all(c in "0123456789abcdef" for c in commit))


def test_the_device_is_the_cpu_without_a_gpu():
    assert check.default_device() == ("cuda" if torch.cuda.is_available() else "cpu")


def test_the_record_names_what_is_self_reported(tmp_path, children):
    children(change=same)
    record = judge(tmp_path)
    assert record["self_reported"] == evidence.SELF_REPORTED
    assert set(record["self_reported"]["checks"]) <= set(verdict.CHECKS)


# ---------------------------------------------------------------- what mutation testing found open


def _error(out: Path) -> None:
    (out / "error.json").write_text(json.dumps({"error": "ImportError", "message": "no task"}))


def test_a_reference_that_exits_with_an_error_is_named_with_it(tmp_path, children):
    children(change=same, outcome={"reference": ("exited", 1)}, after={"reference": _error})
    with pytest.raises(
        KbfuseError,
        match=r"the reference process for \S+task53_small\.py failed \(exited, exit 1\): "
        r"ImportError: no task; log: \S+mine\.reference\.log$",
    ):
        judge(tmp_path)


def test_a_reference_killed_with_status_zero_is_still_a_failure(tmp_path, children):
    children(change=same, outcome={"reference": ("memory_limit", 0)})
    with pytest.raises(KbfuseError, match=r"failed \(memory_limit, exit 0\): None: None"):
        judge(tmp_path)


@pytest.mark.parametrize("name", ["cases.json", "reference.json"])
def test_a_reference_record_that_is_a_link_is_refused(tmp_path, children, name):
    def link(out: Path) -> None:
        elsewhere = out.parent / f"elsewhere-{name}"
        (out / name).rename(elsewhere)
        (out / name).symlink_to(elsewhere)

    children(change=same, after={"reference": link})
    with pytest.raises(KbfuseError, match=rf"{name} is a symbolic link, not a regular file"):
        judge(tmp_path)


def test_the_trivial_status_and_the_task_come_from_the_reference_and_the_file(tmp_path, children):
    children(change=same)
    record = judge(tmp_path, commit="c" * 40)
    assert record["trivial_source"] == "computed by the reference process"
    assert record["trivial"]["zeros"] == {"applicable": True, "passes": False}
    assert record["trivial"]["compared"] == "eager output on KernelBench's 2 official trials"
    assert record["official"] == {
        "atol": 1e-4, "rtol": 1e-4, "source": CONTRACT["tolerance_source"]["atol"],
        "argument_order": ["reference", "candidate"], "seed": 42, "trials": 2,
        "contract_commit": None,
    }  # fmt: skip
    assert record["task"] == {
        "level": 2,
        "task": 53,
        "file": "task53_small.py",
        "sha256": check.sha256_file(TASK53),
        "commit": "c" * 40,
    }
    assert record["candidate"]["file"] == "mine.py"
    assert record["environment"]["device"] == "cpu"


def test_a_survey_record_gives_the_trivial_status(tmp_path, children):
    children(change=same)
    survey = tmp_path / "53.json"
    spots = {"zeros": {"passes": True}, "mean_constant": {"passes": False}}
    survey.write_text(json.dumps({"blind_spots": spots, "blind_spot": True}))
    record = judge(tmp_path, survey=survey)
    assert record["trivial_source"] == "survey record 53.json"
    assert "blind_spot" in record["findings"]


def test_without_a_usable_report_missing_outputs_are_not_counted(tmp_path, children):
    children(change=None, report=None)
    record = judge(tmp_path)
    assert record["correctness"]["cases"] == {}
    assert record["report_problem"] == "runner.json was not written"
    assert record["failed_checks"] == ["build"]


def test_a_weights_case_the_report_skips_is_not_applicable(tmp_path, children):
    report = {**GOOD_REPORT, "skipped_cases": {"weights": "named differently"}}
    children(change=lambda value, name: None if name == "weights" else value, report=report)
    record = judge(tmp_path)
    assert record["checks"]["changed_weights"] == {
        "status": "not_applicable",
        "detail": "named differently",
    }
    assert "weights" not in record["correctness"]["cases"]
    assert record["verdict"] == "pass"


def test_a_reference_larger_than_the_memory_limit_is_refused(tmp_path, children, monkeypatch):
    children(change=same)
    original = check.evidence.compare_all

    def spy(cases, reference, candidate, tolerance, reference_limit, expected, skipped, device,
            hold):  # fmt: skip
        spy.limit = reference_limit
        return original(
            cases, reference, candidate, tolerance, reference_limit, expected, skipped, device,
            hold,
        )  # fmt: skip

    monkeypatch.setattr(check.evidence, "compare_all", spy)
    judge(tmp_path, {"memory_limit_mb": 300})
    assert spy.limit == 300 << 20


def test_with_a_gpu_lock_the_candidate_gets_the_handoff_and_the_reference_shares(
    tmp_path, children
):
    held = []

    class Lock:
        path = tmp_path / "locks" / "kbfuse-gpu-x.lock"

        def shared(self):
            held.append("shared")
            return check.contextlib.nullcontext()

        def alone(self):
            held.append("alone")
            return check.contextlib.nullcontext()

    fake = children(change=same)
    lock = Lock()
    judge(tmp_path, lock=lock, commit="4e6d5c3b" * 5)  # the pinned task file
    # the reference's turns (its 4 cases and the trivial outputs), then the comparison of
    # each of the 4 cases and the output after timing; the candidate's holds are its Handoff's
    assert held == ["shared"] * 10
    ref, cand = fake.calls
    assert isinstance(ref["handoff"], check.Turns) and ref["handoff"].lock is lock
    assert ref["request"]["turns"] == {"folder": str(ref["view"].folder)}
    folder = cand["view"].folder
    assert cand["request"]["handoff"] == {
        "request": str(folder / "alone.request"),
        "granted": str(folder / "alone.granted"),
    }
    assert tmp_path / "locks" in cand["view"].hidden
    assert tmp_path / "locks" in ref["view"].hidden
    # a task file of unknown origin (no commit): no turns, one hold for the reference's run
    held.clear()
    fake = children(change=same)
    (tmp_path / "unknown").mkdir()
    judge(tmp_path / "unknown", lock=lock)
    assert held == ["shared"] * 6 and fake.calls[0]["handoff"] is None
    assert fake.calls[0]["request"]["turns"] is None


def test_on_a_gpu_every_child_is_shown_the_device(tmp_path, monkeypatch):
    fake = Children(change=None, report=None, witness=[])
    monkeypatch.setattr(check, "run_child", fake)
    scratch = _scratch(tmp_path)
    outcome = scratch.child("witness", {"builds": []}, tmp_path / "w.log", env={"A": "1"})
    call = fake.calls[0]
    assert outcome.role == "witness" and call["env"] == {"A": "1"}
    assert call["view"].gpu is True and call["view"].hidden == (tmp_path / "hidden",)
    assert call["view"].writable == ()
    cpu = _scratch(tmp_path / "cpu", "cpu")
    (tmp_path / "cpu").mkdir()
    cpu.child("witness", {"builds": []}, tmp_path / "w2.log")
    assert fake.calls[1]["view"].gpu is False


def test_the_candidate_and_task_files_are_copied_where_the_request_says(tmp_path, children):
    fake = children(change=same)
    judge(tmp_path)
    ref, cand = fake.calls
    assert cand["copied"] == {"candidate": "# kbfuse-task: 2/53\n", "task_file": TASK53.read_text()}
    assert ref["copied"] == {"task_file": TASK53.read_text()}
    assert cand["request"]["device"] == "cpu" and ref["request"]["device"] == "cpu"
    assert cand["handoff"] is None and ref["handoff"] is None
    assert ref["request"]["turns"] is None


def test_a_lock_is_held_for_the_candidate_through_its_handoff(tmp_path, children):
    class Lock:
        path = tmp_path / "locks" / "x.lock"

        def shared(self):
            return check.contextlib.nullcontext()

        alone = shared

    lock = Lock()
    fake = children(change=same)
    judge(tmp_path, lock=lock)
    handoff = fake.calls[1]["handoff"]
    assert handoff is not None and handoff.lock is lock
    assert handoff.request == fake.calls[1]["view"].folder / "alone.request"


def test_on_a_gpu_the_witness_measures_what_the_candidate_built(tmp_path, monkeypatch):
    monkeypatch.setattr(evidence, "_environment", lambda device: {"torch": "x", "device": device})
    witness = [{"route": "load_inline", "flags": ["-O3"], "output": 0.0, "effective_ftz": True}]
    report = {**GOOD_REPORT, **BUILDS, "side_stream": None, "unfinished_on_caller_stream": None}
    fake = Children(change=same, report=report, witness=witness)
    monkeypatch.setattr(check, "run_child", fake)
    record = judge(tmp_path, {"witness_cache": str(tmp_path / "cache")})
    roles = [c["role"] for c in fake.calls]
    assert roles == ["reference", "candidate"]  # judged on the CPU: no witness
    candidate = tmp_path / "mine.py"
    out = tmp_path / "gpu" / "mine.json"
    settings = {**SETTINGS, "unsandboxed": True, "witness_cache": str(tmp_path / "cache")}
    # this machine has no GPU: the parent's comparison, which would run on it, runs here
    original = evidence.compare.compare_case
    monkeypatch.setattr(
        evidence.compare, "compare_case", lambda ref, cand, contract, device: original(
            ref, cand, contract)
    )  # fmt: skip
    record = check.check_candidate(candidate, 2, 53, TASK53, out, CONTRACT, settings, device="cuda")
    call = fake.calls[-1]
    assert call["role"] == "witness" and call["view"].gpu is True
    assert call["log"] == out.parent / "mine.witness.log"
    assert call["env"] == {"TORCH_EXTENSIONS_DIR": str((tmp_path / "cache").resolve())}
    assert record["environment"]["device"] == "cuda"
    assert record["contract"]["witness"] == witness
    assert record["contract"]["effective_ftz"] is True and "ftz_effective" in record["findings"]
    assert record["processes"]["witness"]["role"] == "witness"


def test_a_witness_that_keeps_subnormals_is_a_measurement(tmp_path, monkeypatch):
    kept = [{"route": "load_inline", "flags": ["-O3"], "effective_ftz": False}]
    monkeypatch.setattr(check, "run_child", Children(witness=kept))
    found, _ = check.run_witness(
        {"witness_cache": None}, BUILDS, _scratch(tmp_path), tmp_path / "w", None
    )
    assert found == kept


def test_a_report_without_lazy_findings_or_with_baselines_is_recorded_as_it_says(
    tmp_path, children
):
    report = {k: v for k, v in GOOD_REPORT.items() if k != "lazy"}
    report["baselines"] = {"eager": {"status": "ok", "build_s": 0.1}}
    children(change=same, report=report)
    record = judge(tmp_path)
    assert record["guards"]["lazy"] == []
    assert record["baselines"] == {"eager": {"status": "ok", "build_s": 0.1}}
    report["failure"] = {"stage": "timing", "error": "E", "message": "m", "traceback": "t"}
    children(change=same, report=report)
    record = judge(tmp_path)
    assert record["failure"] == {"stage": "timing", "error": "E", "message": "m"}


def test_a_missing_report_is_named_in_the_build_check(tmp_path, children):
    children(change=same, report=None)
    record = judge(tmp_path)
    assert record["checks"]["build"] == {
        "status": "fail",
        "detail": "no usable report from its process: runner.json was not written",
    }


def test_a_linked_folder_in_a_childs_output_is_never_followed(tmp_path, children):
    def link_out(out: Path) -> None:
        real = out.parent / "real-out"
        out.rename(real)
        out.symlink_to(real)

    children(change=same, after={"candidate": link_out})
    record = judge(tmp_path)
    assert record["report_problem"].endswith("/out is a symbolic link, not a folder; not read")
    children(change=same, after={"reference": link_out})
    with pytest.raises(KbfuseError, match=r"/out is a symbolic link, not a folder; not read"):
        judge(tmp_path)


def test_the_size_and_name_limits_are_inclusive(tmp_path, children):
    children(change=same)
    edge = tmp_path / "edge.py"
    edge.write_text("#")
    os.truncate(edge, check.CANDIDATE_BYTES)
    out = tmp_path / "o" / ("v" * check.MAX_STEM_BYTES + ".json")
    settings = {**SETTINGS, "unsandboxed": True}
    assert check.check_candidate(edge, 2, 53, TASK53, out, CONTRACT, settings, device="cpu")[
        "verdict"
    ]
    assert out.is_file()
    with pytest.raises(
        KbfuseError, match=r"^task file \S+none\.py does not exist or is not a file$"
    ):
        check.check_candidate(
            edge, 2, 53, tmp_path / "none.py", out, CONTRACT, settings, device="cpu"
        )
    long = tmp_path / ("v" * (check.MAX_STEM_BYTES + 1) + ".json")
    with pytest.raises(KbfuseError, match=rf"^verdict '{tmp_path}/v+\.json': its name is over 200"):
        check.check_candidate(edge, 2, 53, TASK53, long, CONTRACT, settings, device="cpu")
