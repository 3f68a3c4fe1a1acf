"""The summary's position-effect table, from records that carry each sample's round position."""

from __future__ import annotations

import types

import pytest

from kbfuse.results.tables import position_effect_table
from kbfuse.timing.measure import round_orders


def measured(orders, name, true_ms, penalty):
    samples, positions = [], []
    for order in orders:
        position = order.index(name)
        samples.append(true_ms * (penalty if position == 0 else 1.0))
        positions.append(position)
    return {"samples_ms": samples, "positions": positions, "median_ms": true_ms}


def test_position_effect_table_shows_each_block(monkeypatch):
    names = ["eager", "inductor", "v"]
    orders = round_orders(names, 6, "913/53/full/graph")
    timing = {
        "measurements": {
            "full/graph": {n: measured(orders, n, 1.0, 1.1) for n in names},
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
    assert full["first_over_others_median"] == pytest.approx(1.1)
    assert full["first_over_others_min"] == pytest.approx(1.1)
    assert (full["first_n"], full["others_n"], full["rounds"]) == (6, 12, 6)
    assert tail["first_over_others_max"] == 1.0
    assert cost["implementations"] == 2 and cost["first_over_others_median"] == pytest.approx(1.5)
