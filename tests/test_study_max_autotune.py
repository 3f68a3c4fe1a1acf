"""Inductor's max-autotune (`inductor-max-autotune-no-cudagraphs`) as a baseline of the study:
built in its mode, gated on its own correctness like every baseline, the strongest compiled
baseline when it is the fastest that passed, its build time recorded, its correctness job alone
on the GPU; the study's default config leaves it out (its committed reference has none), the
survey's runs it (its reference has it)."""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from test_fakes_gate import PROTOCOL, SHA, _baselines_record, _study, timing_fakes  # noqa: F401

from kbfuse.tasks import baselines, registry
from kbfuse.timing import timing
from kbfuse.timing.gate import TimedTask, gate_baselines
from kbfuse.timing.measure import assemble_scope, best_compiled

AUTOTUNE = "inductor-max-autotune-no-cudagraphs"
ROOT = Path(__file__).resolve().parents[1]


def test_it_is_a_baseline_built_by_inductor_in_its_mode(monkeypatch):
    import torch

    compiled = []

    def compile_spy(model, dynamic, mode):
        compiled.append((dynamic, mode))
        return model

    monkeypatch.setattr(torch, "compile", compile_spy)
    # (the config's own patch: monkeypatch would delete the option when it undoes the change)
    with torch._dynamo.config.patch(recompile_limit=8):
        program = baselines.build(AUTOTUNE, torch.nn.Linear(4, 4), torch.zeros(2, 4))
        assert compiled == [(False, "max-autotune-no-cudagraphs")]
        assert program.__name__ == AUTOTUNE
        # two Inductor modes over the correctness stage's models: more compiles than Dynamo's 8
        assert torch._dynamo.config.recompile_limit == baselines.RECOMPILE_LIMIT
    baselines.build("inductor", torch.nn.Linear(4, 4), torch.zeros(2, 4))
    assert compiled[-1] == (False, None)
    assert AUTOTUNE in baselines.IMPLEMENTATIONS and baselines.AUTOTUNED == (AUTOTUNE,)
    assert registry.BASELINES == baselines.IMPLEMENTATIONS


def test_it_is_timed_only_when_its_correctness_passed():
    names = ["eager", "inductor", AUTOTUNE]
    passing = {"kind": "correctness_baselines", "task": 81, "implementations": {
        "inductor": {"passed": True, "failing_checks": []},
        AUTOTUNE: {"passed": False, "failing_checks": ["seed0/uniform_x100"]},
    }}  # fmt: skip
    eligible, skipped = gate_baselines(passing, names, 81)
    assert eligible == ["eager", "inductor"]
    assert skipped[AUTOTUNE]["failing_checks"] == ["seed0/uniform_x100"]
    passing["implementations"][AUTOTUNE]["passed"] = True
    passing["implementations"][AUTOTUNE]["failing_checks"] = []
    assert gate_baselines(passing, names, 81)[0] == names
    unchecked = {**passing, "implementations": {"inductor": {"passed": True, "failing_checks": []}}}
    eligible, skipped = gate_baselines(unchecked, names, 81)
    assert eligible == ["eager", "inductor"]
    assert skipped[AUTOTUNE]["reason"] == f"no correctness result for baseline {AUTOTUNE!r}"


def test_the_tail_question_is_answered_against_the_strongest_compiled_baseline():
    m = {"eager": {"median_ms": 3.0}, "inductor": {"median_ms": 2.0}, AUTOTUNE: {"median_ms": 1.5}}
    assert best_compiled(m) == AUTOTUNE
    samples = {"eager": [3.0] * 3, "inductor": [2.0] * 3, AUTOTUNE: [1.5] * 3, "fast": [1.0] * 3}
    positions = {name: [0, 1, 2] for name in samples}
    _, ratios = assemble_scope(samples, positions, ["eager", "inductor", AUTOTUNE], ["fast"])
    assert ratios["fast"]["vs_best_compiled"]["baseline"] == AUTOTUNE
    assert ratios["fast"]["vs_best_compiled"]["median"] == 1.5


def test_the_timing_stage_times_it_beside_the_others_when_it_passed(timing_fakes):  # noqa: F811
    root, loaded, timed = timing_fakes
    variants, correctness = _study(root, {"good": (True, [], SHA)})
    record = _baselines_record(root, {"inductor": (True, []), AUTOTUNE: (True, [])})
    names = ["eager", "inductor", AUTOTUNE]
    inputs = TimedTask(81, variants, correctness, record, root, root / "pin.json", names)
    result = timing.run_timing(inputs, PROTOCOL, root / "timing.json")
    assert timed == [["eager", "inductor", AUTOTUNE, "good"]]
    assert result["timed"] == ["eager", "inductor", AUTOTUNE, "good"]


def test_the_correctness_job_checks_the_configured_baselines_alone_when_one_autotunes():
    assert registry.baselines_gpu_lock(["torchscript", "inductor"]) == "shared"
    assert registry.baselines_gpu_lock(["inductor", AUTOTUNE]) == "alone"
    script = (ROOT / "workflow/scripts/correctness_baselines.py").read_text()
    assert "implementations=compiled" in script and "baselines_gpu_lock(compiled)" in script
    rule = (ROOT / "workflow/rules/correctness.smk").read_text()
    assert "baselines=COMPILED_BASELINES," in rule


def test_the_default_config_runs_it_where_the_reference_has_it():
    """The survey reference was run with max-autotune, so the survey's default runs it; the
    study's reference was not, so the study's default leaves it out until it is regenerated."""
    config = yaml.safe_load((ROOT / "config/config.yaml").read_text())
    assert AUTOTUNE not in config["baselines"] and "inductor" in config["baselines"]
    assert config["survey"]["baselines"] == ["eager", "torchscript", "inductor", AUTOTUNE]
    record = ROOT / "results/reference/h200/survey/survey/strict/tasks/53.json"
    assert set(json.loads(record.read_text())["baselines"]) == set(config["survey"]["baselines"])
