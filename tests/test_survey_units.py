"""The survey's small pieces, one behaviour each: settings, task files, bit equality, blind
spots, the profile's per-forward rows, the timing protocol's checks and its ratios."""

from __future__ import annotations

import hashlib

import pytest
import torch
from contracts import contract

from kbfuse.checks import official
from kbfuse.errors import KbfuseError
from kbfuse.survey import determinism, profile, settings, tasks
from kbfuse.survey import timing as survey_timing


def test_defaults_fill_a_missing_survey_block_and_keep_given_keys():
    filled = settings.survey_settings({"survey": {"rounds": 5}})
    assert filled["rounds"] == 5 and filled["tasks"] == "all" and filled["min_sample_ms"] == 1.0
    assert settings.survey_settings({}) == settings.DEFAULTS
    assert settings.survey_settings({}) is not settings.DEFAULTS


def test_configured_tasks_resolve_all_and_refuse_unknown_numbers():
    assert settings.configured_tasks({"tasks": "all"}, [3, 1, 2]) == [1, 2, 3]
    assert settings.configured_tasks({"tasks": [2, 1]}, [1, 2, 3]) == [1, 2]
    with pytest.raises(KbfuseError, match=r"survey.tasks: \[7, 9\] have no task file .*1\.\.3"):
        settings.configured_tasks({"tasks": [1, 7, 9]}, [1, 2, 3])
    with pytest.raises(KbfuseError, match=r"survey.tasks: 'all' found no task file"):
        settings.configured_tasks({"tasks": "all"}, [])


def test_tf32_flags_of_each_mode():
    assert settings.tf32_flags("strict") == (False, False)
    assert settings.tf32_flags("kernelbench-defaults") == (False, True)
    with pytest.raises(KbfuseError, match=r"numerics mode 'fast' is unknown"):
        settings.tf32_flags("fast")


def test_level_tasks_lists_numbered_files_and_refuses_two_for_one_number(tmp_path):
    level = tmp_path / "KernelBench" / "level2"
    level.mkdir(parents=True)
    for name in ("1_A.py", "12_B.py", "README.md", "x_1.py", "0_Zero.py"):
        (level / name).write_text("")
    assert tasks.level_tasks(tmp_path, 2) == {1: "1_A.py", 12: "12_B.py"}
    (level / "12_C.py").write_text("")
    with pytest.raises(KbfuseError, match=r"task 12: KernelBench/level2 holds two files"):
        tasks.level_tasks(tmp_path, 2)
    with pytest.raises(KbfuseError, match=r"has no folder KernelBench/level3"):
        tasks.level_tasks(tmp_path, 3)


def test_task_file_sha256_is_absent_without_a_checkout(tmp_path):
    assert tasks.task_file_sha256(tmp_path / "none", 2, 1) == "absent"
    level = tmp_path / "KernelBench" / "level2"
    level.mkdir(parents=True)
    (level / "1_A.py").write_text("x = 1\n")
    assert tasks.task_file_sha256(tmp_path, 2, 1) == hashlib.sha256(b"x = 1\n").hexdigest()


def test_describe_inputs_names_tensors_and_other_values():
    described = tasks.describe_inputs([torch.zeros(2, 3), 4, 0.5, None, object()])
    assert described == [
        {"shape": [2, 3], "dtype": "float32"},
        {"type": "int", "value": 4},
        {"type": "float", "value": 0.5},
        {"type": "NoneType", "value": None},
        {"type": "object", "value": None},
    ]


def test_same_bits_tells_signed_zeros_and_nan_payloads_apart():
    zero = torch.tensor([0.0])
    assert determinism.same_bits(zero, zero.clone())
    assert not determinism.same_bits(zero, -zero)
    nan = torch.tensor([float("nan")])
    assert determinism.same_bits(nan, nan.clone())  # equal bits, although nan != nan
    assert not determinism.same_bits(zero, zero.double())
    assert not determinism.same_bits(zero, (zero,))


def test_same_bits_looks_at_both_parts_of_complex_values():
    nan = torch.complex(torch.tensor([float("nan")]), torch.tensor([0.0]))
    other_nan = torch.complex(torch.tensor([-float("nan")]), torch.tensor([0.0]))
    assert determinism.same_bits(nan, nan.clone())  # equal payloads: the same bits
    assert not determinism.same_bits(nan, other_nan)  # another NaN's sign bit
    zero = torch.complex(torch.tensor([0.0]), torch.tensor([0.0]))
    signed = torch.complex(torch.tensor([0.0]), torch.tensor([-0.0]))
    assert not determinism.same_bits(zero, signed)  # equal as numbers, not as bits


def test_blind_spots_of_a_tiny_output_and_of_an_identity():
    judged = contract()
    small = torch.full((4,), 1e-4)
    spots = official.trivial_status([(small, [torch.ones(3)])], judged)
    assert spots["zeros"]["passes"] is True
    assert spots["input_identity"] == {"applicable": False, "passes": None}
    assert spots["blind_spot"] is True
    x = torch.linspace(1, 4, 4)
    spots = official.trivial_status([(x.clone(), [x])], judged)
    assert spots["zeros"]["passes"] is False
    assert spots["mean_constant"] == {"applicable": True, "passes": False, "value": 2.5}
    assert spots["input_identity"] == {"applicable": True, "passes": True}


def test_a_trivial_candidate_must_pass_every_trial():
    judged = contract()
    zero, tiny, large = torch.zeros(3), torch.full((3,), 5e-5), torch.ones(3)
    assert official.trivial_status([(zero, []), (tiny, [])], judged)["blind_spot"] is True
    spots = official.trivial_status([(zero, []), (large, []), (tiny, [])], judged)
    assert spots["zeros"]["passes"] is False and spots["trials"] == 3
    # the constant is the first trial's mean, the same value in every trial
    assert spots["mean_constant"]["value"] == 0.0 and spots["mean_constant"]["passes"] is False


def test_profile_rows_are_per_forward_and_longest_first():
    rows = profile._per_forward({"b": [30.0, 3], "a": [60.0, 6], "c": [30.0, 1]}, 3)
    assert rows == [
        {"name": "a", "device_us": 20.0, "calls": 2},
        {"name": "b", "device_us": 10.0, "calls": 1},
        {"name": "c", "device_us": 10.0, "calls": 1},
    ]


def test_check_protocol_names_the_bad_key():
    good = dict(settings.DEFAULTS)
    assert good["min_sample_ms"] == 1.0
    assert survey_timing.check_protocol(good) == {
        "warmup": 3,
        "rounds": 30,
        "invocations_per_pair": 10,
        "order_seed": 913,
    }
    with pytest.raises(KbfuseError, match=r"survey.rounds is 0: it must be an integer >= 1"):
        survey_timing.check_protocol({**good, "rounds": 0})
    with pytest.raises(KbfuseError, match=r"survey.cold_l2 is 'yes': it must be true or false"):
        survey_timing.check_protocol({**good, "cold_l2": "yes"})
    for bad in (0, -1.0, True, "1"):
        with pytest.raises(KbfuseError, match=r"survey.min_sample_ms is .*: it must be a number"):
            survey_timing.check_protocol({**good, "min_sample_ms": bad})
    assert survey_timing.check_protocol({**good, "min_sample_ms": None})["rounds"] == 30


def test_calls_per_sample_follow_the_fastest_baseline(monkeypatch):
    per_call = {"eager": 0.3, "inductor": 0.12}
    runs = {name: (lambda name=name: name) for name in per_call}
    monkeypatch.setattr(survey_timing, "per_call_ms", lambda run, device: per_call[run()])
    protocol = {"warmup": 3, "rounds": 30, "invocations_per_pair": 10, "order_seed": 913}
    sized, fields = survey_timing.sized_protocol(runs, protocol, "cuda", 1.0)
    # ceil(1.0 / 0.12) = 9 calls make a sample of the fastest last at least 1 ms
    assert sized == {**protocol, "invocations_per_pair": 9}
    assert fields == {"max_invocations_per_pair": 10, "min_sample_ms": 1.0,
                      "fastest_call_ms": 0.12, "invocations_per_pair": 9}  # fmt: skip
    per_call.update(eager=5.0, inductor=2.5)  # slow tasks: one call per sample
    assert survey_timing.sized_protocol(runs, protocol, "cuda", 1.0)[0]["invocations_per_pair"] == 1
    per_call.update(eager=0.01, inductor=0.004)  # capped at invocations_per_pair
    assert (
        survey_timing.sized_protocol(runs, protocol, "cuda", 1.0)[0]["invocations_per_pair"] == 10
    )
    # null: the study's fixed count, nothing called
    monkeypatch.setattr(survey_timing, "per_call_ms", lambda run, device: 1 / 0)
    sized, fields = survey_timing.sized_protocol(runs, protocol, "cuda", None)
    assert sized == protocol and fields["fastest_call_ms"] is None


def test_a_baseline_that_raises_is_left_out_of_the_sizing(monkeypatch):
    def broken():
        raise RuntimeError("no")

    monkeypatch.setattr(survey_timing, "per_call_ms", lambda run, device: run())
    protocol = {"warmup": 1, "rounds": 2, "invocations_per_pair": 8, "order_seed": 1}
    runs = {"eager": lambda: 0.5, "inductor": broken}
    assert survey_timing.sized_protocol(runs, protocol, "cpu", 1.0)[0]["invocations_per_pair"] == 2
    only_broken = {"inductor": broken}
    sized, fields = survey_timing.sized_protocol(only_broken, protocol, "cpu", 1.0)
    assert sized["invocations_per_pair"] == 8 and fields["fastest_call_ms"] is None


def test_per_call_ms_times_calls_after_a_warm_one():
    calls = []
    ms = survey_timing.per_call_ms(lambda: calls.append(1), "cpu", calls=4)
    assert len(calls) == 5 and 0 <= ms < 50


def test_methods_follow_the_device():
    assert survey_timing.methods("cuda", True) == ["events", "graph", "cold_l2"]
    assert survey_timing.methods("cuda", False) == ["events", "graph"]
    assert survey_timing.methods("cpu", True) == ["wall"]


def test_ratios_are_eager_over_baseline_per_method_and_skip_failures():
    stats = {"samples_ms": [2.0, 4.0], "median_ms": 3.0, "q1_ms": 2.5, "q3_ms": 3.5}
    half = {"samples_ms": [1.0, 2.0], "median_ms": 1.5, "q1_ms": 1.25, "q3_ms": 1.75}
    timing = {
        "eager": {"events": stats, "graph": stats},
        "inductor": {"events": half, "graph": None},
        "torchscript": {"events": half, "graph": half},
    }
    ratios = survey_timing._ratios(timing, ["events", "graph"], {"torchscript": {}})
    assert ratios == {
        "inductor": {
            "events": {
                "median": 2.0,
                "q1": 2.0,
                "q3": 2.0,
                "balanced": None,
                "balanced_rounds": 0,
            }
        }
    }


def test_torchscript_is_frozen_only_in_eval_semantics():
    from kbfuse.survey.baselines import _torchscript

    model, x = torch.nn.Linear(3, 2), torch.ones(1, 3)
    frozen = _torchscript(model.eval(), [x], "eval")
    assert [n for n, _ in frozen.named_parameters()] == []  # weights became constants
    traced = _torchscript(model.train(), [x], "kernelbench")
    assert [n for n, _ in traced.named_parameters()] == ["weight", "bias"]


def test_the_studys_recorded_config_leaves_the_survey_out():
    from kbfuse.tasks.kernelbench import recorded_config

    config = {"kernelbench": {"url": "/srv/kb.git"}, "tasks": [53], "survey": {"rounds": 3}}
    assert recorded_config(config) == {
        "kernelbench": {"url": "local mirror"},
        "tasks": [53],
    }
    assert config["survey"] == {"rounds": 3}  # the workflow's own config is left alone


def _allow_tf32_constant(traced) -> bool:
    """The last argument of the trace's aten::_convolution: cuDNN's allow_tf32, a constant."""
    (node,) = [n for n in traced.graph.nodes() if n.kind() == "aten::_convolution"]
    return bool(list(node.inputs())[-1].toIValue())


def test_a_trace_records_the_cudnn_tf32_switch_in_force_when_traced():
    """Why the survey traces TorchScript once per numerics mode: the switch becomes a constant
    of the graph (proven on the GPU by tests/test_survey_gpu.py)."""
    from kbfuse.survey import baselines

    model, x = torch.nn.Conv2d(3, 4, 3), torch.randn(1, 3, 8, 8)
    before = torch.backends.cudnn.allow_tf32
    try:
        for flag in (False, True):
            torch.backends.cudnn.allow_tf32 = flag
            traced = baselines._torchscript(model, [x], "kernelbench")
            torch.backends.cudnn.allow_tf32 = not flag  # changing it later changes nothing
            assert _allow_tf32_constant(traced) is flag
    finally:
        torch.backends.cudnn.allow_tf32 = before
    # traces, and max-autotune (whose choices and convolution templates follow the switch)
    assert baselines.MODE_BOUND == ("torchscript", "inductor-max-autotune-no-cudagraphs")
    assert baselines.AUTOTUNED == ("inductor-max-autotune-no-cudagraphs",)
