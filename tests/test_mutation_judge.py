"""Four bugs planted in the judge, each caught by a CPU test here, and bug shapes mutmut cannot
make (a dropped condition, a removed tuple element, `all` for `any`):

1. a failed guard check (timer_patched, lazy_result, side_stream, ...) that no longer fails
   the verdict, though `failed_checks` still lists it;
2. rtol x10 in the comparison while the record still says the old value;
3. `effective_ftz` taken with `all` instead of `any` over the witness builds;
4. a case summary (kbfuse.checks.cases.assemble) that keeps only the first failing check.

Each check is a function; its test runs it on the real code, and a second test plants the
bug (monkeypatch) and shows the same function fails on it.
"""

from __future__ import annotations

import builtins
from pathlib import Path

import pytest
import torch
from contracts import contract

from kbfuse.candidates import evidence, verdict
from kbfuse.candidates.sandbox import Outcome
from kbfuse.candidates.summary import verdict_row
from kbfuse.checks import cases as checks_cases

JUDGE = contract()  # the pin's: atol = rtol = 1e-4, torch.allclose(reference, candidate)
TOLERANCE = (JUDGE["atol"], JUDGE["rtol"])

# --------------------------------------------------------------------------- 1. the verdict


def _checks(**status) -> dict:
    return {n: {"status": status.get(n, "pass"), "detail": ""} for n in verdict.CHECKS}


def every_failed_or_unrun_check_fails_the_verdict(decide) -> None:
    assert decide(_checks()) == ("pass", [])
    assert decide(_checks(side_stream="not_applicable", changed_weights="not_applicable")) == (
        "pass",
        [],
    )
    for name in verdict.CHECKS:
        assert decide(_checks(**{name: "fail"})) == ("fail", [name]), name
        assert decide(_checks(**{name: "not_run"})) == ("fail", []), name


def test_every_failed_or_unrun_check_fails_the_verdict():
    every_failed_or_unrun_check_fails_the_verdict(verdict.decide)


def test_planted_a_guard_failure_that_does_not_fail_the_verdict_is_caught():
    def planted(checks):
        quiet = {**checks, **{g: {"status": "pass"} for g in verdict.GUARD_CHECKS}}
        result, _ = verdict.decide(quiet)
        return result, [n for n in verdict.CHECKS if checks[n]["status"] == "fail"]

    with pytest.raises(AssertionError, match="assert"):
        every_failed_or_unrun_check_fails_the_verdict(planted)


def test_the_checks_decided_are_every_check_made_and_every_check_of_the_schema():
    made = {
        **verdict.process_checks(
            {"status": "exited", "returncode": 0, "wall_s": 1, "peak_rss_mb": 1}, None, ["build"]
        ),
        **verdict.correctness_checks({"cases": {}, "cached_pairs": []}, []),
        **verdict.guard_checks(None, "cuda"),
    }
    assert sorted(verdict.CHECKS) == sorted(made)
    assert sorted(verdict.CHECKS) == sorted(verdict.schema()["properties"]["checks"]["required"])
    assert len(set(verdict.CHECKS)) == len(verdict.CHECKS) == 13


CLEAN_GUARDS = {
    "patched": {"after_import": [], "after_calls": []},
    "lazy": [],
    "side_stream": {
        "caller_streams": [7],
        "candidate_streams": [7],
        "off_stream": [],
        "detected": False,
    },
    "unfinished_on_caller_stream": False,
}
GUARD_FINDINGS = {
    "timer_patched": {"patched": {"after_import": ["time.perf_counter"], "after_calls": []}},
    "lazy_result": {"lazy": [{"case": "official_0", "why": "output is a Deferred"}]},
    "side_stream": {
        "side_stream": {
            "caller_streams": [7],
            "candidate_streams": [7, 13],
            "off_stream": [{"name": "void k()", "cat": "kernel", "stream": 13}],
            "detected": True,
        }
    },
    "unfinished_on_caller_stream": {"unfinished_on_caller_stream": True},
}


def _evidence(runner: dict) -> evidence.Evidence:
    plan = [
        {"name": "official_0", "group": "official", "instance": "official"},
        {"name": "official_1", "group": "official", "instance": "official"},
        {"name": "weights", "group": "weights", "instance": "official", "perturb": True},
        {"name": "uniform_s0", "group": "distribution", "instance": "seed0"},
    ]
    good = {"numel": 4, "problem": None, "official_pass": True, "bit_identical": True}
    names = [c["name"] for c in plan] + ["after_timing"]
    correctness = {
        "atol": TOLERANCE[0],
        "rtol": TOLERANCE[1],
        "cases": {n: dict(good) for n in names},
        "cached_pairs": [],
        "skipped_cases": {},
    }
    outcome = Outcome("candidate", "exited", 0, 1.0, 100.0, "")
    return evidence.Evidence({}, plan, outcome, runner, None, None, None, correctness)


@pytest.fixture
def on_a_gpu(monkeypatch, tmp_path):
    """assemble() as on a GPU machine (the environment block stands in for the device's)."""
    monkeypatch.setattr(evidence, "_environment", lambda device: {"torch": "x", "device": device})
    candidate = tmp_path / "c.py"
    candidate.write_text("")
    task = {"level": 2, "task": 53, "file": "t.py", "sha256": "0" * 64, "commit": None}

    def assemble(runner: dict) -> dict:
        sandbox = {"used": "bwrap", "version": "bubblewrap 0.8.0"}
        record = evidence.assemble(
            candidate, task, "cuda", {}, None, _evidence(runner), sandbox, JUDGE
        )
        verdict.validate(record, "assembled")
        return record

    return assemble


def test_a_clean_report_passes_on_a_gpu(on_a_gpu):
    record = on_a_gpu({**CLEAN_GUARDS, "stages_done": ["build", "correctness", "guards"]})
    assert record["verdict"] == "pass" and record["failed_checks"] == []


@pytest.mark.parametrize("guard", sorted(GUARD_FINDINGS))
def test_each_guard_that_fails_fails_the_verdict_end_to_end(on_a_gpu, guard):
    runner = {**CLEAN_GUARDS, **GUARD_FINDINGS[guard], "stages_done": ["build"]}
    record = on_a_gpu(runner)
    assert record["verdict"] == "fail"
    assert record["failed_checks"] == [guard]
    assert guard in record["self_reported"]["checks"]


def test_a_report_without_guards_fails_the_verdict_as_not_run(on_a_gpu):
    record = on_a_gpu({"stages_done": ["build", "correctness"]})
    assert record["verdict"] == "fail" and record["failed_checks"] == []
    assert {record["checks"][g]["status"] for g in verdict.GUARD_CHECKS} == {"not_run"}


# --------------------------------------------------------------------------- 2. the tolerance


PLAN = [
    {"name": "official_0", "group": "official", "instance": "official"},
    {"name": "uniform_s0", "group": "distribution", "instance": "seed0"},
]


def _folders(tmp_path: Path, outputs: dict[str, torch.Tensor], references) -> tuple[Path, Path]:
    reference, candidate = tmp_path / "reference", tmp_path / "candidate"
    for name, value in references.items():
        (reference / "out" / "reference").mkdir(parents=True, exist_ok=True)
        torch.save(value, reference / "out" / "reference" / f"{name}.pt")
    for name, value in outputs.items():
        (candidate / "out" / "outputs").mkdir(parents=True, exist_ok=True)
        torch.save(value, candidate / "out" / "outputs" / f"{name}.pt")
    return reference, candidate


def the_comparison_uses_the_tolerance_it_records(tmp_path: Path) -> None:
    """Outputs 3 times the tolerance away fail, half of it away pass, and the record names
    the tolerance given: a comparison with a looser or a tighter one is caught either way."""
    atol, rtol = TOLERANCE
    ref = torch.tensor([1.0, -1.0, 100.0])
    bound = atol + rtol * ref.abs()
    references = {"official_0": ref, "uniform_s0": ref}
    outputs = {"official_0": ref + 3 * bound, "uniform_s0": ref + bound / 2, "after_timing": ref}
    reference, candidate = _folders(tmp_path, outputs, references)
    found = evidence.compare_all(PLAN, reference, candidate, JUDGE, 1 << 20, expected=True)
    assert (found["atol"], found["rtol"]) == TOLERANCE
    assert found["cases"]["official_0"]["official_pass"] is False
    assert found["cases"]["uniform_s0"]["official_pass"] is True
    assert found["cases"]["after_timing"]["official_pass"] is True


def test_the_comparison_uses_the_tolerance_it_records(tmp_path):
    the_comparison_uses_the_tolerance_it_records(tmp_path)


@pytest.mark.parametrize("factor", [10, 0.1])
def test_planted_a_tolerance_other_than_the_recorded_one_is_caught(tmp_path, monkeypatch, factor):
    original = evidence.compare.compare_case

    def planted(reference, candidate, judged, device="cpu"):
        return original(reference, candidate, {**judged, "rtol": judged["rtol"] * factor}, device)

    monkeypatch.setattr(evidence.compare, "compare_case", planted)
    with pytest.raises(AssertionError, match="assert"):
        the_comparison_uses_the_tolerance_it_records(tmp_path)


def test_every_planned_case_is_compared_and_a_missing_one_fails(tmp_path):
    ref = torch.tensor([1.0, 2.0])
    references = {"official_0": ref, "uniform_s0": ref * 2}
    reference, candidate = _folders(tmp_path, {"official_0": ref}, references)
    found = evidence.compare_all(PLAN, reference, candidate, JUDGE, 1 << 20, expected=True)
    assert found["cases"]["official_0"]["official_pass"] is True
    for name in ("uniform_s0", "after_timing"):
        assert found["cases"][name] == {"numel": 2, "problem": "no output", "official_pass": False}
    # after a failure of the process, missing outputs are left out: their checks are not_run
    unfinished = evidence.compare_all(PLAN, reference, candidate, JUDGE, 1 << 20, expected=False)
    assert sorted(unfinished["cases"]) == ["official_0"]


def test_only_the_weights_case_may_be_skipped_by_the_report(tmp_path):
    plan = [*PLAN, {"name": "weights", "group": "weights", "instance": "official"}]
    ref = torch.tensor([1.0])
    references = {"official_0": ref, "uniform_s0": ref, "weights": ref}
    outputs = {"official_0": ref, "after_timing": ref}
    reference, candidate = _folders(tmp_path, outputs, references)
    skipped = {"weights": "named differently", "uniform_s0": "I'd rather not"}
    found = evidence.compare_all(
        plan, reference, candidate, JUDGE, 1 << 20, expected=True, skipped=skipped
    )
    assert found["skipped_cases"] == {"weights": "named differently"}
    assert "weights" not in found["cases"]
    assert found["cases"]["uniform_s0"]["problem"] == "no output"


def test_cached_outputs_are_found_through_fingerprints(tmp_path):
    plan = [
        {"name": "official_0", "group": "official", "instance": "official"},
        {"name": "official_1", "group": "official", "instance": "official"},
    ]
    first, second = torch.tensor([1.0]), torch.tensor([2.0])
    references = {"official_0": first, "official_1": second}
    outputs = {"official_0": first, "official_1": first, "after_timing": first}
    reference, candidate = _folders(tmp_path, outputs, references)
    found = evidence.compare_all(plan, reference, candidate, JUDGE, 1 << 20, expected=True)
    assert found["cached_pairs"] == [["official_0", "official_1"]]


# --------------------------------------------------------------------------- 3. effective FTZ


def ftz_is_measured_if_any_build_flushes() -> None:
    def measured(*values):
        witness = [{"route": "load_inline", "effective_ftz": v} for v in values]
        return evidence.contract({}, witness)["effective_ftz"]

    assert measured(True, False) is True
    assert measured(False, True) is True
    assert measured(False, None, True) is True
    assert measured(False, False) is False
    assert measured(None, False) is False
    assert measured(None) is None
    assert evidence.contract({}, None)["effective_ftz"] is None


def test_ftz_is_measured_if_any_build_flushes():
    ftz_is_measured_if_any_build_flushes()


def test_planted_all_instead_of_any_over_the_witness_builds_is_caught(monkeypatch):
    monkeypatch.setattr(evidence, "any", builtins.all, raising=False)
    with pytest.raises(AssertionError, match="assert"):
        ftz_is_measured_if_any_build_flushes()


# --------------------------------------------------------------------------- 4. a case summary


def _case(name: str, ok: bool) -> dict:
    ref = torch.tensor([1.0, 2.0])
    return checks_cases.check_case(ref, ref if ok else ref + 1, {"atol": 0, "rtol": 0}, name, "g")


def every_failing_check_is_kept(assemble) -> None:
    cases = [_case("a", False), _case("b", True), _case("c", False)]
    result = assemble(cases, {"capturable": False})
    assert result["passed"] is False
    assert result["failing_checks"] == ["a", "c", "graph/capture"]
    assert assemble(cases[1:2], {"capturable": True})["failing_checks"] == []
    only = assemble(cases[1:2], {"capturable": False})
    assert only["failing_checks"] == ["graph/capture"] and only["passed"] is False


def test_a_case_summary_keeps_every_failing_check():
    every_failing_check_is_kept(checks_cases.assemble)


def test_planted_a_summary_that_keeps_only_the_first_failing_check_is_caught():
    def planted(cases, graph_capture):
        result = checks_cases.assemble(cases, graph_capture)
        return {**result, "failing_checks": result["failing_checks"][:1]}

    with pytest.raises(AssertionError, match="assert"):
        every_failing_check_is_kept(planted)


def test_the_verdict_table_lists_every_failed_check():
    implies = {"use_fast_math": False, "ftz": False}
    record = {
        "candidate": {"file": "x.py"},
        "task": {"level": 2, "task": 53},
        "verdict": "fail",
        "failed_checks": ["official", "distributions", "timer_patched"],
        "findings": ["unsandboxed"],
        "correctness": {"cases": {}},
        "contract": {"routes": [], "implies": implies, "effective_ftz": None},
        "speedup": None,
    }
    row = verdict_row(record)
    assert row["failed_checks"] == "official distributions timer_patched"
    assert row["findings"] == "unsandboxed"


# --------------------------------------------------------------------------- found open by mutation


def test_a_missing_report_fails_the_build_only_when_the_process_exited():
    exited = {"status": "exited", "returncode": 0, "wall_s": 1, "peak_rss_mb": 1}
    checks = verdict.process_checks(exited, None, [], "runner.json was not written")
    assert checks["build"] == {
        "status": "fail",
        "detail": "no usable report from its process: runner.json was not written",
    }
    killed = {**exited, "status": "time_limit", "returncode": -9}
    checks = verdict.process_checks(killed, None, [], "runner.json was not written")
    assert checks["build"]["status"] == "not_run"
    assert checks["time_limit"]["status"] == "fail"


def test_the_value_checks_must_pass_not_merely_apply():
    for name in ("official", "distributions"):
        assert verdict.decide(_checks(**{name: "not_applicable"})) == ("fail", [])
    assert verdict.decide(_checks(changed_weights="not_applicable")) == ("pass", [])
