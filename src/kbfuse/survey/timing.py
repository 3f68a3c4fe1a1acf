"""Timing the baselines of one task: the study's interleaved protocol, plus cold L2 and wall.

All baselines of a task are timed in one block per method, interleaved in the balanced,
seeded round orders of kbfuse.timing.measure (each sample synchronises first; positions recorded):

- `events` (GPU): kbfuse.timing.measure.time_interleaved, CUDA events around `invocations_per_pair`
  direct calls;
- `graph` (GPU): the same over CUDA-graph replays. Each baseline is first captured on its own;
  one that cannot be captured (a forward that synchronises or copies host data) is left out of
  the graph block and its `graph_missing` says why; the others keep their graph figures;
- `cold_l2` (GPU, when configured): before each timed call a buffer of twice the L2 size is
  written (the L2 flushed, as KernelBench's own timing does); only the call is timed, with its
  own event pair, and a sample is the mean over `invocations_per_pair` such calls;
- `wall` (CPU): time.perf_counter around `invocations_per_pair` calls, the same interleaving.

Calls per sample: with `min_sample_ms` set, `sized_protocol` times one call of each baseline
and takes as many calls per sample as the fastest needs to last that long, at most
`invocations_per_pair` (a 5 ms convolution needs one, a 20 us tail the most): slow tasks cost
seconds, not minutes, and the shortest sample still dwarfs the event timer's resolution. With
`min_sample_ms: null` every sample has `invocations_per_pair` calls, as in the study.

`ratios[name][method]` is kbfuse.timing.measure.paired_ratios(eager, name, cycle): > 1 means `name`
is faster than eager. A baseline whose forward raises while being timed is removed, its
failure recorded at stage `timing`, and the block is timed again without it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping

from kbfuse.errors import KbfuseError
from kbfuse.survey.baselines import failure
from kbfuse.timing import measure

Run = Callable[[], object]
L2_FLUSH_FACTOR = 2


class BaselineFailed(Exception):
    def __init__(self, name: str, exc: BaseException):
        super().__init__(f"{name}: {exc}")
        self.name = name
        self.exc = exc


def _guarded(name: str, run: Run) -> Run:
    def call():
        try:
            return run()
        except Exception as exc:
            raise BaselineFailed(name, exc) from exc

    return call


def gpu_methods(cold_l2: bool) -> list[str]:
    return ["events", "graph", *(["cold_l2"] if cold_l2 else [])]


def methods(device: str, cold_l2: bool) -> list[str]:
    return gpu_methods(cold_l2) if device == "cuda" else ["wall"]


def _interleaved(runs: Mapping[str, Run], protocol: dict, seed: str, measure_pair, log):
    for _ in range(protocol["warmup"]):
        for run in runs.values():
            run()
    orders = measure.round_orders(list(runs), protocol["rounds"], seed)
    return measure.interleave(runs, orders, measure_pair, log, f"{seed}: ")


def _wall(runs, protocol, seed, log):
    n = protocol["invocations_per_pair"]

    def measure_pair(run: Run) -> float:
        start = time.perf_counter()
        for _ in range(n):
            run()
        return (time.perf_counter() - start) * 1e3 / n

    return _interleaved(runs, protocol, seed, measure_pair, log)


def _cold_l2(runs, protocol, seed, log):
    import torch

    l2 = torch.cuda.get_device_properties(torch.cuda.current_device()).L2_cache_size
    flush = torch.empty(L2_FLUSH_FACTOR * max(int(l2), 1 << 20), dtype=torch.uint8, device="cuda")
    n = protocol["invocations_per_pair"]

    def measure_pair(run: Run) -> float:
        events = [
            (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
            for _ in range(n)
        ]
        torch.cuda.synchronize()
        for start, end in events:
            flush.zero_()
            start.record()
            run()
            end.record()
        events[-1][1].synchronize()
        return sum(start.elapsed_time(end) for start, end in events) / n

    return _interleaved(runs, protocol, seed, measure_pair, log)


def _events(runs, protocol, seed, log, method="events"):
    return measure.time_interleaved(
        runs,
        method,
        protocol["warmup"],
        protocol["rounds"],
        protocol["invocations_per_pair"],
        seed,
        log,
    )


def capture_problem(run: Run, warmup: int) -> str | None:
    """Why `run` cannot be captured in a CUDA graph, or None when it can."""
    import torch

    try:
        measure.capture_graphs({"probe": run}, warmup, lambda _msg: None)
    except Exception as exc:  # noqa: BLE001 - any failure to capture is the answer
        cause = exc.__cause__ or exc
        try:
            torch.cuda.synchronize()
        except Exception as sync_exc:  # noqa: BLE001 - the context is lost: say so, stop
            raise KbfuseError(f"the GPU failed after a CUDA-graph capture: {sync_exc}") from exc
        return f"{type(cause).__name__}: {str(cause).strip().splitlines()[0][:300]}"
    return None


_TIMERS = {"events": _events, "graph": _events, "cold_l2": _cold_l2, "wall": _wall}


def _block(method: str, runs, protocol, seed, log):
    if method == "graph":
        return _events(runs, protocol, seed, log, method="graph")
    return _TIMERS[method](runs, protocol, seed, log)


def time_method(method: str, runs: dict[str, Run], protocol: dict, seed: str, log, failures):
    """(samples, positions) of one method's block; a baseline that raises is dropped (its
    failure added to `failures`) and the block rerun without it."""
    runs = {name: _guarded(name, run) for name, run in runs.items() if name not in failures}
    while runs:
        try:
            return _block(method, runs, protocol, seed, log)
        except BaselineFailed as exc:
            failures[exc.name] = failure("timing", exc.exc)
            log(f"{method}: {exc.name} failed while timed: {exc.exc!r}; timing the others")
            runs.pop(exc.name)
    return {}, {}


def time_baselines(
    runs: dict[str, Run], protocol: dict, device: str, cold_l2: bool, label: str, log
) -> tuple[dict, dict, dict]:
    """(timing per baseline, ratios per baseline, timing failures per baseline)."""
    failures: dict[str, dict] = {}
    timing: dict[str, dict] = {name: {} for name in runs}
    for method in methods(device, cold_l2):
        seed = measure.block_seed(protocol["order_seed"], label, method)
        block = dict(runs)
        if method == "graph":
            block = _capturable(runs, protocol, timing, log)
        log(f"timing {method}: {list(block)}")
        try:
            samples, positions = time_method(method, block, protocol, seed, log, failures)
        except KbfuseError as exc:  # a capture that worked alone failed in the block
            if method != "graph":
                raise
            log(f"graph: {exc}; no graph figures for this task")
            samples, positions = {}, {}
            for name in block:
                timing[name]["graph_missing"] = str(exc)[:1000]
        for name in runs:
            timing[name][method] = (
                measure.stats(samples[name], positions[name]) if name in samples else None
            )
    ratios = _ratios(timing, methods(device, cold_l2), failures)
    return timing, ratios, failures


def _capturable(runs, protocol, timing, log) -> dict[str, Run]:
    block = {}
    for name, run in runs.items():
        problem = capture_problem(run, protocol["warmup"])
        timing[name]["graph_missing"] = problem
        if problem is None:
            block[name] = run
        else:
            log(f"graph: {name} cannot be captured: {problem}")
    return block


def _ratios(timing: dict, method_names: list[str], failures: dict) -> dict:
    ratios: dict[str, dict] = {}
    eager = timing.get("eager")
    if eager is None or "eager" in failures:
        return ratios
    for name, figures in timing.items():
        if name == "eager" or name in failures:
            continue
        ratios[name] = {}
        for method in method_names:
            base, other = eager.get(method), figures.get(method)
            if base is None or other is None:
                continue
            cycle = sum(1 for f in timing.values() if f.get(method) is not None)
            ratios[name][method] = measure.paired_ratios(
                base["samples_ms"], other["samples_ms"], cycle
            )
    return ratios


def per_call_ms(run: Run, device: str, calls: int = 3) -> float:
    """Milliseconds per call of `run`, after one call to warm it (wall clock, synchronised)."""
    import torch

    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    run()
    sync()
    start = time.perf_counter()
    for _ in range(calls):
        run()
    sync()
    return (time.perf_counter() - start) * 1e3 / calls


def unsized(protocol: dict, min_sample_ms: float | None) -> dict:
    """The record's sizing fields before any call was timed."""
    return {
        "max_invocations_per_pair": protocol["invocations_per_pair"],
        "min_sample_ms": min_sample_ms,
        "fastest_call_ms": None,
    }


def sized_protocol(
    runs: Mapping[str, Run], protocol: dict, device: str, min_sample_ms: float | None
) -> tuple[dict, dict]:
    """(the protocol with this task's calls per sample, the record's sizing fields). A baseline
    that raises here is left out of the sizing (the timing records its failure)."""
    sizing = unsized(protocol, min_sample_ms)
    if min_sample_ms is None:
        return dict(protocol), sizing
    times = []
    for run in runs.values():
        try:
            times.append(per_call_ms(run, device))
        except Exception:  # noqa: BLE001 - time_baselines records it at stage timing
            continue
    if not times:
        return dict(protocol), sizing
    fastest = min(times)
    most = protocol["invocations_per_pair"]
    calls = most if fastest <= 0 else min(most, max(1, math.ceil(min_sample_ms / fastest)))
    sizing.update(fastest_call_ms=fastest, invocations_per_pair=calls)
    return {**protocol, "invocations_per_pair": calls}, sizing


def check_protocol(settings: dict) -> dict:
    """The timing protocol of the survey settings, each value checked (KbfuseError naming it)."""
    protocol = {}
    for key in ("warmup", "rounds", "invocations_per_pair"):
        protocol[key] = measure.int_at_least(settings[key], f"survey.{key}")
    protocol["order_seed"] = measure.int_at_least(settings["order_seed"], "survey.order_seed", 0)
    sample = settings.get("min_sample_ms")
    if sample is not None and (
        isinstance(sample, bool) or not isinstance(sample, int | float) or not sample > 0
    ):
        raise KbfuseError(f"survey.min_sample_ms is {sample!r}: it must be a number > 0 or null")
    if not isinstance(settings["cold_l2"], bool):
        raise KbfuseError(f"survey.cold_l2 is {settings['cold_l2']!r}: it must be true or false")
    return protocol
