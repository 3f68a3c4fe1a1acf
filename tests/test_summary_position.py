"""The position effect: the pooled estimator (`measure.position_effect`) on synthetic blocks,
and the summary's table built from records that carry each sample's round position.

The synthetic block is shaped like the H200 reference's task-81 small-shape tail in CUDA
graphs: 14 implementations, 25 balanced rounds, eager's graph at 10.1 µs, two fast kernels at
3.45 µs and the rest at 3.0 µs, and rounds 4-14 in a slow phase where every implementation
but eager takes at least 4.5 µs. The estimator must read no effect there, where the
per-implementation reading the summary used before (median of one implementation's first
samples over the median of its others) reads 1.2-1.5, and must still find a real penalty on
the first or the last position, in the same two bands.
"""

from __future__ import annotations

import types

import numpy as np
import pytest

from kbfuse.results.tables import position_effect_table
from kbfuse.timing.measure import position_effect, relative_samples, round_orders

NAMES = ["eager", "torchscript", "inductor", *(f"variant{i}" for i in range(9)), "fast", "fast12"]
LEVEL_US = {name: 3.0 for name in NAMES} | {"eager": 10.1, "fast": 3.45, "fast12": 3.45}
ORDERS = round_orders(NAMES, 25, "913/81/small/tail/graph")
SLOW_ROUNDS = range(3, 14)  # rounds 4-14, counted from 1
SLOW_FLOOR_US = 4.5


def two_band_block(first=1.0, last=1.0, noise=0.01, seed=0):
    """(samples, positions) per implementation: the level, the slow phase's floor for every
    implementation but eager, a factor on the first and on the last position, and
    multiplicative noise (lognormal, `noise` its sigma)."""
    rng = np.random.default_rng(seed)
    samples = {name: [] for name in NAMES}
    positions = {name: [] for name in NAMES}
    for index, order in enumerate(ORDERS):
        for position, name in enumerate(order):
            us = LEVEL_US[name]
            if index in SLOW_ROUNDS and name != "eager":
                us = max(us, SLOW_FLOOR_US)
            us *= first if position == 0 else last if position == len(order) - 1 else 1.0
            samples[name].append(us * float(np.exp(rng.normal(0.0, noise))))
            positions[name].append(position)
    return samples, positions


def per_implementation_reading(samples, positions):
    """What the summary reported before: per implementation, median of its first-position
    samples over the median of its others."""
    ratios = []
    for name in samples:
        values, where = np.asarray(samples[name]), np.asarray(positions[name])
        ratios.append(np.median(values[where == 0]) / np.median(values[where != 0]))
    return ratios


def test_the_two_bands_are_removed_with_each_rounds_level():
    samples, positions = two_band_block(noise=0.0)
    relative = relative_samples(samples, positions)
    # every 3.0 µs implementation is as fast as usual in every round; eager (which does not
    # follow the slow phase) and the fast kernels (which it slows less) are not
    for name in NAMES:
        if LEVEL_US[name] == 3.0:
            assert relative[name] == pytest.approx(np.ones(25), rel=1e-12), name
    low, high = sorted({round(float(v), 9) for v in relative["fast"]})
    assert high / low == pytest.approx(3.45 / 3.0)  # 3.45 µs against 3.0, then 4.5 against 4.5
    effect = position_effect(samples, positions)
    assert effect == {
        "first_n": 25,
        "others_n": 325,
        "first_over_others": 1.0,
        "last_over_others": 1.0,
        "each_position_min": 1.0,
        "each_position_max": 1.0,
    }
    # the old reading: an implementation first once in each phase reads 1.5 or 1.25
    old = per_implementation_reading(samples, positions)
    assert np.median(old) == pytest.approx(1.25) and max(old) == pytest.approx(1.5)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_with_noise_the_two_bands_read_as_no_effect(seed):
    samples, positions = two_band_block(seed=seed)
    effect = position_effect(samples, positions)
    assert effect["first_over_others"] == pytest.approx(1.0, abs=0.005)
    assert effect["last_over_others"] == pytest.approx(1.0, abs=0.005)
    assert 0.99 < effect["each_position_min"] <= effect["each_position_max"] < 1.011
    assert np.median(per_implementation_reading(samples, positions)) > 1.2


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("penalty", [1.02, 1.05])
def test_a_real_first_position_penalty_is_found_in_the_two_bands(seed, penalty):
    samples, positions = two_band_block(first=penalty, seed=seed)
    effect = position_effect(samples, positions)
    assert effect["first_over_others"] == pytest.approx(penalty, abs=0.005)
    assert effect["each_position_max"] == effect["first_over_others"]  # it stands out
    assert effect["last_over_others"] == pytest.approx(1.0, abs=0.005)


def test_a_last_position_penalty_is_found_and_the_first_is_clean():
    samples, positions = two_band_block(last=1.05, noise=0.0)
    effect = position_effect(samples, positions)
    assert effect["last_over_others"] == pytest.approx(1.05, rel=1e-12)
    assert effect["first_over_others"] == pytest.approx(1.0, rel=1e-12)
    assert effect["each_position_max"] == effect["last_over_others"]


def test_two_implementations_apart_do_not_read_as_an_effect():
    """An FTZ-cost pair 3 % apart in balanced orders (35 rounds: "off" first 18 times, "on"
    17). With only the round's level removed, the first-position median sits on "off" and the
    others' on "on": first / others 0.970 without any effect; with each implementation's own
    level removed too it reads 1."""
    orders = round_orders(["on", "off"], 35, "913/95/ftz_cost/nvrtc-cubin")
    level = {"on": 0.0300, "off": 0.0291}
    samples = {name: [level[name]] * 35 for name in level}
    positions = {name: [order.index(name) for order in orders] for name in level}
    effect = position_effect(samples, positions)
    assert effect["first_over_others"] == pytest.approx(1.0, rel=1e-12)
    assert effect["last_over_others"] == pytest.approx(1.0, rel=1e-12)
    grid = np.array([samples["on"], samples["off"]])
    rounds_only = np.concatenate(grid / np.median(grid, axis=0))
    where = np.concatenate([positions["on"], positions["off"]])
    first = np.median(rounds_only[where == 0]) / np.median(rounds_only[where != 0])
    assert first == pytest.approx(0.0291 / 0.0300)


def measured(orders, name, true_ms, penalty):
    samples, positions = [], []
    for order in orders:
        position = order.index(name)
        samples.append(true_ms * (penalty if position == 0 else 1.0))
        positions.append(position)
    return {"samples_ms": samples, "positions": positions, "median_ms": true_ms}


def test_position_effect_table_shows_each_block():
    names = ["eager", "inductor", "v"]
    orders = round_orders(names, 6, "913/53/full/graph")
    timing = {
        "measurements": {
            "full/graph": {
                n: measured(orders, n, ms, 1.1) for n, ms in zip(names, [3, 2, 1], strict=True)
            },
            "tail/graph": {n: measured(orders, n, 1.0, 1.0) for n in names},
        }
    }
    pair = round_orders(["on", "off"], 4, "x")
    controls = {
        "small_shape": {"measurements": {"full/events": {"eager": {"samples_ms": [1.0]}}}},
        "ftz_cost": {
            "nvrtc-cubin": {
                "ftz_on": "on",
                "ftz_off": "off",
                "on": measured(pair, "on", 2.0, 1.5),
                "off": measured(pair, "off", 1.0, 1.5),
            }
        },
    }
    res = types.SimpleNamespace(timing={53: timing}, controls={53: controls})
    rows = position_effect_table(res).to_dict("records")
    assert [(r["task"], r["block"]) for r in rows] == [
        (53, "full/graph"),
        (53, "tail/graph"),
        (53, "ftz_cost/nvrtc-cubin"),  # the small-shape block has no positions: no row
    ]
    full, tail, cost = rows
    assert full["first_over_others"] == pytest.approx(1.1)
    assert full["last_over_others"] == pytest.approx(1.0)
    assert (full["each_position_min"], full["each_position_max"]) == pytest.approx((1.0, 1.1))
    assert (full["first_n"], full["others_n"], full["rounds"]) == (6, 12, 6)
    assert tail["first_over_others"] == tail["last_over_others"] == 1.0
    assert cost["implementations"] == 2
    # two implementations 2x apart, 4 rounds: the round's level (their mean) moves with the
    # penalty and the pooled ratio follows it to 0.2 %
    assert cost["first_over_others"] == pytest.approx(1.5, rel=0.002)
    assert cost["last_over_others"] == pytest.approx(1 / 1.5, rel=0.002)
