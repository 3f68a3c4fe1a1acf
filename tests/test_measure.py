"""The timing protocol without a GPU: balanced orders, interleaving, and a synthetic timer whose
samples depend on the position an implementation runs at in its round."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from kbfuse.errors import KbfuseError
from kbfuse.timing.measure import (
    block_seed,
    interleave,
    paired_ratios,
    position_counts,
    position_effect,
    round_orders,
)

NAMES = ["eager", "torchscript", "inductor", "nvrtc-cubin-noftz", "nvrtc-ptx-ftz"]


def study_orders(names, rounds, seed):
    """The original study's orders: one random.Random(seed) reshuffled every round."""
    rng = random.Random(seed)
    orders = []
    for _ in range(rounds):
        order = list(names)
        rng.shuffle(order)
        orders.append(order)
    return orders


# --------------------------------------------------------------------------- orders


@pytest.mark.parametrize("count", [1, 2, 3, 5, 6])
@pytest.mark.parametrize("rounds", [1, 2, 7, 25, 35])
def test_every_name_takes_every_position_equally_often_to_within_one(count, rounds):
    names = NAMES[:count] if count <= len(NAMES) else [f"v{i}" for i in range(count)]
    orders = round_orders(names, rounds, "913/53/full/events")
    assert len(orders) == rounds
    assert all(sorted(order) == sorted(names) for order in orders)
    counts = position_counts(orders)
    for position in range(count):
        column = [counts.get(name, [0] * count)[position] for name in names]
        assert max(column) - min(column) <= 1, (position, column)
    if rounds % count == 0:  # whole cycles: exactly balanced
        assert all(row == [rounds // count] * count for row in counts.values())


def test_two_implementations_alternate_within_each_cycle():
    orders = round_orders(["on", "off"], 35, block_seed(913, 53, "ftz_cost", "nvrtc-cubin"))
    for first, second in zip(orders[0::2], orders[1::2], strict=False):
        assert first == second[::-1]
    assert position_counts(orders)["on"] in ([18, 17], [17, 18])


def test_orders_are_reproducible_and_differ_between_blocks():
    one = round_orders(NAMES, 25, block_seed(913, 53, "full", "events"))
    assert one == round_orders(NAMES, 25, block_seed(913, 53, "full", "events"))
    assert one != round_orders(NAMES, 25, block_seed(913, 81, "full", "events"))
    assert one != round_orders(NAMES, 25, block_seed(913, 53, "tail", "events"))
    assert len({tuple(order) for order in one}) > len(NAMES)  # not one cycle repeated
    assert block_seed(913, 53, "small", "full", "graph") == "913/53/small/full/graph"


def test_the_study_orders_were_unbalanced():
    """What the issue measured: one reused shuffle sequence, very uneven first positions."""
    first = position_counts(study_orders(NAMES, 25, 913))
    firsts = [first[name][0] for name in NAMES]
    assert max(firsts) - min(firsts) >= 3
    assert [row[0] for row in position_counts(round_orders(NAMES, 25, 913)).values()] == [5] * 5


@pytest.mark.parametrize(
    ("names", "rounds", "match"),
    [
        ([], 3, "no implementations"),
        (["a", "a"], 3, "names repeat"),
        (["a"], 0, "rounds is 0"),
        (["a"], True, "rounds is True"),
        (["a"], 2.0, "rounds is 2.0"),
    ],
)
def test_round_orders_rejects_bad_input(names, rounds, match):
    with pytest.raises(KbfuseError, match=match):
        round_orders(names, rounds, 0)


# --------------------------------------------------------------------------- a synthetic timer


class PositionTimer:
    """measure_pair for `interleave`: each implementation's true time, times `penalty` for
    whatever runs first in its round (the effect measured on the H200)."""

    def __init__(self, true_ms: dict[str, float], width: int, penalty: float):
        self.true_ms, self.width, self.penalty = true_ms, width, penalty
        self.calls = 0

    def __call__(self, runner) -> float:
        position = self.calls % self.width
        self.calls += 1
        return runner() * (self.penalty if position == 0 else 1.0)


def run_synthetic(orders, true_ms, penalty=1.14):
    runners = {name: (lambda ms=ms: ms) for name, ms in true_ms.items()}
    timer = PositionTimer(true_ms, len(true_ms), penalty)
    return interleave(runners, orders, timer)


def test_interleave_records_each_sample_with_its_position():
    orders = [["a", "b"], ["b", "a"], ["a", "b"]]
    samples, positions = run_synthetic(orders, {"a": 1.0, "b": 2.0}, penalty=10.0)
    assert positions == {"a": [0, 1, 0], "b": [1, 0, 1]}
    assert samples == {"a": [10.0, 1.0, 10.0], "b": [2.0, 20.0, 2.0]}


def test_balanced_orders_cancel_a_position_effect_the_study_orders_do_not():
    true_ms = {"on": 0.0300, "off": 0.0291}  # FTZ-on 3.1 % slower, as on task 95
    truth = true_ms["on"] / true_ms["off"]
    balanced = round_orders(list(true_ms), 35, "913/95/ftz_cost/nvrtc-cubin")
    samples, positions = run_synthetic(balanced, true_ms)
    ratio = paired_ratios(samples["on"], samples["off"], cycle=2)
    assert ratio["balanced"] == pytest.approx(truth, rel=1e-12)
    assert ratio["balanced_rounds"] == 34
    effect = position_effect(samples, positions)
    # pooled over both implementations, 3 % apart: the penalty to 0.02 %
    assert effect["first_over_others"] == pytest.approx(1.14, rel=2e-4)
    assert effect["last_over_others"] == pytest.approx(1 / 1.14, rel=2e-4)
    assert (effect["first_n"], effect["others_n"]) == (35, 35)

    study = study_orders(list(true_ms), 35, 913)
    samples, _ = run_synthetic(study, true_ms)
    per_round = paired_ratios(samples["on"], samples["off"])
    # every round is inflated one way or the other: the median lands on one side, far from 1.031
    assert abs(per_round["median"] / truth - 1) > 0.1


def test_balanced_orders_cancel_it_for_five_implementations():
    true_ms = dict(zip(NAMES, [0.050, 0.046, 0.035, 0.034, 0.034], strict=True))
    orders = round_orders(NAMES, 25, "913/53/tail/graph")
    samples, positions = run_synthetic(orders, true_ms)
    for baseline in NAMES[:3]:
        ratio = paired_ratios(samples[baseline], samples["nvrtc-cubin-noftz"], cycle=5)
        assert ratio["balanced"] == pytest.approx(true_ms[baseline] / 0.034, rel=1e-12)
    for name in NAMES:
        assert sum(1 for p in positions[name] if p == 0) == 5
        assert np.median(samples[name]) == pytest.approx(true_ms[name])


def test_position_effect_without_an_effect_and_with_one_side_empty():
    block = {"a": [1.0, 1.0, 1.0], "b": [2.0, 2.0, 2.0], "c": [3.0, 3.0, 3.0]}
    orders = {"a": [0, 1, 2], "b": [1, 2, 0], "c": [2, 0, 1]}
    effect = position_effect(block, orders)
    assert effect["first_over_others"] == effect["last_over_others"] == 1.0
    assert (effect["first_n"], effect["others_n"]) == (3, 6)
    assert position_effect({"a": [1.0, 2.0], "b": [2.0, 1.0]}, {"a": [1, 2], "b": [2, 1]}) is None
    assert position_effect({"a": [1.0, 2.0]}, {"a": [0, 1]}) is None  # no round level of its own
    with pytest.raises(KbfuseError, match="'b' has 2 samples but 1 positions"):
        position_effect({"a": [1.0, 2.0], "b": [1.0, 2.0]}, {"a": [0, 1], "b": [0]})


def test_paired_ratios_balanced_needs_a_whole_cycle():
    ratio = paired_ratios([2.0, 2.0, 2.0], [1.0, 1.0, 1.0], cycle=2)
    assert ratio["balanced"] == 2.0 and ratio["balanced_rounds"] == 2
    short = paired_ratios([2.0], [1.0], cycle=2)
    assert short["balanced"] is None and short["balanced_rounds"] == 0
    assert math.isclose(paired_ratios([4.0, 1.0], [1.0, 1.0], cycle=2)["balanced"], 2.0)
