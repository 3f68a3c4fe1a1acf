"""The survey's official trials in one pass per mode (kbfuse.survey.job._official): each
trial's inputs reach the device once and eager runs once, whatever the number of baselines;
each baseline is still called as KernelBench's evaluator calls a candidate, right after the
reference, with the generators as eager left them; and the figures are those of a
baseline-by-baseline comparison."""

from __future__ import annotations

import types

import pytest
import torch
from contracts import contract

from kbfuse.checks import official
from kbfuse.survey import correctness
from kbfuse.survey import job as survey_job

SEEDS = [11, 12, 13]


def task(monkeypatch, baselines: list[str]):
    moved = []
    real_to_device = official.to_device

    def to_device(values, device):
        moved.append(len(values))
        return real_to_device(values, device)

    monkeypatch.setattr(official, "to_device", to_device)
    draws = [[torch.rand(4, 8, generator=torch.Generator().manual_seed(s))] for s in SEEDS]
    t = types.SimpleNamespace(
        contract=contract(),
        device="cpu",
        trial_seeds=SEEDS,
        trial_draws=draws,
        settings={"baselines": baselines},
        conv_backends="ATEN",
        say=lambda _: None,
    )
    return t, moved


def mode() -> survey_job._Mode:
    return survey_job._Mode("strict", {"baselines": {}})


def noisy(x):
    """A forward that draws from the CPU generator, like dropout."""
    return x + torch.rand_like(x)


def test_eager_runs_once_per_trial_and_inputs_move_once(monkeypatch):
    t, moved = task(monkeypatch, ["eager", "a", "b", "c"])
    calls = []

    def eager(x):
        calls.append("eager")
        return x * 2

    def same(name):
        def forward(x):
            calls.append(name)
            return x * 2

        return forward

    builds = {n: (same(n), 0.1, "strict", None) for n in ("a", "b", "c")}
    m = mode()
    survey_job._official(t, m, eager, [torch.zeros(1)], builds, blind_spots=True)
    assert calls == ["eager", "a", "b", "c"] * len(SEEDS)
    assert moved == [1] * len(SEEDS)
    assert list(m.runs) == ["a", "b", "c"]
    for name in ("a", "b", "c"):
        check = m.record["baselines"][name]["correctness"]
        assert check["official_pass"] and check["trials"] == 3 and check["not_bit_equal"] == 0
    assert m.record["blind_spot"] is False
    assert m.record["blind_spots"]["trials"] == 3


def test_each_baseline_sees_the_generators_as_eager_left_them(monkeypatch):
    t, _ = task(monkeypatch, ["eager", "a", "b"])
    seen = {"a": [], "b": []}

    def drawing(name):
        def forward(x):
            seen[name].append(torch.rand(1).item())
            return noisy(x)

        return forward

    builds = {n: (drawing(n), 0.1, "strict", None) for n in ("a", "b")}
    m = mode()
    survey_job._official(t, m, noisy, [torch.zeros(1)], builds, blind_spots=False)
    # what the evaluator's candidate would draw: set_seed(trial), the reference, then it
    expected = []
    for seed, (x,) in zip(SEEDS, t.trial_draws, strict=True):
        official.set_seed(seed)
        noisy(x)
        expected.append(torch.rand(1).item())
    assert seen["a"] == seen["b"] == expected
    # drawing after eager, neither matches eager's output (as a dropout baseline would not)
    for name in ("a", "b"):
        assert m.record["baselines"][name]["correctness"]["not_bit_equal"] > 0


def test_the_figures_are_those_of_one_baseline_at_a_time(monkeypatch):
    t, _ = task(monkeypatch, ["eager", "off"])
    offset = lambda x: x * 2 + 1e-3  # noqa: E731
    m = mode()
    survey_job._official(
        t, m, lambda x: x * 2, [torch.zeros(1)], {"off": (offset, 0.1, "strict", None)}, False
    )
    pairs = [(x * 2, offset(x)) for (x,) in t.trial_draws]
    assert m.record["baselines"]["off"]["correctness"] == correctness.compare(pairs, t.contract)
    assert m.record["baselines"]["off"]["correctness"]["official_pass"] is False


def test_a_baseline_that_fails_is_recorded_and_the_others_go_on(monkeypatch):
    t, _ = task(monkeypatch, ["eager", "bad", "good", "unbuilt"])

    def bad(x):
        raise RuntimeError("no kernel image")

    builds = {
        "bad": (bad, 0.1, "strict", None),
        "good": (lambda x: x * 2, 0.1, "strict", None),
        "unbuilt": (None, None, "strict", ValueError("trace failed")),
    }
    m = mode()
    survey_job._official(t, m, lambda x: x * 2, [torch.zeros(1)], builds, blind_spots=False)
    entries = m.record["baselines"]
    assert list(entries) == ["bad", "good", "unbuilt"]  # the configured order
    assert entries["bad"]["failure"]["stage"] == "correctness"
    assert entries["bad"]["failure"]["message"] == "no kernel image"
    assert entries["unbuilt"]["failure"]["stage"] == "build"
    assert entries["good"]["correctness"]["official_pass"] is True
    assert list(m.runs) == ["good"]


def test_eager_failing_on_a_trial_stops_the_pass(monkeypatch):
    t, _ = task(monkeypatch, ["eager", "a"])

    def eager(x):
        raise RuntimeError("eager broke")

    with pytest.raises(survey_job._EagerFailed, match="eager broke") as failure:
        survey_job._official(
            t, mode(), eager, [torch.zeros(1)], {"a": (lambda x: x, 0.1, "strict", None)}, True
        )
    assert str(failure.value.__cause__) == "eager broke"


def test_eager_failing_in_the_alone_pass_fails_the_autotuned_baseline_only(monkeypatch):
    # the alone pass checks max-autotune after eager already ran on these trials: a failure of
    # eager there is recorded against the baseline being checked, not the whole mode
    autotune = "inductor-max-autotune-no-cudagraphs"
    t, _ = task(monkeypatch, ["eager", "inductor", autotune])
    m = mode()
    m.eager_ok = True
    m.record["baselines"] = {"inductor": survey_job._baseline_entry()}
    build = (lambda x: x * 2, 3.0, "strict", None)
    monkeypatch.setattr(survey_job, "_build", lambda *_: {autotune: build})

    def eager(x):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    subject = survey_job._Subject(model=None, inputs=[torch.zeros(1)], eager=eager)
    phases = survey_job.Phases()
    survey_job._alone_builds(t, m, subject, phases)
    entries = m.record["baselines"]
    assert entries["inductor"]["status"] == "ok"
    assert entries[autotune]["status"] == "failed"
    assert entries[autotune]["conv_backends"] == "ATEN"  # the configured backends, recorded
    assert entries[autotune]["failure"]["stage"] == "correctness"
    assert "illegal memory access" in entries[autotune]["failure"]["message"]
    assert autotune not in m.runs
    assert phases.seconds["official_trials"] >= 0
