"""Failures inside a survey job are recorded with their stage; the job goes on.

Build failures of real tasks are in test_survey_job (an untraceable task); here each other
stage is made to fail on purpose: correctness (an output of the wrong shape), timing (a forward
that raises after a few calls), profile, and eager itself (a task whose forward raises).
"""

from __future__ import annotations

import pytest
import torch
from contracts import contract
from kbrepo import LEVEL_DIR, commit_files
from survey_kbrepo import make_survey_repo

from kbfuse.errors import KbfuseError
from kbfuse.results import records
from kbfuse.survey import baselines as survey_baselines
from kbfuse.survey import profile as survey_profile
from kbfuse.survey import timing as survey_timing
from kbfuse.survey.correctness import compare
from kbfuse.survey.job import run_survey_task
from kbfuse.survey.settings import survey_settings
from kbfuse.tasks.evaluator import write_contract
from kbfuse.tasks.kernelbench import pin_kernelbench, pin_task

BROKEN = """import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self, n):
        super(Model, self).__init__()
        self.linear = nn.Linear(n, n)

    def forward(self, x):
        return self.linear(x[:, :3])

def get_inputs():
    return [torch.rand(2, 4)]

def get_init_inputs():
    return [4]
"""
SETTINGS = {
    "device": "cpu",
    "rounds": 3,
    "warmup": 1,
    "invocations_per_pair": 1,
    "baselines": ["eager", "torchscript"],
}


@pytest.fixture(scope="module")
def checkout(tmp_path_factory):
    """(checkout, pin of task 53, pin of task 99 whose forward always raises)."""
    root = tmp_path_factory.mktemp("survey-failures")
    url, _ = make_survey_repo(root / "kb")
    commit = commit_files(
        root / "kb", {f"{LEVEL_DIR}/99_Broken_Linear.py": BROKEN}, "A task that fails"
    )
    co, record = root / "checkout", root / "checkout.json"
    pin_kernelbench(url, commit, 2, [53], co, record)
    pin_task(co, record, 53, root / "pin53.json")
    pin_task(co, record, 99, root / "pin99.json")
    write_contract(co, record, co.parent / "contract.json")
    return co, root / "pin53.json", root / "pin99.json"


def _run(checkout, pin, tmp_path, **settings):
    out = tmp_path / "out.json"
    run_survey_task(checkout, pin, survey_settings({"survey": {**SETTINGS, **settings}}),
                    checkout.parent / "contract.json", {"strict": out}, print)  # fmt: skip
    return records.read_record(out, "survey_task")


def _wrap(name: str, wrapper):
    real = survey_baselines.make

    def make(which, model, inputs, semantics):
        run = real(which, model, inputs, semantics)
        return wrapper(run) if which == name else run

    return make


def test_a_wrong_output_is_a_correctness_failure(checkout, tmp_path, monkeypatch):
    co, pin53, _ = checkout
    wrong_shape = _wrap("torchscript", lambda run: lambda *x: run(*x)[:, :3])
    monkeypatch.setattr(survey_baselines, "make", wrong_shape)
    rec = _run(co, pin53, tmp_path)
    ts = rec["baselines"]["torchscript"]
    assert ts["status"] == "failed"
    assert ts["failure"] == {
        "stage": "correctness",
        "error": "KbfuseError",
        "message": "output shape (16, 3) differs from eager's (16, 64)",
    }
    assert ts["timing"] is None and ts["build_s"] >= 0
    assert rec["baselines"]["eager"]["status"] == "ok" and rec["ratios"] == {}


def test_a_forward_that_fails_while_timed_is_dropped_and_the_others_timed(
    checkout, tmp_path, monkeypatch
):
    co, pin53, _ = checkout
    calls = {"n": 0}

    def flaky(run):
        def call(*inputs):
            calls["n"] += 1
            if calls["n"] > 6:  # the build and the 5 official trials pass, timing does not
                raise MemoryError("out of memory (simulated)")
            return run(*inputs)

        return call

    monkeypatch.setattr(survey_baselines, "make", _wrap("torchscript", flaky))
    rec = _run(co, pin53, tmp_path)
    ts = rec["baselines"]["torchscript"]
    assert ts["status"] == "failed"
    assert ts["failure"] == {
        "stage": "timing",
        "error": "MemoryError",
        "message": "out of memory (simulated)",
    }
    assert ts["correctness"]["official_pass"] is True and ts["timing"] is None
    eager = rec["baselines"]["eager"]
    assert len(eager["timing"]["wall"]["samples_ms"]) == 3
    assert rec["ratios"] == {}


def test_a_profile_failure_keeps_the_timing(checkout, tmp_path, monkeypatch):
    co, pin53, _ = checkout
    real = survey_profile.capture

    calls = []

    def capture(run, device):  # profiled in config order: eager, torchscript
        calls.append(run)
        if len(calls) == 2:
            raise RuntimeError("profiler unavailable\nsecond line")
        return real(run, device)

    monkeypatch.setattr(survey_profile, "capture", capture)
    rec = _run(co, pin53, tmp_path)
    ts = rec["baselines"]["torchscript"]
    assert ts["failure"] == {
        "stage": "profile",
        "error": "RuntimeError",
        "message": "profiler unavailable",
    }
    assert ts["status"] == "failed" and ts["timing"]["wall"]["median_ms"] > 0
    assert rec["baselines"]["eager"]["kernels"]


def test_a_task_whose_eager_forward_fails_still_gets_a_record(checkout, tmp_path):
    co, _, pin99 = checkout
    rec = _run(co, pin99, tmp_path)
    assert rec["task"] == 99 and rec["file"] == "99_Broken_Linear.py"
    for name in ("eager", "torchscript"):
        assert rec["baselines"][name]["status"] == "failed"
        assert rec["baselines"][name]["failure"]["stage"] == "build"
        assert rec["baselines"][name]["failure"]["error"] == "RuntimeError"
    assert rec["output"] is None and rec["determinism"] is None and rec["flops"] is None
    assert rec["blind_spot"] is False and rec["ratios"] == {}
    # nothing left to time: the job never waited to have the device alone
    assert set(rec["phases_s"]) == {"load", "wait_shared", "reference_and_builds"}


def test_time_method_drops_only_the_failing_baseline():
    failures: dict = {}

    def broken():
        raise ValueError("no")

    def fine():
        return torch.zeros(2)

    protocol = {"warmup": 1, "rounds": 4, "invocations_per_pair": 1, "order_seed": 1}
    samples, positions = survey_timing.time_method(
        "wall", {"eager": fine, "bad": broken}, protocol, "seed", lambda _: None, failures
    )
    assert set(samples) == {"eager"} and len(samples["eager"]) == 4
    assert positions["eager"] == [0, 0, 0, 0]
    assert failures == {"bad": {"stage": "timing", "error": "ValueError", "message": "no"}}


def test_correctness_refuses_a_non_tensor_and_other_dtypes():
    ref = torch.ones(3)
    with pytest.raises(KbfuseError, match=r"the output is a tuple, not a tensor"):
        compare([(ref, (ref,))], contract())
    with pytest.raises(KbfuseError, match=r"outputs must be float32 \(reference torch.float32, "):
        compare([(ref, ref.double())], contract())
    with pytest.raises(KbfuseError, match=r"^a baseline's correctness needs at least one official"):
        compare([], contract())
