"""Controls beside the main timing: small shape, tiny values, FTZ cost, the task-81 witness.

- small shape: the task model rebuilt at (B, K, H) = controls.small_shape and seeded with its
  own seed (371, as in the study); every implementation that passed correctness at the main
  shape is checked again at the small shape first, and only what passes there is timed, exactly
  like the main timing (both scopes, both methods);
- tiny values: every variant's tail on inputs where flush-to-zero decides the bits
  (a dense sweep such as [-110, -60], subnormals, signed zeros, infinities, NaN), each case
  a `numerics.compare` record against the model's eager tail; diagnostic, so not gated;
- FTZ cost: for each route with an ftz-on and an ftz-off variant that are otherwise the
  same (kernel source and options), both tails timed paired and interleaved as CUDA-graph
  replays (seed-42 linear outputs, `replays_per_pair` replays per event pair, both recorded);
  the per-round ratio on/off, from balanced round orders;
- witness81: task 81's eager tail against every variant at -88 and -87.5, values and bits.
"""

from __future__ import annotations

import copy
import functools
import math
import os
import re
import types
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from kbfuse.checks import numerics
from kbfuse.checks.exhaustive import exhaustive_control
from kbfuse.compilation import launch
from kbfuse.errors import KbfuseError
from kbfuse.io import write_json
from kbfuse.stage import (
    Program,
    Progress,
    load_modules,
    make_record,
    measure_program,
    read_compile_metas,
    task_provenance,
)
from kbfuse.tasks import baselines as baseline_builders
from kbfuse.tasks import kernelbench, tails
from kbfuse.tasks.inputs import make_input
from kbfuse.tasks.registry import WITNESS_INPUTS, WITNESS_TASK
from kbfuse.tasks.weights import weights_sha256
from kbfuse.timing.gate import TimedTask
from kbfuse.timing.measure import (
    block_seed,
    check_protocol,
    int_at_least,
    paired_ratios,
    stats,
    time_interleaved,
)

# The study built the small-shape model (and drew its input) right after seeding 371.
SMALL_SHAPE_SEED = 371
SMALL_SHAPE_GROUP = "small_shape"
TINY_GROUP = "tiny_values"
_FTZ_OPTION = re.compile(r"^-{1,2}ftz(=.*)?$")
_SIGN_BIT = 0x80000000
_LARGEST_SUBNORMAL = 0x007FFFFF
_PAIR_META_KEYS = ("route", "kernel", "source_sha256", "requested_options", "expected_ftz")


# --------------------------------------------------------------------------- pure logic


LINEAR_SMALL_SHAPE = ("batch", "in_features", "out_features")


def check_controls_cfg(
    cfg: Mapping[str, Any], small_shape_keys: Sequence[str] = LINEAR_SMALL_SHAPE
) -> dict:
    """The `controls` config block as plain values; KbfuseError naming a bad key.

    `small_shape_keys`: the sizes the small shape names besides its seed (the tail's
    `small_shape_keys`: batch, in_features, out_features after a linear layer; batch, height,
    width after a convolution)."""
    if not isinstance(cfg, Mapping):
        raise KbfuseError(f"controls must be a mapping, got {cfg!r}")
    for key in ("small_shape", "tiny_values", "ftz_cost"):
        if not isinstance(cfg.get(key), Mapping):
            raise KbfuseError(f"controls.{key} is missing or not a mapping")
    shape = cfg["small_shape"]
    tiny = cfg["tiny_values"]
    cost = cfg["ftz_cost"]
    small_shape = {
        key: int_at_least(shape.get(key), f"controls.small_shape.{key}", 1)
        for key in small_shape_keys
    }
    small_shape["seed"] = int_at_least(
        shape.get("seed", SMALL_SHAPE_SEED), "controls.small_shape.seed", 0
    )
    low, high = tiny.get("low"), tiny.get("high")
    for key, value in (("low", low), ("high", high)):
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not math.isfinite(value)
        ):
            raise KbfuseError(
                f"controls.tiny_values.{key} is {value!r}: it must be a finite number"
            )
    if not low < high:
        raise KbfuseError(f"controls.tiny_values: low {low!r} must be below high {high!r}")
    return {
        "small_shape": small_shape,
        "tiny_values": {
            "low": float(low),
            "high": float(high),
            "dense_count": int_at_least(
                tiny.get("dense_count"), "controls.tiny_values.dense_count", 2
            ),
        },
        "ftz_cost": {
            "rounds": int_at_least(cost.get("rounds"), "controls.ftz_cost.rounds", 1),
            "replays_per_pair": int_at_least(
                cost.get("replays_per_pair"), "controls.ftz_cost.replays_per_pair", 1
            ),
        },
    }


def _number_name(value: float) -> str:
    return f"{value:g}"


def dense_case_name(low: float, high: float) -> str:
    """e.g. "dense_-110_-60" for the sweep [-110, -60]."""
    return f"dense_{_number_name(low)}_{_number_name(high)}"


def subnormal_bits() -> list[int]:
    """float32 bit patterns of subnormals, positive then negative: every power of two from the
    smallest (0x00000001) up, 15 evenly spaced mantissas, and the largest (0x007fffff)."""
    positive = {1 << k for k in range(23)}
    positive.update(i * (_LARGEST_SUBNORMAL // 16) for i in range(1, 16))
    positive.add(_LARGEST_SUBNORMAL)
    ordered = sorted(positive)
    return ordered + [bits | _SIGN_BIT for bits in ordered]


def tiny_value_cases(low: float, high: float, dense_count: int) -> dict[str, np.ndarray]:
    """Case name -> float32 input values for the tiny-values control, in a fixed order."""
    dense = np.linspace(low, high, dense_count, dtype=np.float64).astype(np.float32)
    subnormals = np.array(subnormal_bits(), dtype=np.uint32).view(np.float32)
    return {
        dense_case_name(low, high): dense,
        "subnormals": subnormals,
        "signed_zeros": np.array([0.0, -0.0], dtype=np.float32),
        "infinities": np.array([np.inf, -np.inf], dtype=np.float32),
        "nan": np.array([np.nan], dtype=np.float32),
    }


def as_rows(values: np.ndarray, cols: int) -> np.ndarray:
    """Values laid out as a (rows, cols) float32 matrix, zero-padded at the end.

    A pointwise tail is elementwise, so padding does not change the first len(values)
    outputs; task 95's kernel needs cols equal to the length of its add parameter, a
    convolution's tail a multiple of its channels (`Tail.control_columns`).
    """
    int_at_least(cols, "cols", 1)
    rows = max(1, -(-values.size // cols))
    padded = np.zeros(rows * cols, dtype=np.float32)
    padded[: values.size] = values
    return padded.reshape(rows, cols)


def without_ftz(options: Sequence[str]) -> tuple[str, ...]:
    return tuple(option for option in options if not _FTZ_OPTION.match(option))


def ftz_pairs(metas: Mapping[str, Mapping[str, Any]]) -> dict[str, dict]:
    """Route -> {ftz_on, ftz_off, others}: the first ftz-on/ftz-off variant pair (in the given
    order) with the same route, kernel, source and options apart from --ftz. FTZ is the
    `expected_ftz` of the compile metadata (from the options actually passed); `others`
    lists further such pairs of the route, which are not timed."""
    by_key: dict[tuple, dict[bool, list[str]]] = {}
    for variant, meta in metas.items():
        missing = [k for k in _PAIR_META_KEYS if k not in meta]
        if missing:
            raise KbfuseError(f"variant {variant}: compile metadata lacks {missing}")
        key = (
            meta["route"],
            meta["kernel"],
            meta["source_sha256"],
            without_ftz(meta["requested_options"]),
        )
        by_key.setdefault(key, {True: [], False: []})[bool(meta["expected_ftz"])].append(variant)
    pairs: dict[str, dict] = {}
    for key, groups in by_key.items():
        route = key[0]
        for on, off in zip(groups[True], groups[False], strict=False):
            if route not in pairs:
                pairs[route] = {"ftz_on": on, "ftz_off": off, "others": []}
            else:
                pairs[route]["others"].append([on, off])
    return pairs


def small_init_inputs(init_inputs: Sequence[Any], in_features: int, out_features: int) -> list[Any]:
    """Task init inputs with in/out features replaced (the first two for tasks 53/81/95);
    a shape (old_out_features,) among the rest, task 95's add_value_shape, follows out."""
    init = list(init_inputs)
    if len(init) < 2 or not all(isinstance(v, int) and not isinstance(v, bool) for v in init[:2]):
        raise KbfuseError(
            f"task init inputs {init!r} do not start with integer in_features, out_features"
        )
    old_out = init[1]
    resized = [in_features, out_features]
    for value in init[2:]:
        if isinstance(value, tuple | list) and list(value) == [old_out]:
            resized.append(type(value)([out_features]))
        else:
            resized.append(value)
    return resized


# --------------------------------------------------------------------------- GPU parts


def build_resized_model(spec, seed: int, in_features: int, out_features: int, tail):
    """The task model rebuilt with other in/out features, exactly as build_model builds it."""
    resized = types.SimpleNamespace(
        module=spec.module,
        init_inputs=lambda: small_init_inputs(spec.init_inputs(), in_features, out_features),
    )
    model = kernelbench.build_model(resized, seed=seed)
    linear = tail.library(model)
    if (linear.in_features, linear.out_features) != (in_features, out_features):
        raise KbfuseError(
            f"task {spec.task}: rebuilt model has linear {linear.in_features}x"
            f"{linear.out_features}, expected {in_features}x{out_features}"
        )
    return model


def small_program(spec, tail, shape: Mapping[str, int]) -> tuple[Any, tuple[int, ...]]:
    """(model, input shape) of the small shape, the model seeded `shape["seed"]`: after a
    linear layer the model is rebuilt with the small in/out features (the study's (B, K, H));
    after a convolution the model is the task's own and only the input shrinks (batch and
    spatial size; the channels are the convolution's)."""
    seed = shape["seed"]
    if tail.small_shape_keys == LINEAR_SMALL_SHAPE:
        model = build_resized_model(spec, seed, shape["in_features"], shape["out_features"], tail)
        return model, (shape["batch"], shape["in_features"])
    model = kernelbench.build_model(spec, seed=seed)
    return model, tail.small_input_shape(model, shape)


def small_shape_correctness(
    program: Program, tolerance: Mapping[str, float], say: Callable[[str], None]
) -> dict[str, dict]:
    """Every implementation to be timed at the small shape, checked there first, as the study
    did: the full program on the small input and the tail on its linear output, each against
    eager under the correctness stage's gate (`cases.check_case`). Eager is the
    reference. name -> {passed, failing_checks, cases}."""
    import torch

    from kbfuse.checks.cases import check_case
    from kbfuse.checks.taskchecks import baseline_subject, variant_subject

    model, x, tail = program.model, program.x, program.tail
    with torch.no_grad():
        y = tail.library_output(model, x)
        reference = {"full": model(x), "tail": tail.reference(model, y)}
    subjects = [
        baseline_subject(name, model, tail, x, y)
        for name in program.baseline_names
        if name != "eager"
    ]
    subjects += [
        variant_subject(name, module, tail, model) for name, module in program.modules.items()
    ]
    results: dict[str, dict] = {}
    for subject in subjects:
        cases = [
            check_case(
                reference["full"], subject.full(x), tolerance, "small/full", SMALL_SHAPE_GROUP
            ),
            check_case(
                reference["tail"], subject.tail(y), tolerance, "small/tail", SMALL_SHAPE_GROUP
            ),
        ]
        failing = [case["name"] for case in cases if not case["gate_pass"]]
        results[subject.name] = {"passed": not failing, "failing_checks": failing, "cases": cases}
        say(f"small shape correctness {subject.name}: {failing or 'pass'}")
    del subjects, reference
    torch.cuda.empty_cache()
    return results


def small_shape_control(
    spec,
    tail,
    baseline_names: Sequence[str],
    modules: Mapping[str, Any],
    shape: Mapping[str, int],
    protocol: Mapping[str, int],
    tolerance: Mapping[str, float],
    say: Callable[[str], None],
) -> dict:
    """The task model at the small shape (seeded `shape["seed"]`): every implementation
    checked first, then the ones that pass timed like the main timing."""
    import torch

    seed = shape["seed"]
    model, input_shape = small_program(spec, tail, shape)
    x = make_input("uniform", input_shape, seed, "cuda")
    program = Program(model, x, tail, baseline_names, modules)
    checked = small_shape_correctness(program, tolerance, say)
    skipped = {
        name: {
            "reason": "failed correctness at the small shape (official predicate)",
            "failing_checks": result["failing_checks"],
        }
        for name, result in checked.items()
        if not result["passed"]
    }
    timed_baselines = [name for name in baseline_names if name not in skipped]
    timed_variants = {name: module for name, module in modules.items() if name not in skipped}
    say(f"small shape {dict(shape)}: timing {timed_baselines + list(timed_variants)}")
    timed = measure_program(
        program.only(timed_baselines, timed_variants), protocol, say, (spec.task, "small")
    )
    result = {
        "shape": dict(shape),
        "weights_sha256": weights_sha256(model),
        "correctness": checked,
        "timed": timed_baselines + list(timed_variants),
        "skipped": skipped,
        "measurements": timed["measurements"],
        "ratios": timed["ratios"],
        "tail_bytes": timed["tail_bytes"],
    }
    del model, x
    torch.cuda.empty_cache()
    return result


def _zero_tail_parameters(model, tail):
    """A copy of the model whose tail parameters (task 95's add_value, a convolution's bias)
    are zero, so the control values reach the tail's pointwise ops unchanged."""
    import torch

    zeroed = copy.deepcopy(model)
    with torch.no_grad():
        for param in tail.tail_parameters(zeroed).values():
            param.zero_()
    return zeroed


def tiny_values_control(
    model,
    tail,
    modules: Mapping[str, Any],
    tiny: Mapping[str, Any],
    tolerance: Mapping[str, float],
    say: Callable[[str], None],
) -> dict:
    """Every variant module's tail on the tiny-value cases (the tail's own parameters zeroed,
    so the values reach the kernel's arithmetic as they are) against the reference tail; for a
    tail that reduces, its element-wise stage (the stage kernel against eager's stage)."""
    import torch

    zeroed = _zero_tail_parameters(model, tail)
    cols = int(tail.control_columns(zeroed))
    cases = tiny_value_cases(tiny["low"], tiny["high"], tiny["dense_count"])
    result: dict[str, dict] = {variant: {"cases": []} for variant in modules}
    with torch.no_grad():
        for name, values in cases.items():
            block = torch.from_numpy(as_rows(values, cols)).to("cuda")
            y = tail.control_input(zeroed, block)
            reference, run = _tiny_reference(tail, zeroed, y, values.size)
            for variant, module in modules.items():
                candidate = run(module)
                record = numerics.compare(
                    reference,
                    candidate,
                    atol=tolerance["atol"],
                    rtol=tolerance["rtol"],
                    name=name,
                    group=TINY_GROUP,
                )
                result[variant]["cases"].append(record)
                say(
                    f"tiny values {variant} {name}: bit_equal {record['bit_equal']}/"
                    f"{record['elements']}, official {record['official_pass']}"
                )
    del zeroed
    torch.cuda.empty_cache()
    return result


def _tiny_reference(tail, model, y, count: int):
    """(eager's values, module -> the kernel's values) of one tiny-value case: the first
    `count` outputs of a pointwise tail, or a reducing tail's whole element-wise stage."""
    import torch

    if tail.pointwise:

        def run(module):
            out = torch.full(tail.output_shape(model, y), float("nan"), device=y.device)
            launch.run_tail(module, tail, model, y, out)
            return out.reshape(-1)[:count]

        return tail.reference(model, y).reshape(-1)[:count], run

    def run_stage(module):
        out = torch.full(tail.stage_shape(model, y), float("nan"), device=y.device)
        return launch.run_stage(module, tail, model, y, out)

    return tail.stage_reference(model, y), run_stage


def _flushes_subnormals(module) -> bool:
    """The FTZ mode measured on the device: witness 1e-10f * 1e-30f flushed to zero?"""
    import torch

    x = torch.full((1,), 1e-10, dtype=torch.float32, device="cuda")
    out = launch.run_witness(module, x, 1e-30)
    return bool((out == 0).all().item())


def ftz_cost_control(
    program: Program,
    pairs: Mapping[str, dict],
    cost: Mapping[str, int],
    protocol: Mapping[str, int],
    say: Callable[[str], None],
    labels: Sequence[Any] = (),
) -> dict:
    """Each route's FTZ-on variant against its FTZ-off twin (`pairs`), tail alone, graph
    replay, interleaved; with the effective FTZ of each measured on the device."""
    import torch

    model, x, tail, modules = program.model, program.x, program.tail, program.modules
    result: dict[str, dict] = {}
    with torch.no_grad():
        y = tail.library_output(model, x)
        for route, pair in pairs.items():
            on, off = pair["ftz_on"], pair["ftz_off"]
            impls = {}
            for variant in (on, off):
                out = torch.empty(tail.output_shape(model, y), dtype=y.dtype, device=y.device)
                impls[variant] = functools.partial(
                    launch.run_tail, modules[variant], tail, model, y, out
                )
            say(f"ftz cost {route}: {on} (ftz on) vs {off} (ftz off)")
            samples, positions = time_interleaved(
                impls,
                "graph",
                warmup=protocol["warmup"],
                rounds=cost["rounds"],
                invocations_per_pair=cost["replays_per_pair"],
                seed=block_seed(protocol["order_seed"], *labels, "ftz_cost", route),
                log=say,
            )
            entry = {
                "ftz_on": on,
                "ftz_off": off,
                "warmup": protocol["warmup"],
                "rounds": cost["rounds"],
                "replays_per_pair": cost["replays_per_pair"],
                "on": stats(samples[on], positions[on]),
                "off": stats(samples[off], positions[off]),
                "ratio_on_over_off": paired_ratios(samples[on], samples[off], cycle=2),
                "effective_ftz": {
                    "on": _flushes_subnormals(modules[on]),
                    "off": _flushes_subnormals(modules[off]),
                },
            }
            say(f"ftz cost {route}: on/off median {entry['ratio_on_over_off']['median']:.4f}")
            result[route] = entry
    return result


def run_controls(
    inputs: TimedTask,
    controls_cfg: Mapping[str, Any],
    tolerance: Mapping[str, float],
    protocol: Mapping[str, Any],
    out: str | os.PathLike,
    log: str | os.PathLike | None = None,
) -> dict:
    """Small-shape timing, tiny-value cases, FTZ cost and every float32 input (the exhaustive
    control) for one task; writes controls JSON.

    Timed here is only what passed correctness at the main shape (variants on their records,
    TorchScript and Inductor on the task's baselines.json) and, at the small shape, again there.
    """
    import torch

    say = Progress(log, "kbfuse.checks.controls")
    cfg = check_controls_cfg(controls_cfg, tails.tail_for(inputs.task).small_shape_keys)
    protocol = check_protocol(protocol)
    tolerance = {"atol": float(tolerance["atol"]), "rtol": float(tolerance["rtol"])}
    task, variants = inputs.task, inputs.variants
    gated = inputs.gate(say)
    metas, eligible = gated["metas"], gated["variants"]
    pairs = ftz_pairs({v: metas[v] for v in eligible})
    for route, pair in pairs.items():
        for on, off in pair.pop("others"):
            say(f"ftz cost {route}: pair {on}/{off} not timed, {pair['ftz_on']} is timed instead")

    spec, tail, numerics = inputs.load()
    # Every variant is loaded for the (diagnostic) tiny values; only eligible ones are timed.
    modules = load_modules(variants, list(variants), metas, tail.kernels())
    eligible_modules = {v: modules[v] for v in eligible}

    small = small_shape_control(
        spec,
        tail,
        gated["baselines"],
        eligible_modules,
        cfg["small_shape"],
        protocol,
        tolerance,
        say,
    )
    small["skipped"] = {**gated["skipped"], **small["skipped"]}

    model = kernelbench.build_model(spec, seed=protocol["input_seed"])
    x = make_input("uniform", tail.input_shape(spec), protocol["input_seed"], "cuda")
    main_shape = Program(model, x, tail, (), modules)
    ftz_cost = ftz_cost_control(main_shape, pairs, cfg["ftz_cost"], protocol, say, (task,))
    del main_shape, x
    tiny = tiny_values_control(model, tail, modules, cfg["tiny_values"], tolerance, say)
    # A reducing tail maps no single input to a single output: no exhaustive control
    # (kbfuse.checks.exhaustive); its stage's bits are checked case by case instead.
    every_input = exhaustive_control(model, tail, modules, say) if tail.pointwise else {}

    result = make_record(
        "controls",
        task=task,
        provenance=task_provenance(
            spec,
            weights_sha256=weights_sha256(model),
            artifacts={v: metas[v]["artifact_sha256"] for v in variants},
        ),
        protocol=protocol,
        numerics=numerics,
        tolerance=tolerance,
        small_shape=small,
        tiny_values=tiny,
        ftz_cost=ftz_cost,
        exhaustive=every_input,
    )
    write_json(out, result)
    say(f"task {task}: wrote {out}")
    del modules, model
    torch.cuda.empty_cache()
    return result


def run_witness81(
    variants: Mapping[str, tuple],
    checkout: str | os.PathLike,
    pin_path: str | os.PathLike,
    out: str | os.PathLike,
    log: str | os.PathLike | None = None,
    inputs: Sequence[float] = WITNESS_INPUTS,
) -> dict:
    """Task 81's eager tail against every variant at the witness inputs; values and bits."""
    import torch

    say = Progress(log, "kbfuse.checks.controls")
    values = [float(v) for v in inputs]
    if not values or not all(math.isfinite(v) for v in values):
        raise KbfuseError(f"witness81 inputs {list(inputs)!r} must be finite numbers")
    metas = read_compile_metas(variants)
    pin = kernelbench.read_pin(pin_path)
    spec = kernelbench.load_task(checkout, pin, WITNESS_TASK)
    tail = tails.tail_for(WITNESS_TASK)
    baseline_builders.set_numerics()
    model = kernelbench.build_model(spec, seed=0)  # task 81's tail has no parameters

    with torch.no_grad():
        y = torch.tensor([values], dtype=torch.float32, device="cuda")
        reference = tail.reference(model, y).reshape(-1).tolist()
        reference_bits = [numerics.f32_bits_hex(v) for v in reference]
        result_variants: dict[str, list[dict]] = {}
        for variant in variants:
            module = load_modules(variants, [variant], metas)[variant]
            out_tensor = torch.full_like(y, float("nan"))
            launch.run_tail(module, tail, model, y, out_tensor)
            outputs = out_tensor.reshape(-1).tolist()
            rows = []
            for value, output, ref_bits in zip(values, outputs, reference_bits, strict=True):
                bits = numerics.f32_bits_hex(output)
                rows.append(
                    {
                        "input": value,
                        "output": output,
                        "output_bits": bits,
                        "bit_equal": bits == ref_bits,
                    }
                )
                say(f"witness81 {variant} at {value:g}: {output!r} ({bits}), reference {ref_bits}")
            result_variants[variant] = rows

    result = make_record(
        "witness81",
        provenance=task_provenance(
            spec, artifacts={v: metas[v]["artifact_sha256"] for v in variants}
        ),
        inputs=values,
        reference=[
            {"input": value, "output": output, "output_bits": bits}
            for value, output, bits in zip(values, reference, reference_bits, strict=True)
        ],
        variants=result_variants,
    )
    write_json(out, result)
    say(f"witness81: wrote {out}")
    return result
