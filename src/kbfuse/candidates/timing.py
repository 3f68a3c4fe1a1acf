"""Timing a candidate beside the task's baselines so that the candidate cannot game it.

The study's interleaved protocol (kbfuse.timing.measure: balanced, shuffled round orders; one sample
per implementation per round; median and quartiles; paired per-round ratios) with a stricter
sample, the same for every implementation:

  events   synchronise the whole device, record the start event, `invocations_per_pair`
           calls, synchronise the whole device again, record the end event and wait for it.
           The end event is recorded after the device-wide synchronisation, so work the
           candidate left on any other stream is inside the interval.
  graph    the same around that many replays of a CUDA graph captured from each callable
           (kbfuse.timing.measure.capture_graphs); a candidate that cannot be captured gets a
           reason in `graph_missing`, no figure.
  cold_l2  one call per sample, with a buffer twice the size of the device's L2 cache
           overwritten before the start event, so the call finds nothing of its inputs or
           weights in L2.
  wall     (CPU only) time.perf_counter around `invocations_per_pair` calls.

Rounds sized from the spread (`spread` in the protocol, check.timing.spread): a block runs
whole cycles of its balanced order (one round per implementation each, so every
implementation has taken every position equally often), at least two, and ends after the
first cycle where every implementation's interquartile range is at most `spread` times its
median, or after `rounds`. A quiet block on a quiet GPU then takes two cycles instead of
`rounds`; a noisy one keeps going. Without it every block runs `rounds`.

All clock functions are those captured before the candidate was imported (guards.Clock).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from kbfuse.errors import KbfuseError
from kbfuse.timing.measure import block_seed, capture_graphs, interleave, round_orders, stats

L2_FLUSH_FACTOR = 2
DEFAULT_L2_BYTES = 64 * 2**20


def _events_pair(clock, calls: int, before: Callable[[], None] | None = None):
    def measure(run: Callable[[], Any]) -> float:
        if before is not None:
            before()
        start, end = clock.event(), clock.event()
        clock.device_sync()
        clock.record(start)
        for _ in range(calls):
            run()
        clock.device_sync()
        clock.record(end)
        clock.event_sync(end)
        return clock.elapsed_time(start, end) / calls

    return measure


def _wall_pair(clock, calls: int):
    def measure(run: Callable[[], Any]) -> float:
        start = clock.perf_counter()
        for _ in range(calls):
            run()
        return (clock.perf_counter() - start) * 1e3 / calls

    return measure


def l2_flusher() -> Callable[[], None]:
    import torch

    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    size = int(getattr(props, "L2_cache_size", 0) or DEFAULT_L2_BYTES) * L2_FLUSH_FACTOR
    buffer = torch.empty(size // 4, dtype=torch.int32, device="cuda")

    def flush() -> None:
        buffer.fill_(1)

    return flush


def settled(samples: Mapping[str, list[float]], spread: float) -> bool:
    """Is every implementation's interquartile range at most `spread` times its median?"""
    import numpy as np

    for values in samples.values():
        q1, median, q3 = np.percentile(values, [25, 50, 75])
        if q3 - q1 > spread * median:
            return False
    return True


def _until_settled(impls, orders, measure_pair, log, label, spread):
    """interleave() on whole cycles of `orders` until settled() after at least two."""
    cycle = len(impls)
    samples: dict[str, list[float]] = {name: [] for name in impls}
    positions: dict[str, list[int]] = {name: [] for name in impls}
    done = 0
    while done < len(orders):
        chunk = orders[done : done + cycle]
        prefix = f"{label}: rounds {done + 1}-{done + len(chunk)}: "
        more, where = interleave(impls, chunk, measure_pair, log, prefix)
        for name in impls:
            samples[name] += more[name]
            positions[name] += where[name]
        done += len(chunk)
        if done >= 2 * cycle and settled(samples, spread):
            break
    return samples, positions


def _block(impls, protocol, label, measure_pair, log) -> dict:
    orders = round_orders(
        list(impls), protocol["rounds"], block_seed(protocol["order_seed"], label)
    )
    spread = protocol.get("spread")
    if spread is None:
        samples, positions = interleave(impls, orders, measure_pair, log, f"{label}: ")
    else:
        samples, positions = _until_settled(impls, orders, measure_pair, log, label, spread)
    return {name: stats(samples[name], positions[name]) for name in impls}


def _warm(impls: Mapping[str, Callable[[], Any]], warmup: int) -> None:
    for _ in range(warmup):
        for run in impls.values():
            run()


def time_all(
    impls: Mapping[str, Callable[[], Any]], protocol: dict, clock, device: str, log
) -> dict:
    """{method: {name: stats}} plus `graph_missing` (why there is no graph figure, or None)."""
    calls = protocol["invocations_per_pair"]
    _warm(impls, protocol["warmup"])
    if device == "cpu":
        return {"wall": _block(impls, protocol, "wall", _wall_pair(clock, calls), log)}
    clock.device_sync()
    result: dict[str, Any] = {
        "events": _block(impls, protocol, "events", _events_pair(clock, calls), log)
    }
    if protocol["cold_l2"]:
        flush = l2_flusher()
        result["cold_l2"] = _block(impls, protocol, "cold_l2", _events_pair(clock, 1, flush), log)
    result["graph_missing"] = None
    if protocol["graph"]:
        try:
            replays, keep = capture_graphs(impls, protocol["warmup"], log)
        except (KbfuseError, RuntimeError) as exc:
            result["graph_missing"] = str(exc).splitlines()[0][:300]
        else:
            result["graph"] = _block(replays, protocol, "graph", _events_pair(clock, calls), log)
            del keep
    else:
        result["graph_missing"] = "graph timing is off (check.timing.graph: false)"
    return result
