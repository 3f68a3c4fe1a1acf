"""The correctness gate on the CPU: what it lets through, what timing loads, which predicate.

Three behaviours only GPU tests used to exercise, here with honest stand-ins:

- `gate.gate` refuses a record marked failed even when it lists no failing check;
- `timing.run_timing` hands only gated variants to `launch.LoadedModule.load` and only gated
  baselines to the measurement (a spy records every load and what is measured; the model,
  inputs and measurement are fakes, the gate and the record files are real);
- `cases.check_case` gates on the official predicate, `allclose(reference, candidate)`
  (the candidate scales the relative term), not the historical one: the pairs below are
  close under one predicate and not under the other.
"""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from test_timing_stats import record

from kbfuse import stage
from kbfuse.checks.cases import assemble, check_case
from kbfuse.checks.numerics import historical_allclose, official_allclose
from kbfuse.compilation import launch
from kbfuse.io import read_json, write_json
from kbfuse.tasks import baselines, kernelbench, tails
from kbfuse.timing import gate, timing
from kbfuse.timing.gate import TimedTask

SHA = "a" * 64
PROTOCOL = {"warmup": 1, "rounds": 2, "invocations_per_pair": 1, "order_seed": 0, "input_seed": 0}
# atol 0, rtol 1/2: |1 - 2| = 1 is within rtol * 2 but not within rtol * 1.
HALF = {"atol": 0.0, "rtol": 0.5}


def correctness_record(variant: str, passed: bool, failing=(), task=81, sha=SHA) -> dict:
    return record(variant, passed, failing, task, sha)


# --------------------------------------------------------------------------- gate


def test_gate_refuses_a_failed_record_that_lists_no_failing_check():
    eligible, skipped = gate.gate(
        {"v": correctness_record("v", passed=False)}, task=81, artifact_sha256={"v": SHA}
    )
    assert eligible == []
    assert skipped == {
        "v": {
            "reason": "failed correctness (official predicate): 0 failing check(s)",
            "failing_checks": [],
        }
    }


def test_gate_names_every_failing_check_of_a_failed_record():
    failing = ["seed0/uniform", "graph/capture"]
    _, skipped = gate.gate({"v": correctness_record("v", passed=False, failing=failing)})
    assert skipped["v"]["failing_checks"] == failing
    assert skipped["v"]["reason"] == "failed correctness (official predicate): 2 failing check(s)"


def test_gate_checks_the_artifact_only_when_one_is_given():
    record = correctness_record("v", passed=True, sha="b" * 64)
    assert gate.gate({"v": record}, task=81) == (["v"], {})
    eligible, skipped = gate.gate({"v": record}, task=81, artifact_sha256={"v": SHA})
    assert eligible == []
    assert skipped["v"]["reason"] == (
        f"correctness was checked on artifact {'b' * 64!r}, but the artifact to time has "
        f"sha256 {SHA}"
    )


# --------------------------------------------------------------------------- what timing loads


@pytest.fixture
def timing_fakes(tmp_path, monkeypatch):
    """run_timing with a spy on LoadedModule.load and fakes for everything that needs a GPU."""
    loaded: list[str] = []
    timed: list[list[str]] = []

    def spy_load(artifact, meta, kernels=()):
        loaded.append(meta["variant"])
        return SimpleNamespace(variant=meta["variant"], artifact=Path(artifact))

    def fake_measure(program, protocol, say, labels=()):
        timed.append([*program.baseline_names, *program.modules])
        return {"measurements": {}, "ratios": {}, "tail_bytes": 0}

    spec = SimpleNamespace(pin_commit="c" * 40, sha256="d" * 64, input_shape=lambda: (2, 4))
    linear = torch.nn.Linear(4, 3)
    monkeypatch.setattr(launch.LoadedModule, "load", staticmethod(spy_load))
    monkeypatch.setattr(stage, "measure_program", fake_measure)
    monkeypatch.setattr(timing, "make_input", lambda *a, **k: torch.zeros(2, 4))
    monkeypatch.setattr(kernelbench, "read_pin", lambda path: {"tasks": {"81": {}}})
    monkeypatch.setattr(kernelbench, "load_task", lambda checkout, pin, task: spec)
    monkeypatch.setattr(kernelbench, "build_model", lambda spec, seed: linear)
    fake_tail = SimpleNamespace(
        input_shape=lambda spec: spec.input_shape(),
        kernels=lambda: ("tail81",),
        library_output=lambda model, x: model(x),
        shape_record=lambda model, x, y: {"batch": 2, "in_features": 4, "out_features": 3},
    )
    monkeypatch.setattr(tails, "tail_for", lambda task: fake_tail)
    monkeypatch.setattr(baselines, "set_numerics", lambda mode=None: {})
    return tmp_path, loaded, timed


def _baselines_record(root: Path, outcomes: dict) -> Path:
    """The task's baselines correctness record for baselines -> (passed, failing)."""
    results = {
        name: {"passed": passed, "failing_checks": list(failing)}
        for name, (passed, failing) in outcomes.items()
    }
    record = {"kind": "correctness_baselines", "task": 81, "implementations": results}
    write_json(root / "correctness" / "baselines.json", record)
    return root / "correctness" / "baselines.json"


def _study(root: Path, outcomes: dict) -> tuple[dict, dict]:
    """Compile metadata and correctness files for variants -> (passed, failing, sha)."""
    variants, correctness = {}, {}
    for name, (passed, failing, sha) in outcomes.items():
        meta = {"kind": "compile", "variant": name, "artifact_sha256": SHA, "kernel": "tail_81"}
        write_json(root / name / "meta.json", meta)
        variants[name] = (root / name / "tails.bin", root / name / "meta.json")
        if passed is not None:
            record = correctness_record(name, passed, failing, sha=sha)
            write_json(root / "correctness" / f"{name}.json", record)
        correctness[name] = root / "correctness" / f"{name}.json"
    return variants, correctness


def test_timing_loads_only_the_variants_that_passed_the_gate(timing_fakes):
    root, loaded, timed = timing_fakes
    variants, correctness = _study(
        root,
        {
            "good": (True, [], SHA),
            "failed": (False, ["seed0/uniform"], SHA),
            "failed-silently": (False, [], SHA),
            "stale": (True, [], "b" * 64),
            "unchecked": (None, [], SHA),
            "good-too": (True, [], SHA),
        },
    )
    record = _baselines_record(
        root, {"torchscript": (True, []), "inductor": (False, ["seed0/normal"])}
    )
    out = root / "timing.json"
    names = ["eager", "torchscript", "inductor"]
    inputs = TimedTask(81, variants, correctness, record, root, root / "pin.json", names)
    result = timing.run_timing(inputs, PROTOCOL, out)
    assert loaded == ["good", "good-too"]
    assert timed == [["eager", "torchscript", "good", "good-too"]]
    assert result["timed"] == ["eager", "torchscript", "good", "good-too"]
    assert sorted(result["skipped"]) == [
        "failed",
        "failed-silently",
        "inductor",
        "stale",
        "unchecked",
    ]
    assert result["skipped"]["inductor"] == {
        "reason": "failed correctness (official predicate): 1 failing check(s)",
        "failing_checks": ["seed0/normal"],
    }
    assert result["skipped"]["unchecked"]["reason"] == "no correctness record"
    assert result["provenance"]["artifacts"] == {"good": SHA, "good-too": SHA}
    assert read_json(out)["timed"] == result["timed"]


def test_timing_loads_nothing_when_no_variant_passed(timing_fakes):
    root, loaded, timed = timing_fakes
    variants, correctness = _study(root, {"failed": (False, ["tail/large"], SHA)})
    record = root / "correctness" / "baselines.json"  # never written: eager needs none
    inputs = TimedTask(81, variants, correctness, record, root, root / "pin.json", ["eager"])
    result = timing.run_timing(inputs, PROTOCOL, root / "t.json")
    assert loaded == [] and timed == [["eager"]]
    assert result["timed"] == ["eager"]
    assert result["skipped"]["failed"]["failing_checks"] == ["tail/large"]


# --------------------------------------------------------------------------- which predicate


@pytest.mark.parametrize(
    ("reference", "candidate", "official"),
    [(1.0, 2.0, True), (2.0, 1.0, False)],
    ids=["official-only", "historical-only"],
)
def test_the_two_predicates_disagree_on_these_pairs(reference, candidate, official):
    ref, cand = torch.tensor([reference]), torch.tensor([candidate])
    assert official_allclose(ref, cand, **HALF) is official
    assert historical_allclose(ref, cand, **HALF) is (not official)


@pytest.mark.parametrize(
    ("reference", "candidate", "official"),
    [(1.0, 2.0, True), (2.0, 1.0, False)],
    ids=["official-only", "historical-only"],
)
def test_check_case_gates_on_the_official_predicate_where_they_disagree(
    reference, candidate, official
):
    case = check_case(torch.tensor([reference]), torch.tensor([candidate]), HALF, "c", "g")
    assert case["gate"] == "official"
    assert case["gate_pass"] is official
    assert case["official_pass"] is official and case["historical_pass"] is (not official)
    result = assemble([case], {"capturable": True, "error": None})
    assert result["passed"] is official
    assert result["failing_checks"] == ([] if official else ["c"])


@pytest.mark.parametrize(
    ("reference", "candidate", "official"),
    [(1.0, 2.0, True), (2.0, 1.0, False)],
    ids=["official-only", "historical-only"],
)
def test_equal_nan_gating_keeps_the_official_order(reference, candidate, official):
    """Cases whose reference holds NaN are gated with equal_nan=True, still reference first."""
    ref = torch.tensor([math.nan, reference])
    cand = torch.tensor([math.nan, candidate])
    case = check_case(ref, cand, HALF, "tail/nonfinite", "tail_control")
    assert case["gate"] == "official_equal_nan"
    assert case["gate_pass"] is official
    assert case["official_on_non_nan_reference"]["official_pass"] is official
