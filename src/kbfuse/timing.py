"""Interleaved, randomised, correctness-gated timing of the fused tails and their baselines.

Every implementation is compiled and warmed up before the timed region; the samples follow the
protocol of `kbfuse.measure` (a synchronisation before every CUDA event pair, balanced round
orders seeded per block and task, each sample's round position recorded). A sample is the time
between a CUDA event pair around `invocations_per_pair` back-to-back calls (method "events")
or CUDA-graph replays (method "graph"), divided by that count. Ratios are paired per round:
baseline_ms / variant_ms of the same round, so > 1 means the variant is faster.

Every timed implementation is gated on its own correctness record: variants on
results/correctness/{task}/{variant}.json (`gate`), TorchScript and Inductor on the task's
baselines.json (`gate_baselines`); eager is the reference itself. What fails is never loaded
or timed and gets a `skipped` entry naming the reason and the failing checks.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from kbfuse import baselines as baseline_builders
from kbfuse import cudacache, kernelbench, launch, tails
from kbfuse.errors import KbfuseError
from kbfuse.inputs import make_input
from kbfuse.io import read_json, write_json
from kbfuse.measure import (
    METHODS,
    block_seed,
    int_at_least,
    paired_ratios,
    stats,
    time_interleaved,
)
from kbfuse.weights import weights_sha256

SCHEMA_VERSION = 1
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
    """The faster of TorchScript and Inductor by median (None when neither was timed)."""
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


def _malformed_result(result: Mapping) -> str | None:
    """Why a correctness result's passed/failing_checks cannot be trusted, or None."""
    passed = result.get("passed")
    failing = result.get("failing_checks")
    if not isinstance(passed, bool):
        return f"corrupt correctness record: passed is {passed!r}, not a boolean"
    if not isinstance(failing, list) or not all(isinstance(c, str) for c in failing):
        return f"corrupt correctness record: failing_checks is {failing!r}"
    return None


def _verdict(result: Mapping) -> tuple[str | None, list[str]]:
    """(None, []) for a passing well-formed result; (reason, failing checks) otherwise."""
    malformed = _malformed_result(result)
    if malformed:
        return malformed, []
    failing = list(result["failing_checks"])
    if not result["passed"]:
        return f"failed correctness (official predicate): {len(failing)} failing check(s)", failing
    if failing:
        return "corrupt correctness record: passed is true but failing_checks is not empty", failing
    return None, []


def _record_problem(record: Any, kind: str, task: int | None) -> str | None:
    """Why a correctness record file cannot be used at all, or None."""
    if record is None:
        return "no correctness record"
    if isinstance(record, BaseException):
        return f"unreadable correctness record: {record}"
    if not isinstance(record, Mapping):
        return f"corrupt correctness record: not a JSON object ({type(record).__name__})"
    if record.get("kind") != kind:
        return f"corrupt correctness record: kind is {record.get('kind')!r}"
    return _task_problem(record, task)


def _task_problem(record: Mapping, task: int | None) -> str | None:
    if task is not None and record.get("task") != task:
        return f"correctness record is for task {record.get('task')!r}, not {task}"
    return None


def _gate_one(
    variant: str, record: Any, task: int | None, artifact: str | None
) -> tuple[str | None, list[str]]:
    problem = _record_problem(record, "correctness", None)
    if problem is None:
        problem = _malformed_result(record)
    if problem:
        return problem, []
    if record.get("implementation") != variant:
        return (
            f"correctness record is for implementation {record.get('implementation')!r}, "
            f"not {variant!r}",
            [],
        )
    problem = _task_problem(record, task)
    if problem:
        return problem, []
    checked = (record.get("provenance") or {}).get("artifact_sha256")
    if artifact is not None and checked != artifact:
        return (
            f"correctness was checked on artifact {checked!r}, but the artifact to time "
            f"has sha256 {artifact}",
            [],
        )
    return _verdict(record)


def gate_baselines(
    record: Any, baseline_names: Sequence[str], task: int | None = None
) -> tuple[list[str], dict[str, dict]]:
    """Split baselines into (eligible, skipped) by the task's baselines correctness record
    (results/correctness/{task}/baselines.json, `run_baselines`). Eager is the reference every
    check compares with, so it is always eligible; TorchScript and Inductor need a passing
    result in the record, like a variant."""
    eligible: list[str] = []
    skipped: dict[str, dict] = {}
    problem = _record_problem(record, "correctness_baselines", task)
    results = {} if problem else record.get("implementations")
    if not problem and not isinstance(results, Mapping):
        problem = f"corrupt correctness record: implementations is {results!r}"
    for name in baseline_names:
        if name == "eager":
            eligible.append(name)
            continue
        reason, failing = problem, []
        if reason is None:
            result = results.get(name)
            if not isinstance(result, Mapping):
                reason = f"no correctness result for baseline {name!r}"
            else:
                reason, failing = _verdict(result)
        if reason is None:
            eligible.append(name)
        else:
            skipped[name] = {"reason": reason, "failing_checks": failing}
    return eligible, skipped


def read_record(path: str | os.PathLike | None) -> Any:
    """The parsed JSON of a record file, None when missing, or the exception reading it."""
    if path is None or not Path(path).is_file():
        return None
    try:
        return read_json(path)
    except (OSError, ValueError) as exc:
        return KbfuseError(f"{path}: {exc}")


def read_correctness_records(paths: Mapping[str, str | os.PathLike | None]) -> dict[str, Any]:
    """Variant -> parsed record, None (missing file) or the exception raised reading it."""
    return {variant: read_record(path) for variant, path in paths.items()}


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
    labels: Sequence[Any] = (),
) -> dict:
    """Time both scopes with both methods; {measurements, ratios, tail_bytes}.

    Each scope/method block gets its own balanced round orders, seeded from the protocol's
    order seed and `labels` (the task, and the control's name) plus the block's key.
    """
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
                samples, positions = time_interleaved(
                    impls,
                    method,
                    warmup=protocol["warmup"],
                    rounds=protocol["rounds"],
                    invocations_per_pair=protocol["invocations_per_pair"],
                    seed=block_seed(protocol["order_seed"], *labels, scope, method),
                    log=say,
                )
                measurements[key], ratios[key] = assemble_scope(
                    samples, positions, baseline_names, list(modules)
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


def gate_implementations(
    task: int,
    variants: Mapping[str, tuple],
    correctness: Mapping[str, str | os.PathLike],
    baselines_record: str | os.PathLike,
    baselines: Sequence[str],
    say: Callable[[str], None],
) -> dict:
    """Everything the timing stages gate on, read and checked before any GPU work:
    {baselines, variants (the eligible ones, config order), skipped, metas}."""
    baseline_names = check_names(baselines, list(variants))
    metas = read_metas(variants)
    timed_baselines, skipped = gate_baselines(read_record(baselines_record), baseline_names, task)
    eligible, skipped_variants = gate_variants(task, variants, correctness, metas)
    skipped.update(skipped_variants)
    for name, entry in skipped.items():
        say(f"task {task}: {name} not timed: {entry['reason']} {entry['failing_checks']}")
    return {
        "baselines": timed_baselines,
        "variants": eligible,
        "skipped": skipped,
        "metas": metas,
    }


def run_timing(
    task: int,
    variants: Mapping[str, tuple],
    correctness: Mapping[str, str | os.PathLike],
    baselines_record: str | os.PathLike,
    checkout: str | os.PathLike,
    pin_path: str | os.PathLike,
    baselines: Sequence[str],
    protocol: Mapping[str, Any],
    out: str | os.PathLike,
    log: str | os.PathLike | None = None,
) -> dict:
    """Gate, then time eager and every baseline and variant that passed correctness; write
    the timing JSON.

    `variants`: name -> (artifact, meta.json) in config order; `correctness`: name ->
    results/correctness/{task}/{name}.json; `baselines_record`: the task's
    results/correctness/{task}/baselines.json. Skipped variants are never loaded.
    """
    import torch

    say = Progress(log)
    protocol = check_protocol(protocol)
    gated = gate_implementations(task, variants, correctness, baselines_record, baselines, say)
    metas, eligible, baseline_names = gated["metas"], gated["variants"], gated["baselines"]

    pin = kernelbench.read_pin(pin_path)
    spec = kernelbench.load_task(checkout, pin, task)
    tail = tails.tail_for(task)
    numerics = baseline_builders.set_numerics()
    model = kernelbench.build_model(spec, seed=protocol["input_seed"])
    x = make_input("uniform", spec.input_shape(), protocol["input_seed"], "cuda")
    modules = load_modules(variants, eligible, metas)
    say(f"task {task}: timing {baseline_names + eligible}, input {tuple(x.shape)}")

    timed = measure_program(model, x, tail, baseline_names, modules, protocol, say, (task,))
    batch, in_features = spec.input_shape()
    result = {
        "kind": "timing",
        "schema_version": SCHEMA_VERSION,
        "task": task,
        "provenance": {
            "pin_commit": spec.pin_commit,
            "task_sha256": spec.sha256,
            "weights_sha256": weights_sha256(model),
            "artifacts": {v: metas[v]["artifact_sha256"] for v in eligible},
            "kernels": {v: metas[v]["kernel"] for v in eligible},
        },
        "protocol": protocol,
        "numerics": numerics,
        "shape": {
            "batch": batch,
            "in_features": in_features,
            "out_features": int(tail.linear(model).out_features),
        },
        "timed": baseline_names + eligible,
        "skipped": gated["skipped"],
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
