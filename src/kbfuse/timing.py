"""Interleaved, randomised, correctness-gated timing of the fused tails and their baselines.

Every implementation is compiled and warmed up before the timed region. Each round then
runs every implementation once, in that round's own random order, so that drift (clocks,
temperature, other tenants) spreads over all of them instead of biasing the one timed last.
A sample is the time between a CUDA event pair around `invocations_per_pair` back-to-back
calls (method "events") or CUDA-graph replays (method "graph"), divided by that count; the
GPU is synchronised once per round. Ratios are paired per round: baseline_ms / variant_ms
of the same round, so > 1 means the variant is faster.

Only variants whose correctness record passed are loaded and timed (`gate`); the others get
a `skipped` entry naming the reason and the failing checks.
"""

from __future__ import annotations

import functools
import logging
import os
import random
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from kbfuse import baselines as baseline_builders
from kbfuse import cudacache, kernelbench, launch, tails
from kbfuse.errors import KbfuseError
from kbfuse.inputs import make_input
from kbfuse.io import read_json, write_json

SCHEMA_VERSION = 1
METHODS = ("events", "graph")
SCOPES = ("full", "tail")
MEASUREMENT_KEYS = tuple(f"{scope}/{method}" for scope in SCOPES for method in METHODS)
BASELINES = baseline_builders.IMPLEMENTATIONS  # ("eager", "torchscript", "inductor")
COMPILED_BASELINES = ("torchscript", "inductor")
PROTOCOL_KEYS = ("warmup", "rounds", "invocations_per_pair", "order_seed", "input_seed")

_logger = logging.getLogger("kbfuse.timing")


# --------------------------------------------------------------------------- progress log


class Progress:
    """Progress lines to the `kbfuse` logger and, when a path is given, appended to that file."""

    def __init__(self, log: str | os.PathLike | None, logger: logging.Logger = _logger):
        self.path = Path(log) if log is not None else None
        self.logger = logger
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)

    def __call__(self, message: str) -> None:
        self.logger.info(message)
        if self.path is not None:
            with open(self.path, "a") as fh:
                fh.write(message + "\n")


# --------------------------------------------------------------------------- pure logic


def int_at_least(value: Any, key: str, minimum: int = 1) -> int:
    """`value` if it is an integer >= minimum; KbfuseError naming `key` otherwise."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise KbfuseError(f"{key} is {value!r}: it must be an integer >= {minimum}")
    return value


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


def round_orders(names: Sequence[str], rounds: int, order_seed: int) -> list[list[str]]:
    """One freshly shuffled order of `names` per round, reproducible from `order_seed`."""
    names = list(names)
    if not names:
        raise KbfuseError("round_orders: no implementations to order")
    if len(set(names)) != len(names):
        raise KbfuseError(f"round_orders: implementation names repeat: {names}")
    int_at_least(rounds, "rounds")
    rng = random.Random(order_seed)
    orders = []
    for _ in range(rounds):
        order = list(names)
        rng.shuffle(order)
        orders.append(order)
    return orders


def _checked_samples(samples: Sequence[float], what: str) -> np.ndarray:
    values = np.asarray(list(samples), dtype=np.float64)
    if values.ndim != 1 or values.size == 0:
        raise KbfuseError(f"{what}: need at least one sample, got {list(samples)!r}")
    if not np.all(np.isfinite(values)) or np.any(values <= 0):
        raise KbfuseError(f"{what}: samples must be finite and positive, got {values.tolist()}")
    return values


def stats(samples: Sequence[float]) -> dict:
    """Median and quartiles (numpy percentiles 25/50/75) of per-round samples in ms."""
    values = _checked_samples(samples, "stats")
    q1, median, q3 = np.percentile(values, [25, 50, 75])
    return {
        "median_ms": float(median),
        "q1_ms": float(q1),
        "q3_ms": float(q3),
        "samples_ms": [float(v) for v in values],
    }


def paired_ratios(baseline_samples: Sequence[float], variant_samples: Sequence[float]) -> dict:
    """Per-round baseline/variant time ratios (> 1: variant faster): median and quartiles."""
    base = _checked_samples(baseline_samples, "paired_ratios baseline")
    variant = _checked_samples(variant_samples, "paired_ratios variant")
    if base.size != variant.size:
        raise KbfuseError(
            f"paired_ratios: {base.size} baseline samples but {variant.size} variant samples; "
            "ratios are paired per round"
        )
    q1, median, q3 = np.percentile(base / variant, [25, 50, 75])
    return {"median": float(median), "q1": float(q1), "q3": float(q3)}


def best_compiled(measurements: Mapping[str, Mapping[str, Any]]) -> str | None:
    """The faster of TorchScript and Inductor by median (None when neither was timed)."""
    timed = [name for name in COMPILED_BASELINES if name in measurements]
    if not timed:
        return None
    return min(timed, key=lambda name: (measurements[name]["median_ms"], timed.index(name)))


def assemble_scope(
    samples: Mapping[str, Sequence[float]],
    baseline_names: Sequence[str],
    variant_names: Sequence[str],
) -> tuple[dict, dict]:
    """(measurements, ratios) of one scope/method from its raw per-round samples."""
    expected = [*baseline_names, *variant_names]
    missing = [name for name in expected if name not in samples]
    if missing:
        raise KbfuseError(f"no samples for {missing}")
    measurements = {name: stats(samples[name]) for name in expected}
    best = best_compiled({name: measurements[name] for name in baseline_names})
    ratios = {}
    for variant in variant_names:
        entry = {
            f"vs_{name}": paired_ratios(samples[name], samples[variant]) for name in baseline_names
        }
        if best is not None:
            entry["vs_best_compiled"] = {
                "baseline": best,
                **paired_ratios(samples[best], samples[variant]),
            }
        ratios[variant] = entry
    return measurements, ratios


def gate(
    correctness_records: Mapping[str, Any],
    task: int | None = None,
    artifact_sha256: Mapping[str, str] | None = None,
) -> tuple[list[str], dict[str, dict]]:
    """Split variants into (eligible, skipped) by their correctness records.

    A record value is the parsed JSON dict, None when the file is missing, or the exception
    raised while reading it. Eligible: a well-formed correctness record for that variant (and
    task and artifact, when given) with `passed` true and no failing checks. Everything else
    is skipped with {reason, failing_checks}; eligible keeps the input order.
    """
    eligible: list[str] = []
    skipped: dict[str, dict] = {}
    for variant, record in correctness_records.items():
        reason, failing = _gate_one(variant, record, task, (artifact_sha256 or {}).get(variant))
        if reason is None:
            eligible.append(variant)
        else:
            skipped[variant] = {"reason": reason, "failing_checks": failing}
    return eligible, skipped


def _gate_one(
    variant: str, record: Any, task: int | None, artifact: str | None
) -> tuple[str | None, list[str]]:
    if record is None:
        return "no correctness record", []
    if isinstance(record, BaseException):
        return f"unreadable correctness record: {record}", []
    if not isinstance(record, Mapping):
        return f"corrupt correctness record: not a JSON object ({type(record).__name__})", []
    if record.get("kind") != "correctness":
        return f"corrupt correctness record: kind is {record.get('kind')!r}", []
    passed = record.get("passed")
    failing = record.get("failing_checks")
    if not isinstance(passed, bool):
        return f"corrupt correctness record: passed is {passed!r}, not a boolean", []
    if not isinstance(failing, list) or not all(isinstance(c, str) for c in failing):
        return f"corrupt correctness record: failing_checks is {failing!r}", []
    if record.get("implementation") != variant:
        return (
            f"correctness record is for implementation {record.get('implementation')!r}, "
            f"not {variant!r}",
            [],
        )
    if task is not None and record.get("task") != task:
        return f"correctness record is for task {record.get('task')!r}, not {task}", []
    checked = (record.get("provenance") or {}).get("artifact_sha256")
    if artifact is not None and checked != artifact:
        return (
            f"correctness was checked on artifact {checked!r}, but the artifact to time "
            f"has sha256 {artifact}",
            [],
        )
    if not passed:
        return (
            f"failed correctness (official predicate): {len(failing)} failing check(s)",
            list(failing),
        )
    if failing:
        return "corrupt correctness record: passed is true but failing_checks is not empty", list(
            failing
        )
    return None, []


def read_correctness_records(paths: Mapping[str, str | os.PathLike | None]) -> dict[str, Any]:
    """Variant -> parsed record, None (missing file) or the exception raised reading it."""
    records: dict[str, Any] = {}
    for variant, path in paths.items():
        if path is None or not Path(path).is_file():
            records[variant] = None
            continue
        try:
            records[variant] = read_json(path)
        except (OSError, ValueError) as exc:
            records[variant] = KbfuseError(f"{path}: {exc}")
    return records


def check_names(baseline_names: Sequence[str], variant_names: Sequence[str]) -> list[str]:
    """Baselines known and unrepeated, no variant named like a baseline; returns the baselines."""
    baseline_names = list(baseline_names)
    unknown = [name for name in baseline_names if name not in BASELINES]
    if unknown:
        raise KbfuseError(f"baselines {unknown} are unknown; known baselines: {list(BASELINES)}")
    if len(set(baseline_names)) != len(baseline_names):
        raise KbfuseError(f"baselines {baseline_names} name a baseline more than once")
    clashes = sorted(set(baseline_names) & set(variant_names))
    if clashes:
        raise KbfuseError(f"variant name(s) {clashes} clash with baseline names")
    return baseline_names


def read_metas(variants: Mapping[str, tuple]) -> dict[str, dict]:
    """Variant -> compile metadata (meta.json), KbfuseError naming a missing or bad file."""
    metas = {}
    for variant, (_artifact, meta_path) in variants.items():
        try:
            meta = read_json(meta_path)
        except (OSError, ValueError) as exc:
            raise KbfuseError(f"variant {variant}: compile metadata {meta_path}: {exc}") from exc
        if not isinstance(meta, dict) or not isinstance(meta.get("artifact_sha256"), str):
            raise KbfuseError(f"variant {variant}: {meta_path} has no artifact_sha256")
        metas[variant] = meta
    return metas


# --------------------------------------------------------------------------- GPU timing


def time_interleaved(
    impls: Mapping[str, Callable[[], Any]],
    method: str,
    warmup: int,
    rounds: int,
    invocations_per_pair: int,
    order_seed: int,
    log: Callable[[str], None] | None = None,
) -> dict[str, list[float]]:
    """Per-round samples (ms per invocation) of zero-argument callables, interleaved.

    "events": each sample brackets `invocations_per_pair` direct calls with CUDA events.
    "graph": after warm-up (on a side stream, as capture requires) each callable is captured
    once into its own CUDA graph; each sample brackets that many replays.
    """
    import torch

    if method not in METHODS:
        raise KbfuseError(f"timing method {method!r} is unknown; known: {list(METHODS)}")
    int_at_least(warmup, "warmup")
    int_at_least(invocations_per_pair, "invocations_per_pair")
    names = list(impls)
    orders = round_orders(names, rounds, order_seed)
    say = log or _logger.info

    say(f"{method}: warm-up {warmup} x {len(names)} implementations ({', '.join(names)})")
    if method == "events":
        for _ in range(warmup):
            for name in names:
                impls[name]()
        torch.cuda.synchronize()
        runners = dict(impls)
        keep_alive: list[Any] = []
    else:
        runners, keep_alive = _capture_graphs(impls, warmup, say)

    samples: dict[str, list[float]] = {name: [] for name in names}
    stream = torch.cuda.current_stream()
    for index, order in enumerate(orders):
        pending = []
        for name in order:
            run = runners[name]
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record(stream)
            for _ in range(invocations_per_pair):
                run()
            end.record(stream)
            pending.append((name, start, end))
        torch.cuda.synchronize()
        for name, start, end in pending:
            samples[name].append(start.elapsed_time(end) / invocations_per_pair)
        say(f"{method}: round {index + 1}/{rounds} order {order}")
    del keep_alive
    return samples


def _capture_graphs(
    impls: Mapping[str, Callable[[], Any]], warmup: int, say: Callable[[str], None]
) -> tuple[dict[str, Callable[[], None]], list[Any]]:
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


def scope_impls(
    scope: str,
    model,
    x,
    y,
    tail,
    baseline_names: Sequence[str],
    modules: Mapping[str, Any],
) -> dict[str, Callable[[], Any]]:
    """Zero-argument callables for one scope, baselines first, then variants.

    full: x -> the whole model (baselines) or FusedProgram (the model's linear, then the
    kernel). tail: the fixed linear output y -> the model's tail (baselines, built on the
    model with its linear swapped for Identity) or run_tail into a preallocated output.
    """
    import torch

    if scope == "full":
        target, example = model, x
    elif scope == "tail":
        target, example = baseline_builders.tail_module(model, tail), y
    else:
        raise KbfuseError(f"timing scope {scope!r} is unknown; known: {list(SCOPES)}")
    impls: dict[str, Callable[[], Any]] = {}
    for name in baseline_names:
        impls[name] = functools.partial(baseline_builders.build(name, target, example), example)
    for variant, module in modules.items():
        if scope == "full":
            impls[variant] = functools.partial(launch.FusedProgram(module, tail, model), x)
        else:
            out = torch.empty_like(y)
            impls[variant] = functools.partial(launch.run_tail, module, tail, model, y, out)
    return impls


def measure_program(
    model,
    x,
    tail,
    baseline_names: Sequence[str],
    modules: Mapping[str, Any],
    protocol: Mapping[str, int],
    say: Callable[[str], None],
) -> dict:
    """Time both scopes with both methods; {measurements, ratios, tail_bytes}."""
    import torch

    with torch.no_grad():
        y = tail.linear(model)(x).contiguous()
        measurements: dict[str, dict] = {}
        ratios: dict[str, dict] = {}
        for scope in SCOPES:
            impls = scope_impls(scope, model, x, y, tail, baseline_names, modules)
            for method in METHODS:
                key = f"{scope}/{method}"
                say(f"timing {key}: {', '.join(impls)}")
                samples = time_interleaved(
                    impls,
                    method,
                    warmup=protocol["warmup"],
                    rounds=protocol["rounds"],
                    invocations_per_pair=protocol["invocations_per_pair"],
                    order_seed=protocol["order_seed"],
                    log=say,
                )
                measurements[key], ratios[key] = assemble_scope(
                    samples, baseline_names, list(modules)
                )
                for name, entry in measurements[key].items():
                    say(f"{key} {name}: median {entry['median_ms']:.6f} ms")
            del impls
            torch.cuda.empty_cache()
        tail_bytes = int(tail.bytes_moved(y))
    return {"measurements": measurements, "ratios": ratios, "tail_bytes": tail_bytes}


def load_modules(
    variants: Mapping[str, tuple], names: Sequence[str], metas: Mapping[str, dict]
) -> dict[str, Any]:
    """LoadedModule per named variant (only these are ever loaded)."""
    return {name: launch.LoadedModule.load(Path(variants[name][0]), metas[name]) for name in names}


def gate_variants(
    task: int,
    variants: Mapping[str, tuple],
    correctness: Mapping[str, str | os.PathLike],
    metas: Mapping[str, dict],
) -> tuple[list[str], dict[str, dict]]:
    """Gate every variant on its correctness record for `task` and its artifact hash."""
    records = read_correctness_records({v: correctness.get(v) for v in variants})
    artifacts = {v: metas[v]["artifact_sha256"] for v in variants}
    return gate(records, task=task, artifact_sha256=artifacts)


def run_timing(
    task: int,
    variants: Mapping[str, tuple],
    correctness: Mapping[str, str | os.PathLike],
    checkout: str | os.PathLike,
    pin_path: str | os.PathLike,
    baselines: Sequence[str],
    protocol: Mapping[str, Any],
    out: str | os.PathLike,
    log: str | os.PathLike | None = None,
) -> dict:
    """Gate, then time eager/TorchScript/Inductor and each eligible variant; write timing JSON.

    `variants`: name -> (artifact, meta.json) in config order; `correctness`: name ->
    results/correctness/{task}/{name}.json. Skipped variants are never loaded.
    """
    import torch

    say = Progress(log)
    protocol = check_protocol(protocol)
    baseline_names = check_names(baselines, list(variants))
    metas = read_metas(variants)
    eligible, skipped = gate_variants(task, variants, correctness, metas)
    for variant, entry in skipped.items():
        say(f"task {task}: skipping {variant}: {entry['reason']} {entry['failing_checks']}")

    pin = kernelbench.read_pin(pin_path)
    spec = kernelbench.load_task(checkout, pin, task)
    tail = tails.tail_for(task)
    baseline_builders.set_numerics()
    model = kernelbench.build_model(spec, seed=protocol["input_seed"])
    x = make_input("uniform", spec.input_shape(), protocol["input_seed"], "cuda")
    modules = load_modules(variants, eligible, metas)
    say(f"task {task}: timing {baseline_names + eligible}, input {tuple(x.shape)}")

    timed = measure_program(model, x, tail, baseline_names, modules, protocol, say)
    batch, in_features = spec.input_shape()
    result = {
        "kind": "timing",
        "schema_version": SCHEMA_VERSION,
        "task": task,
        "provenance": {
            "pin_commit": spec.pin_commit,
            "task_sha256": spec.sha256,
            "artifacts": {v: metas[v]["artifact_sha256"] for v in eligible},
            "kernels": {v: metas[v]["kernel"] for v in eligible},
        },
        "protocol": protocol,
        "shape": {
            "batch": batch,
            "in_features": in_features,
            "out_features": int(tail.linear(model).out_features),
        },
        "timed": baseline_names + eligible,
        "skipped": skipped,
        "measurements": timed["measurements"],
        "ratios": timed["ratios"],
        "tail_bytes": timed["tail_bytes"],
        "cuda_cache": cudacache.current_setting(),
    }
    write_json(out, result)
    say(f"task {task}: wrote {out}")
    del modules, model, x
    torch.cuda.empty_cache()
    return result
