"""The timing protocol every stage measures with: round orders, interleaving, statistics.

The original study timed each implementation as: synchronise, record a start event, run
`invocations_per_pair` calls, record an end event, wait for it; time / invocations. Rounds
visit every implementation once, in a shuffled order. kbfuse keeps that per-sample protocol
(a synchronisation before *every* event pair, so no sample starts behind another one's queued
work) and departs from the study in one place, on purpose: the round orders are *balanced*.
The study reshuffled the order every round with one `random.Random(913)` sequence, reused in
every block and task, so some implementations ran first far more often than others, and
whatever runs first in a round is measurably slower (3-14 % per sample on the H200 before
per-pair synchronisation). Here the rounds come in cycles of a Latin square (each
implementation takes each position exactly once per cycle; the square's base order and the
order of its rows are shuffled per cycle), seeded from the order seed *and* the block's own
label, so positions are balanced to within one over any number of rounds and the orders differ
between blocks and tasks. Each sample's position is recorded, and `position_effect` measures
what is left of the effect over a whole block, with each round's level removed.

Ratios are paired per round: baseline / variant of the same round, so > 1 means the variant is
faster. Statistics are numpy percentiles 25/50/75 of the per-round samples.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from kbfuse.errors import KbfuseError

METHODS = ("events", "graph")
SCOPES = ("full", "tail")
MEASUREMENT_KEYS = tuple(f"{scope}/{method}" for scope in SCOPES for method in METHODS)
COMPILED_BASELINES = ("torchscript", "inductor", "inductor-max-autotune-no-cudagraphs")
PROTOCOL_KEYS = ("warmup", "rounds", "invocations_per_pair", "order_seed", "input_seed")

_logger = logging.getLogger("kbfuse.timing.measure")


def int_at_least(value: Any, key: str, minimum: int = 1) -> int:
    """`value` if it is an integer >= minimum; KbfuseError naming `key` otherwise."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise KbfuseError(f"{key} is {value!r}: it must be an integer >= {minimum}")
    return value


# --------------------------------------------------------------------------- orders


def block_seed(order_seed: int, *labels: Any) -> str:
    """The seed of one timing block: the configured order seed and the block's labels, e.g.
    "913/53/full/events" (random.Random hashes a string seed the same way on every run)."""
    return "/".join(str(part) for part in (order_seed, *labels))


def round_orders(names: Sequence[str], rounds: int, seed: int | str) -> list[list[str]]:
    """Balanced, randomised orders of `names`, one per round, reproducible from `seed`.

    Rounds come in cycles of len(names): each cycle is a cyclic Latin square of a freshly
    shuffled base order, its rows in shuffled order, so every name takes every position once
    per cycle. Over any number of rounds each name's count at each position differs from every
    other's by at most one. Two names alternate within each cycle of two rounds.
    """
    names = list(names)
    if not names:
        raise KbfuseError("round_orders: no implementations to order")
    if len(set(names)) != len(names):
        raise KbfuseError(f"round_orders: implementation names repeat: {names}")
    int_at_least(rounds, "rounds")
    rng = random.Random(seed)
    orders: list[list[str]] = []
    while len(orders) < rounds:
        base = list(names)
        rng.shuffle(base)
        cycle = [base[shift:] + base[:shift] for shift in range(len(base))]
        rng.shuffle(cycle)
        orders.extend(cycle)
    return orders[:rounds]


def position_counts(orders: Sequence[Sequence[str]]) -> dict[str, list[int]]:
    """name -> how often it ran at each position (index) over `orders`."""
    width = len(orders[0]) if orders else 0
    counts: dict[str, list[int]] = {}
    for order in orders:
        for position, name in enumerate(order):
            counts.setdefault(name, [0] * width)[position] += 1
    return counts


# --------------------------------------------------------------------------- interleaving


def interleave(
    runners: Mapping[str, Callable[[], Any]],
    orders: Sequence[Sequence[str]],
    measure_pair: Callable[[Callable[[], Any]], float],
    log: Callable[[str], None] | None = None,
    label: str = "",
) -> tuple[dict[str, list[float]], dict[str, list[int]]]:
    """(samples, positions): per name, one `measure_pair(runner)` per round, in the round's
    order, and the position it ran at in that round.

    Nothing but the measurements runs between two samples, round boundaries included: the
    progress lines are written once every round is measured. (A log line written between
    rounds left the GPU idle longer before each round's first sample, and on a GPU whose
    clocks follow its load that sample was measurably slower.)
    """
    samples: dict[str, list[float]] = {name: [] for name in runners}
    positions: dict[str, list[int]] = {name: [] for name in runners}
    for order in orders:
        for position, name in enumerate(order):
            samples[name].append(float(measure_pair(runners[name])))
            positions[name].append(position)
    if log is not None:
        for index, order in enumerate(orders):
            log(f"{label}round {index + 1}/{len(orders)} order {list(order)}")
    return samples, positions


# --------------------------------------------------------------------------- statistics


def checked_samples(samples: Sequence[float], what: str) -> np.ndarray:
    values = np.asarray(list(samples), dtype=np.float64)
    if values.ndim != 1 or values.size == 0:
        raise KbfuseError(f"{what}: need at least one sample, got {list(samples)!r}")
    if not np.all(np.isfinite(values)) or np.any(values <= 0):
        raise KbfuseError(f"{what}: samples must be finite and positive, got {values.tolist()}")
    return values


def stats(samples: Sequence[float], positions: Sequence[int] | None = None) -> dict:
    """Median and quartiles (numpy percentiles 25/50/75) of per-round samples in ms; the raw
    samples, and their round positions when given."""
    values = checked_samples(samples, "stats")
    q1, median, q3 = np.percentile(values, [25, 50, 75])
    result = {
        "median_ms": float(median),
        "q1_ms": float(q1),
        "q3_ms": float(q3),
        "samples_ms": [float(v) for v in values],
    }
    if positions is not None:
        if len(positions) != values.size:
            raise KbfuseError(f"stats: {values.size} samples but {len(positions)} positions")
        result["positions"] = [int(p) for p in positions]
    return result


def paired_ratios(
    baseline_samples: Sequence[float], variant_samples: Sequence[float], cycle: int | None = None
) -> dict:
    """Per-round baseline/variant time ratios (> 1: variant faster): median and quartiles.

    With `cycle` (the number of implementations in the block, the length of one Latin-square
    cycle of `round_orders`) also `balanced`: the geometric mean of the ratios over the
    complete cycles. Within a cycle both implementations take every position once, so any
    slowdown that depends only on the position cancels exactly; the per-round median cannot
    cancel it when the rounds split unevenly (35 rounds of two implementations: 18/17).
    """
    base = checked_samples(baseline_samples, "paired_ratios baseline")
    variant = checked_samples(variant_samples, "paired_ratios variant")
    if base.size != variant.size:
        raise KbfuseError(
            f"paired_ratios: {base.size} baseline samples but {variant.size} variant samples; "
            "ratios are paired per round"
        )
    ratios = base / variant
    q1, median, q3 = np.percentile(ratios, [25, 50, 75])
    result = {"median": float(median), "q1": float(q1), "q3": float(q3)}
    if cycle is not None:
        complete = ratios.size // int_at_least(cycle, "cycle") * cycle
        result["balanced"] = float(np.exp(np.mean(np.log(ratios[:complete])))) if complete else None
        result["balanced_rounds"] = int(complete)
    return result


def relative_samples(
    samples: Mapping[str, Sequence[float]], positions: Mapping[str, Sequence[int]]
) -> dict[str, np.ndarray]:
    """Each sample of one block with its round's level and its implementation's level removed.

    A round's level is the median over the implementations of that round's samples: dividing
    by it removes whatever moved the whole round together, which a GPU's or host's state does
    (in the H200 reference's task-81 small-shape tail, a phase of slower graph launches slowed
    every implementation but eager for eleven rounds in a row). What is left is divided by the
    implementation's own level, so that implementations of different speed (eager's tail
    takes three times a kernel's) pool on one scale: otherwise which implementations happened
    to run first would move a pooled median (of two implementations 3 % apart, one runs first
    18 times and the other 17, and the median of the first samples lands on one of them).

    An implementation's level is the median, over the positions it took, of its median at
    each position: every position counts once, however often the implementation took it, so
    a position effect weighs on every implementation's level alike and cancels in the ratios.
    (The plain median of two implementations' 35 samples is a sample of the position each
    took 18 times, and would take a first-position penalty into one level only.) 1 means "as
    fast as this implementation usually is, in a round like this one".
    """
    names = list(samples)
    table = [checked_samples(samples[name], f"position_effect: {name!r}") for name in names]
    if len({values.size for values in table}) != 1:
        sizes = {name: values.size for name, values in zip(names, table, strict=True)}
        raise KbfuseError(
            f"position_effect: the implementations have different numbers of samples {sizes}; "
            "a block's implementations share its rounds"
        )
    grid = np.vstack(table)  # implementation x round
    where = np.vstack([_positions_of(name, positions, grid.shape[1]) for name in names])
    relative = grid / np.median(grid, axis=0)
    for row, taken in zip(relative, where, strict=True):
        row /= np.median([np.median(row[taken == p]) for p in np.unique(taken)])
    return dict(zip(names, relative, strict=True))


def _positions_of(name: str, positions: Mapping[str, Sequence[int]], rounds: int) -> np.ndarray:
    where = np.asarray(list(positions[name]), dtype=int)
    if where.shape != (rounds,):
        raise KbfuseError(
            f"position_effect: {name!r} has {rounds} samples but {where.size} positions"
        )
    return where


def position_effect(
    samples: Mapping[str, Sequence[float]], positions: Mapping[str, Sequence[int]]
) -> dict | None:
    """What running at one position of a round does to a sample, for one timed block.

    Every implementation's samples are pooled on one scale by `relative_samples` (the round's
    and the implementation's levels removed); then, for each position p, the median of the
    pooled samples taken at p over the median of all the others. Returned: `first_over_others`
    (p = 0), `last_over_others` (the last position) and the smallest and largest ratio over
    every position (`each_position_min`, `each_position_max`): the spread a position without
    any effect shows in this block. 1 means no effect; a first position outside the others'
    spread would be one. None for a block of one implementation (its samples are their own
    round's level) or without samples at the first position and at another.

    Why pooled: a per-implementation ratio has one or two first-position samples (25 rounds,
    14 implementations), so it measures the noise of single samples, and anything that moves
    a whole round (a phase of slower launches) moves it with the round's luck.
    """
    if set(samples) != set(positions):
        raise KbfuseError(
            f"position_effect: samples of {sorted(samples)} but positions of {sorted(positions)}"
        )
    if len(samples) < 2:
        return None
    relative = relative_samples(samples, positions)
    pooled = np.concatenate(list(relative.values()))
    where = np.concatenate([np.asarray(list(positions[name]), dtype=int) for name in relative])
    if not np.any(where == 0) or np.all(where == 0):
        return None
    ratios = [
        float(np.median(pooled[where == p]) / np.median(pooled[where != p]))
        for p in np.unique(where)
    ]
    return {
        "first_n": int(np.sum(where == 0)),
        "others_n": int(np.sum(where != 0)),
        "first_over_others": ratios[0],
        "last_over_others": ratios[-1],
        "each_position_min": min(ratios),
        "each_position_max": max(ratios),
    }


# --------------------------------------------------------------------------- GPU timing


def check_protocol(protocol: Mapping[str, Any]) -> dict:
    """The timing protocol as a plain dict of its five integer keys; KbfuseError otherwise."""
    if not isinstance(protocol, Mapping):
        raise KbfuseError(f"timing protocol must be a mapping, got {protocol!r}")
    missing = [key for key in PROTOCOL_KEYS if key not in protocol]
    if missing:
        raise KbfuseError(f"timing protocol is missing key(s) {missing}")
    checked = {
        "warmup": int_at_least(protocol["warmup"], "timing.warmup"),
        "rounds": int_at_least(protocol["rounds"], "timing.rounds"),
        "invocations_per_pair": int_at_least(
            protocol["invocations_per_pair"], "timing.invocations_per_pair"
        ),
        "order_seed": int_at_least(protocol["order_seed"], "timing.order_seed", minimum=0),
        "input_seed": int_at_least(protocol["input_seed"], "timing.input_seed", minimum=0),
    }
    return checked


def best_compiled(measurements: Mapping[str, Mapping[str, Any]]) -> str | None:
    """The fastest timed compiled baseline (TorchScript, Inductor, Inductor max-autotune) by
    median (None when none was timed). Only baselines that passed correctness are timed, so
    this is the strongest compiled baseline that passed."""
    timed = [name for name in COMPILED_BASELINES if name in measurements]
    if not timed:
        return None
    return min(timed, key=lambda name: (measurements[name]["median_ms"], timed.index(name)))


def assemble_scope(
    samples: Mapping[str, Sequence[float]],
    positions: Mapping[str, Sequence[int]],
    baseline_names: Sequence[str],
    variant_names: Sequence[str],
) -> tuple[dict, dict]:
    """(measurements, ratios) of one scope/method from its raw per-round samples and the
    position each sample ran at in its round."""
    expected = [*baseline_names, *variant_names]
    missing = [name for name in expected if name not in samples or name not in positions]
    if missing:
        raise KbfuseError(f"no samples for {missing}")
    measurements = {name: stats(samples[name], positions[name]) for name in expected}
    best = best_compiled({name: measurements[name] for name in baseline_names})
    cycle = len(expected)
    ratios = {}
    for variant in variant_names:
        entry = {
            f"vs_{name}": paired_ratios(samples[name], samples[variant], cycle)
            for name in baseline_names
        }
        if best is not None:
            entry["vs_best_compiled"] = {
                "baseline": best,
                **paired_ratios(samples[best], samples[variant], cycle),
            }
        ratios[variant] = entry
    return measurements, ratios


def time_interleaved(
    impls: Mapping[str, Callable[[], Any]],
    method: str,
    warmup: int,
    rounds: int,
    invocations_per_pair: int,
    seed: int | str,
    log: Callable[[str], None] | None = None,
) -> tuple[dict[str, list[float]], dict[str, list[int]]]:
    """(samples, positions): per-round ms per invocation of zero-argument callables.

    "events": each sample brackets `invocations_per_pair` direct calls with CUDA events.
    "graph": after warm-up (on a side stream, as capture requires) each callable is captured
    once into its own CUDA graph; each sample brackets that many replays. The device is
    synchronised before every event pair and the end event waited for, as the study did.
    """
    import torch

    if method not in METHODS:
        raise KbfuseError(f"timing method {method!r} is unknown; known: {list(METHODS)}")
    int_at_least(warmup, "warmup")
    int_at_least(invocations_per_pair, "invocations_per_pair")
    names = list(impls)
    orders = round_orders(names, rounds, seed)
    say = log or _logger.info

    say(f"{method}: warm-up {warmup} x {len(names)} implementations ({', '.join(names)})")
    if method == "events":
        for _ in range(warmup):
            for name in names:
                impls[name]()
        torch.cuda.synchronize()
        runners, keep_alive = dict(impls), []
    else:
        runners, keep_alive = capture_graphs(impls, warmup, say)

    stream = torch.cuda.current_stream()

    def measure_pair(run: Callable[[], Any]) -> float:
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record(stream)
        for _ in range(invocations_per_pair):
            run()
        end.record(stream)
        end.synchronize()
        return start.elapsed_time(end) / invocations_per_pair

    samples, positions = interleave(runners, orders, measure_pair, say, f"{method}: ")
    del keep_alive
    return samples, positions


def capture_graphs(
    impls: Mapping[str, Callable[[], Any]], warmup: int, say: Callable[[str], None]
) -> tuple[dict[str, Callable[[], None]], list[Any]]:
    """One CUDA graph per callable, captured after `warmup` calls on a side stream; (replay
    functions, objects to keep alive while they are used)."""
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup):
            for fn in impls.values():
                fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()

    runners: dict[str, Callable[[], None]] = {}
    keep_alive: list[Any] = []
    for name, fn in impls.items():
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph):
                static_output = fn()
        except Exception as exc:
            raise KbfuseError(f"capturing {name!r} in a CUDA graph failed: {exc}") from exc
        keep_alive.append((graph, static_output))
        runners[name] = graph.replay
        say(f"graph: captured {name}")
    for replay in runners.values():  # the first replay uploads the graph: not timed
        replay()
    torch.cuda.synchronize()
    return runners, keep_alive
