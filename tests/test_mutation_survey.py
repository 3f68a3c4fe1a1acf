"""The survey's result-deciding checks in the details that tests/test_survey_units.py and
tests/test_survey_classify.py leave open (found by mutation testing, docs/mutation.md):
correctness against eager, blind spots, determinism, the kernel classes and the timing
protocol's pure parts.
"""

from __future__ import annotations

import pytest
import torch
from contracts import contract

from kbfuse.checks import official
from kbfuse.errors import KbfuseError
from kbfuse.survey import correctness, determinism, settings
from kbfuse.survey import timing as survey_timing

V01 = contract(atol=1e-2, rtol=1e-2)  # KernelBench v0.1's float32 tolerance, for edge cases
PINNED = contract()  # the pin's: 1e-4


def f32(*values):
    return torch.tensor(values, dtype=torch.float32)


# --------------------------------------------------------------------------- correctness


def test_compare_records_both_directions_and_the_errors():
    # |ref - cand| = 0.0101 <= 1e-2 + 1e-2 * |cand| only when scaled by the larger candidate
    reference, candidate = f32(1.0, 0.0, -2.0), f32(1.0101, 0.0, -2.0)
    block = correctness.compare([(reference, candidate)], V01)
    assert block["official_pass"] is True
    assert block["direction"] == {"candidate_scaled_pass": True, "reference_scaled_pass": True}
    assert block["atol"] == 1e-2 and block["rtol"] == 1e-2 and block["source"] == "eval.py:1 test"
    assert block["trials"] == 1 and block["failed_trials"] == []
    assert block["numel"] == 3 and block["not_bit_equal"] == 1
    assert block["max_abs"] == pytest.approx(0.0101, rel=1e-5)
    assert block["max_rel"] == pytest.approx(0.0101, rel=1e-5)
    edge = correctness.compare([(f32(2.0), f32(2.0302))], V01)  # 0.0302 <= 0.01 + 0.020302 only
    assert edge["official_pass"] is True
    assert edge["direction"] == {"candidate_scaled_pass": True, "reference_scaled_pass": False}
    swapped = correctness.compare([(f32(2.0302), f32(2.0))], V01)
    assert swapped["official_pass"] is False
    assert swapped["direction"] == {"candidate_scaled_pass": False, "reference_scaled_pass": True}


def test_compare_takes_the_relative_error_where_the_reference_is_not_zero():
    block = correctness.compare([(f32(0.0, 4.0, -1.0), f32(3.0, 5.0, -1.5))], V01)
    assert block["max_abs"] == 3.0
    assert block["max_rel"] == 0.5  # |(-1) - (-1.5)| / 1; the zero reference is left out
    assert block["not_bit_equal"] == 3
    assert block["official_pass"] is False
    zeros = correctness.compare([(f32(0.0, 0.0), f32(0.5, 0.0))], V01)
    assert zeros["max_rel"] == 0.0 and zeros["max_abs"] == 0.5


def test_compare_of_empty_outputs():
    empty = torch.zeros(0, 3)
    block = correctness.compare([(empty, empty.clone())], V01)
    assert block["max_abs"] == 0.0 and block["max_rel"] == 0.0
    assert block["numel"] == 0 and block["not_bit_equal"] == 0
    assert block["official_pass"] is True


@pytest.mark.parametrize(
    ("candidate", "message"),
    [
        ((f32(1.0),), r"^the output is a tuple, not a tensor$"),
        (
            torch.ones(1, dtype=torch.float64),
            r"^outputs must be float32 \(reference torch\.float32, "
            r"candidate torch\.float64\)$",
        ),  # fmt: skip
        (f32(1.0, 2.0), r"^output shape \(2,\) differs from eager's \(1,\)$"),
    ],
)
def test_compare_refuses_what_it_cannot_judge(candidate, message):
    with pytest.raises(KbfuseError, match=message):
        correctness.compare([(f32(1.0), candidate)], V01)


def test_compare_refuses_a_reference_that_is_not_float32():
    with pytest.raises(KbfuseError, match=r"reference torch\.float16, candidate torch\.float32"):
        correctness.compare([(torch.ones(1, dtype=torch.float16), f32(1.0))], V01)


def test_output_stats_of_a_tensor():
    stats = correctness.output_stats(f32(1.0, -3.0, 2.0, 0.0).reshape(2, 2))
    assert stats == {
        "shape": [2, 2],
        "dtype": "float32",
        "mean": 0.0,
        "std": pytest.approx(float(torch.tensor([1.0, -3.0, 2.0, 0.0]).double().std())),
        "abs_mean": 1.5,
        "abs_max": 3.0,
    }
    one = correctness.output_stats(f32(-2.0))
    assert one == {
        "shape": [1],
        "dtype": "float32",
        "mean": -2.0,
        "std": 0.0,
        "abs_mean": 2.0,
        "abs_max": 2.0,
    }
    two = correctness.output_stats(f32(1.0, 3.0))
    assert two["std"] == pytest.approx(2**0.5)


def test_output_stats_of_an_empty_output_and_of_a_non_tensor():
    stats = correctness.output_stats(torch.zeros(0, dtype=torch.float64))
    assert stats == {
        "shape": [0],
        "dtype": "float64",
        "mean": 0.0,
        "std": 0.0,
        "abs_mean": 0.0,
        "abs_max": 0.0,
    }
    with pytest.raises(KbfuseError, match=r"^the task's forward returns a list, not a tensor$"):
        correctness.output_stats([f32(1.0)])


# --------------------------------------------------------------------------- blind spots


def spots(reference, inputs, judged=V01):
    return official.trivial_status([(reference, inputs)], judged)


def test_blind_spots_use_the_official_tolerance_and_name_what_they_compared():
    # zeros pass for |ref| <= 0.01 and fail just above it
    assert spots(f32(0.01, -0.01), [])["zeros"]["passes"] is True
    found = spots(f32(0.0105, 0.0), [])
    assert found["zeros"] == {"applicable": True, "passes": False}
    assert found["compared"] == "eager output on KernelBench's 1 official trials"
    # the mean (1.0) passes when every value is within 0.01 + 0.01 * 1.0 of it
    near = spots(f32(0.99, 1.01), [])
    assert near["mean_constant"] == {"applicable": True, "passes": True, "value": 1.0}
    far = spots(f32(0.97, 1.03), [])
    assert far["mean_constant"]["passes"] is False
    assert far["mean_constant"]["value"] == pytest.approx(1.0)
    # at the pin's 1e-4 the same near-constant output is no blind spot
    assert spots(f32(0.99, 1.01), [], PINNED)["blind_spot"] is False
    assert spots(f32(1e-4, -1e-4), [], PINNED)["zeros"]["passes"] is True


def test_the_identity_candidate_is_the_first_input_of_the_outputs_layout():
    reference = f32(1.0, 2.0)
    inputs = [
        torch.ones(2, dtype=torch.float64),  # other dtype
        f32(1.0, 2.0, 3.0),  # other shape
        5,
        f32(1.0, 2.0),  # the first that fits: equal, passes
        f32(9.0, 9.0),
    ]
    assert spots(reference, inputs)["input_identity"] == {"applicable": True, "passes": True}
    wrong_first = [f32(9.0, 9.0), f32(1.0, 2.0)]
    assert spots(reference, wrong_first)["input_identity"] == {
        "applicable": True,
        "passes": False,
    }


def test_blind_spots_of_an_empty_output():
    found = spots(torch.zeros(0), [])
    assert found["mean_constant"]["value"] == 0.0
    assert found["zeros"]["passes"] is True


# --------------------------------------------------------------------------- determinism


def test_same_bits_of_half_double_and_integer_tensors():
    half = torch.tensor([0.0], dtype=torch.float16)
    assert determinism.same_bits(half, half.clone())
    assert not determinism.same_bits(half, -half)
    double = torch.tensor([0.0], dtype=torch.float64)
    assert not determinism.same_bits(double, -double)
    ints = torch.tensor([1, 2])
    assert determinism.same_bits(ints, ints.clone())
    assert not determinism.same_bits(ints, torch.tensor([1, 3]))
    assert not determinism.same_bits(f32(1.0, 2.0), f32(1.0, 2.0).reshape(2, 1))
    assert not determinism.same_bits((f32(1.0),), f32(1.0))
    strided = torch.arange(6, dtype=torch.float32).reshape(2, 3).t()  # not contiguous
    assert determinism.same_bits(strided, strided.contiguous())


def test_seeded_call_sets_the_seed_and_turns_gradients_off():
    weight = torch.ones(1, requires_grad=True)

    def run():
        return torch.rand(2) * weight

    out = determinism.seeded_call(run, 5)
    torch.manual_seed(5)
    assert torch.equal(out, torch.rand(2))
    assert out.requires_grad is False


def test_a_deterministic_reference():
    block = determinism.check(lambda: f32(1.0, 2.0), 3)
    assert block == {
        "same_seed_equal": True,
        "different_seed_equal": True,
        "verdict": "deterministic",
    }


def test_a_reference_that_follows_the_seed_is_nondeterministic():
    seeds = []

    def run():
        seeds.append(torch.initial_seed())
        return torch.rand(3)

    block = determinism.check(run, 41)
    assert seeds == [41, 41, 42]
    assert block == {
        "same_seed_equal": True,
        "different_seed_equal": False,
        "verdict": "nondeterministic",
    }


def test_a_reference_that_differs_under_one_seed_is_nondeterministic():
    calls = iter([f32(1.0), f32(2.0), f32(1.0)])
    block = determinism.check(lambda: next(calls), 0)
    assert block == {
        "same_seed_equal": False,
        "different_seed_equal": True,
        "verdict": "nondeterministic",
    }


def test_same_bits_needs_the_same_dtype_even_for_equal_bit_patterns():
    one = f32(1.0)
    assert not determinism.same_bits(one, one.view(torch.int32))
    assert not determinism.same_bits(one.view(torch.int32), one)


def test_same_bits_of_one_byte_floats_compares_their_bits():
    """float8 is compared bit for bit like the wider floats: 0.0 and -0.0 differ, a NaN equals
    its own copy (by value, neither would hold)."""
    float8 = f32(1.0, -2.0, 448.0).to(torch.float8_e4m3fn)
    assert determinism.same_bits(float8, float8.clone())
    assert not determinism.same_bits(float8, f32(1.0, 2.0, 448.0).to(torch.float8_e4m3fn))
    zero, negative_zero = f32(0.0).to(torch.float8_e4m3fn), f32(-0.0).to(torch.float8_e4m3fn)
    assert not determinism.same_bits(zero, negative_zero)
    nan = f32(float("nan")).to(torch.float8_e4m3fn)
    assert determinism.same_bits(nan, nan.clone())


# --------------------------------------------------------------------------- timing (pure parts)


class FakeClock:
    def __init__(self, *readings):
        self.readings = list(readings)

    def __call__(self):
        return self.readings.pop(0)


def test_per_call_ms_is_the_mean_of_three_calls_in_milliseconds(monkeypatch):
    calls = []
    monkeypatch.setattr(survey_timing.time, "perf_counter", FakeClock(10.0, 10.006))
    assert survey_timing.per_call_ms(lambda: calls.append(1), "cpu") == pytest.approx(2.0)
    assert len(calls) == 4  # one to warm, three timed


def test_per_call_ms_synchronises_the_gpu_after_the_warm_call_and_the_timed_ones(monkeypatch):
    events = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: events.append("sync"))
    monkeypatch.setattr(survey_timing.time, "perf_counter", FakeClock(0.0, 0.002))
    ms = survey_timing.per_call_ms(lambda: events.append("run"), "cuda", calls=2)
    assert ms == pytest.approx(1.0)
    assert events == ["run", "sync", "run", "run", "sync"]
    events.clear()
    monkeypatch.setattr(survey_timing.time, "perf_counter", FakeClock(0.0, 0.002))
    survey_timing.per_call_ms(lambda: events.append("run"), "cpu", calls=2)
    assert events == ["run", "run", "run"]  # no GPU: nothing to wait for


def test_check_protocol_takes_order_seed_zero_and_names_a_negative_one():
    good = dict(settings.DEFAULTS)
    assert survey_timing.check_protocol({**good, "order_seed": 0})["order_seed"] == 0
    with pytest.raises(
        KbfuseError, match=r"^survey\.order_seed is -1: it must be an integer >= 0$"
    ):
        survey_timing.check_protocol({**good, "order_seed": -1})
    for key in ("warmup", "invocations_per_pair"):
        with pytest.raises(KbfuseError, match=rf"^survey\.{key} is 0: it must be an integer >= 1$"):
            survey_timing.check_protocol({**good, key: 0})
    assert survey_timing.check_protocol({**good, "min_sample_ms": 2})["warmup"] == 3
    assert survey_timing.check_protocol({**good, "min_sample_ms": 0.5, "cold_l2": False})


PROTOCOL = {"warmup": 1, "rounds": 3, "invocations_per_pair": 8, "order_seed": 1}


def test_sizing_passes_the_device_and_skips_a_broken_first_baseline(monkeypatch):
    seen = []

    def per_call(run, device):
        seen.append(device)
        return run()

    def broken():
        raise RuntimeError("no")

    monkeypatch.setattr(survey_timing, "per_call_ms", per_call)
    runs = {"broken": broken, "eager": lambda: 0.25}
    sized, fields = survey_timing.sized_protocol(runs, PROTOCOL, "cuda", 1.0)
    assert seen == ["cuda", "cuda"]
    assert sized == {**PROTOCOL, "invocations_per_pair": 4}
    assert fields["fastest_call_ms"] == 0.25


def test_a_call_too_fast_to_measure_takes_the_most_calls(monkeypatch):
    monkeypatch.setattr(survey_timing, "per_call_ms", lambda run, device: 0.0)
    sized, fields = survey_timing.sized_protocol({"eager": None}, PROTOCOL, "cpu", 1.0)
    assert sized["invocations_per_pair"] == 8
    assert fields == {
        "max_invocations_per_pair": 8,
        "min_sample_ms": 1.0,
        "fastest_call_ms": 0.0,
        "invocations_per_pair": 8,
    }


def figures(*samples):
    return {"samples_ms": list(samples)}


def test_no_ratios_when_eager_failed_although_it_has_figures():
    timing = {"eager": {"wall": figures(2.0)}, "inductor": {"wall": figures(1.0)}}
    assert survey_timing._ratios(timing, ["wall"], {"eager": {}}) == {}
    assert survey_timing._ratios({"inductor": {"wall": figures(1.0)}}, ["wall"], {}) == {}


def test_ratios_go_on_past_a_method_a_baseline_lacks_and_count_the_cycle():
    timing = {
        "eager": {"events": figures(2.0, 2.0, 2.0), "graph": figures(4.0, 4.0, 4.0)},
        "inductor": {"events": None, "graph": figures(1.0, 2.0, 4.0)},
        "torchscript": {"events": figures(1.0, 1.0, 1.0), "graph": figures(2.0, 2.0, 2.0)},
    }
    ratios = survey_timing._ratios(timing, ["events", "graph"], {})
    assert list(ratios["inductor"]) == ["graph"]
    assert ratios["inductor"]["graph"]["median"] == 2.0
    # three implementations have graph figures: one cycle is three rounds
    assert ratios["inductor"]["graph"]["balanced_rounds"] == 3
    assert ratios["inductor"]["graph"]["balanced"] == pytest.approx(2.0)
    # two have event figures: one cycle of two, so two of the three rounds are balanced
    assert ratios["torchscript"]["events"]["balanced_rounds"] == 2


# --------------------------------------------------------------------------- timing (the loop)


class Clock:
    """time.perf_counter stand-in that advances only when a baseline runs."""

    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def timed(clock: Clock, ms: float, calls: list | None = None):
    def run():
        clock.now += ms / 1e3
        if calls is not None:
            calls.append(1)

    return run


LOOP = {"warmup": 2, "rounds": 4, "invocations_per_pair": 3, "order_seed": 7}


def test_wall_timing_on_the_cpu_samples_each_baseline_per_round(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(survey_timing.time, "perf_counter", clock)
    calls, log = [], []
    seeds = []
    orders = survey_timing.measure.round_orders

    def spy(names, rounds, seed):
        seeds.append(seed)
        return orders(names, rounds, seed)

    monkeypatch.setattr(survey_timing.measure, "round_orders", spy)
    runs = {"eager": timed(clock, 2.0, calls), "inductor": timed(clock, 0.5)}
    timing, ratios, failures = survey_timing.time_baselines(
        runs, LOOP, "cpu", True, "53", log.append
    )
    assert failures == {}
    assert len(calls) == 2 + 4 * 3  # warm-up calls, then invocations_per_pair per round
    assert list(timing) == ["eager", "inductor"]
    assert list(timing["eager"]) == ["wall"]
    assert timing["eager"]["wall"]["samples_ms"] == pytest.approx([2.0] * 4)
    assert timing["inductor"]["wall"]["median_ms"] == pytest.approx(0.5)
    assert sorted(timing["eager"]["wall"]["positions"]) == [0, 0, 1, 1]
    assert list(ratios) == ["inductor"]
    assert ratios["inductor"]["wall"]["median"] == pytest.approx(4.0)
    assert log[0] == "timing wall: ['eager', 'inductor']"
    assert seeds == ["7/53/wall"]  # the block's seed decides the orders
    expected = orders(["eager", "inductor"], 4, "7/53/wall")
    assert log[1:] == [f"7/53/wall: round {i + 1}/4 order {o}" for i, o in enumerate(expected)]
    assert len(log) == 5


def test_a_baseline_that_fails_while_timed_is_recorded_and_the_others_timed_again(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(survey_timing.time, "perf_counter", clock)
    state = {"calls": 0}

    def flaky():
        state["calls"] += 1
        if state["calls"] > 3:  # passes the warm-up, fails in the rounds
            raise RuntimeError("device lost\nsecond line")
        clock.now += 0.001

    log = []
    runs = {"eager": timed(clock, 1.0), "torchscript": flaky, "inductor": timed(clock, 0.5)}
    timing, ratios, failures = survey_timing.time_baselines(
        runs, LOOP, "cpu", False, "t", log.append
    )
    assert failures == {
        "torchscript": {"stage": "timing", "error": "RuntimeError", "message": "device lost"}
    }
    assert timing["torchscript"] == {"wall": None}
    assert timing["inductor"]["wall"]["samples_ms"] == pytest.approx([0.5] * 4)
    assert list(ratios) == ["inductor"]
    assert ratios["inductor"]["wall"]["median"] == pytest.approx(2.0)
    assert "wall: torchscript failed while timed: RuntimeError('device lost\\nsecond line'); " \
        "timing the others" in log  # fmt: skip


def test_when_every_baseline_fails_a_block_has_no_samples():
    def broken():
        raise ValueError("x")

    failures = {"eager": {"stage": "build"}}
    runs = {"eager": broken, "inductor": broken}
    result = survey_timing.time_method("wall", runs, LOOP, "s", lambda _m: None, failures)
    assert result == ({}, {})
    assert failures == {
        "eager": {"stage": "build"},  # failed before: not timed, kept
        "inductor": {"stage": "timing", "error": "ValueError", "message": "x"},
    }


def test_a_baseline_failure_carries_its_name_and_cause():
    cause = KeyError("k")
    failed = survey_timing.BaselineFailed("eager", cause)
    assert failed.name == "eager" and failed.exc is cause
    assert str(failed) == "eager: 'k'"
    guarded = survey_timing._guarded("inductor", lambda: 5)
    assert guarded() == 5


def fake_gpu_timer(seen: list, name: str | None = None):
    def timer(runs, protocol, seed, log, method="events"):
        seen.append((name or method, list(runs), seed))
        log(f"timed {name or method}")
        rounds = protocol["rounds"]
        samples = {name: [float(run())] * rounds for name, run in runs.items()}
        return samples, {name: list(range(rounds)) for name in runs}

    return timer


def test_gpu_methods_time_events_graph_and_cold_l2_without_the_uncapturable(monkeypatch):
    seen, log = [], []
    monkeypatch.setattr(survey_timing, "_events", fake_gpu_timer(seen))
    monkeypatch.setitem(survey_timing._TIMERS, "events", fake_gpu_timer(seen))
    monkeypatch.setitem(survey_timing._TIMERS, "cold_l2", fake_gpu_timer(seen, "cold_l2"))
    problems = {"torchscript": "RuntimeError: operation not permitted when stream is capturing"}
    captured = []

    def capture(run, warmup):
        captured.append(warmup)
        return problems.get(run.__name__)

    monkeypatch.setattr(survey_timing, "capture_problem", capture)

    def named(name, ms):
        def run():
            return ms

        run.__name__ = name
        return run

    runs = {n: named(n, ms) for n, ms in (("eager", 2.0), ("torchscript", 1.0), ("inductor", 4.0))}
    timing, ratios, failures = survey_timing.time_baselines(
        runs, LOOP, "cuda", True, "81", log.append
    )
    assert [(m, names) for m, names, _ in seen] == [
        ("events", ["eager", "torchscript", "inductor"]),
        ("graph", ["eager", "inductor"]),
        ("cold_l2", ["eager", "torchscript", "inductor"]),
    ]
    assert [seed for _, _, seed in seen] == ["7/81/events", "7/81/graph", "7/81/cold_l2"]
    assert captured == [2, 2, 2]
    assert timing["torchscript"]["graph"] is None
    assert timing["torchscript"]["graph_missing"] == problems["torchscript"]
    assert timing["eager"]["graph_missing"] is None
    assert timing["inductor"]["cold_l2"]["median_ms"] == 4.0
    assert failures == {}
    assert ratios["torchscript"] == {
        "events": pytest.approx(ratios["torchscript"]["events"]),
        "cold_l2": pytest.approx(ratios["torchscript"]["cold_l2"]),
    }
    assert ratios["torchscript"]["events"]["median"] == 2.0
    assert ratios["inductor"]["graph"]["median"] == 0.5
    assert "graph: torchscript cannot be captured: " + problems["torchscript"] in log
    assert [line for line in log if line.startswith("timed ")] == [
        "timed events",
        "timed graph",
        "timed cold_l2",
    ]


def test_a_graph_block_that_fails_as_a_whole_leaves_graph_figures_out(monkeypatch):
    seen, log = [], []

    def graph_fails(runs, protocol, seed, log, method="events"):
        if method == "graph":
            raise KbfuseError("capture of the block failed " + "x" * 2000)
        return fake_gpu_timer(seen)(runs, protocol, seed, log, method)

    monkeypatch.setattr(survey_timing, "_events", graph_fails)
    monkeypatch.setitem(survey_timing._TIMERS, "events", fake_gpu_timer(seen))
    monkeypatch.setattr(survey_timing, "capture_problem", lambda run, warmup: None)
    runs = {"eager": lambda: 2.0, "inductor": lambda: 1.0}
    timing, ratios, failures = survey_timing.time_baselines(
        runs, LOOP, "cuda", False, "9", log.append
    )
    missing = timing["inductor"]["graph_missing"]
    assert missing.startswith("capture of the block failed x") and len(missing) == 1000
    assert timing["eager"]["graph"] is None and timing["eager"]["events"]["median_ms"] == 2.0
    assert list(ratios["inductor"]) == ["events"]
    assert any(line.startswith("graph: capture of the block failed") for line in log)
    assert failures == {}


def test_a_refusal_outside_the_graph_block_is_raised(monkeypatch):
    def refuses(runs, protocol, seed, log, method="events"):
        raise KbfuseError("events: bad samples")

    monkeypatch.setitem(survey_timing._TIMERS, "events", refuses)
    with pytest.raises(KbfuseError, match=r"^events: bad samples$"):
        survey_timing.time_baselines({"eager": lambda: 1.0}, LOOP, "cuda", False, "9", print)
