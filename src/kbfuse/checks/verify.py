"""The verify stage: measure on the device which numerical mode an artifact really has.

The compile metadata says which options were passed; the device says what they did.
`witness_mul` (compiled into the same module by the same route) multiplies 1e-10f by
1e-30f: the exact product is subnormal, so a zero output means flush-to-zero is in effect
and the float32 product computed on the host means subnormals are kept. The task-81 tail
at -88 and -87.5 (where sigmoid is subnormal) is compared bit for bit with the pinned
model's eager tail. Requested, expected and effective FTZ are recorded side by side, and
any disagreement becomes a `finding` sentence rather than being ignored.

One job measures every variant (`verify_variants`; the workflow's rule `verify_variants`):
each artifact is loaded as its own module in the same process, the task-81 model and its eager
reference are built once, and each variant still gets its own results/verify/{variant}.json.

The workflow script calls `kbfuse.compilation.cudacache.isolate` before this module touches CUDA.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import torch

from kbfuse.checks.numerics import f32_bits_hex
from kbfuse.compilation import cudacache
from kbfuse.compilation.launch import LoadedModule, run_tail, run_witness
from kbfuse.compilation.routes import parse_option, requested_ftz
from kbfuse.errors import KbfuseError
from kbfuse.io import read_json
from kbfuse.stage import Progress, make_record, read_compile_meta, write_all
from kbfuse.tasks.kernelbench import build_model, load_task, read_pin
from kbfuse.tasks.registry import WITNESS_INPUTS, WITNESS_TASK, kernel_name
from kbfuse.tasks.tails import tail_for

_log = logging.getLogger("kbfuse.checks.verify")

WITNESS_INPUT = 1e-10
WITNESS_SCALE = 1e-30
REQUIRED_META_KEYS = (
    "variant",
    "route",
    "kernel",
    "requested_options",
    "actual_options",
    "implicit_options",
    "expected_ftz",
    "artifact_sha256",
)
TASK81_SEED = 0  # the task-81 tail has no parameters; the seed only fixes the unused linear


def _implicit_ftz_options(implicit_options: list[str]) -> list[str]:
    """The route's own options that set FTZ (CuPy's appended -ftz=true)."""
    found = []
    for option in implicit_options:
        parsed, _ = parse_option(option)
        if parsed is not None and parsed.spec.name == "ftz":
            found.append(option)
    return found


def _route_owner(route: str) -> str:
    return "CuPy's" if route.startswith("cupy") else f"the {route} route's"


def _mode(ftz: bool) -> str:
    return "flushes subnormals to zero" if ftz else "keeps subnormals"


def describe_finding(
    variant: str,
    route: str,
    requested: bool | None,
    expected: bool,
    effective: bool,
    actual_options: list[str],
    implicit_options: list[str],
) -> str | None:
    """A sentence for every way requested/expected/effective FTZ disagree; None if they agree.

    Options that name no FTZ value request the compilers' default (FTZ off), so an artifact
    that flushes without being asked to is a finding too.
    """
    sentences = []
    wanted = bool(requested)  # None: nothing requested, the compilers' default is FTZ off
    if wanted != effective:
        implicit = _implicit_ftz_options(implicit_options)
        if requested is None:
            asked = "options do not request FTZ"
        else:
            asked = f"options request FTZ {'on' if requested else 'off'}"
        if implicit and expected == effective:
            cause = f"{_route_owner(route)} implicit {' '.join(implicit)} {_mode(effective)}"
        else:
            cause = f"the artifact {_mode(effective)} (actual options: {' '.join(actual_options)})"
        sentences.append(f"{variant}: {asked}, but {cause}")
    if expected != effective:
        sentences.append(
            f"{variant}: the options actually passed imply FTZ "
            f"{'on' if expected else 'off'}, but the loaded artifact {_mode(effective)} on the "
            "device; the artifact does not match its compile options (a CUDA compute-cache "
            "entry from another FTZ setting is one known cause: see cuda_cache)"
        )
    return "; ".join(sentences) if sentences else None


def _float32_value(t: torch.Tensor) -> float:
    return float(t.detach().reshape(()).cpu().item())


def measure_witness(mod: LoadedModule) -> tuple[dict, bool]:
    """(witness record, effective FTZ): witness_mul at x = 1e-10, s = 1e-30, output NaN-poisoned."""
    return witness_record(witness_output(mod), mod.variant)


def witness_output(mod: LoadedModule) -> float:
    """What `mod`'s witness_mul returns on the device for x = 1e-10, s = 1e-30 (the only part
    of the witness that needs a GPU; CPU tests stand in for it with a fake device)."""
    device = torch.device("cuda", mod.device)
    x = torch.full((1,), WITNESS_INPUT, dtype=torch.float32, device=device)
    out = torch.full_like(x, math.nan)
    run_witness(mod, x, WITNESS_SCALE, out=out)
    torch.cuda.synchronize(device)
    return _float32_value(out)


def witness_record(output: float, variant: str) -> tuple[dict, bool]:
    """(witness record, effective FTZ) of the device's witness output: zero means flushed, the
    float32 product computed on the host means kept; anything else is a KbfuseError."""
    # numpy float32 arithmetic on the host keeps subnormals (no FTZ on the CPU)
    product = float(np.float32(WITNESS_INPUT) * np.float32(WITNESS_SCALE))
    if product == 0.0 or abs(product) >= float(np.finfo(np.float32).tiny):
        raise KbfuseError(f"host witness product {product!r} is not a float32 subnormal")
    output_bits, product_bits = f32_bits_hex(output), f32_bits_hex(product)
    flushed = output == 0.0
    kept = output_bits == product_bits
    if not (flushed or kept):
        raise KbfuseError(
            f"variant {variant!r}: witness_mul({WITNESS_INPUT}, {WITNESS_SCALE}) gave "
            f"{output!r} ({output_bits}), neither zero (FTZ) nor the float32 product "
            f"{product!r} ({product_bits}); the kernel did not run as compiled"
        )
    record = {
        "input": WITNESS_INPUT,
        "input_bits": f32_bits_hex(WITNESS_INPUT),
        "scale": WITNESS_SCALE,
        "scale_bits": f32_bits_hex(WITNESS_SCALE),
        "output": output,
        "output_bits": output_bits,
        "host_product": product,
        "host_product_bits": product_bits,
        "subnormal_kept": kept,
    }
    return record, flushed


class Task81Witness:
    """The pinned task-81 model, its tail and the eager reference at WITNESS_INPUTS: built once,
    then `measure(mod)` runs each variant's kernel tail on the same input."""

    def __init__(self, checkout: Path, pin: dict, device: torch.device):
        spec = load_task(checkout, pin, WITNESS_TASK)
        self.device = device
        self.model = build_model(spec, TASK81_SEED, device=device)
        self.tail = tail_for(WITNESS_TASK)
        self.y = torch.tensor([WITNESS_INPUTS], dtype=torch.float32, device=device)
        self.reference = self.tail.reference(self.model, self.y)
        torch.cuda.synchronize(device)

    def measure(self, mod: LoadedModule) -> list[dict]:
        """The task-81 tail of `mod` at WITNESS_INPUTS against the eager tail, bitwise."""
        out = torch.full_like(self.y, math.nan)
        run_tail(mod, self.tail, self.model, self.y, out=out)
        torch.cuda.synchronize(self.device)
        records = []
        for i, value in enumerate(WITNESS_INPUTS):
            output, ref = _float32_value(out[0, i]), _float32_value(self.reference[0, i])
            output_bits = f32_bits_hex(out[0, i])
            reference_bits = f32_bits_hex(self.reference[0, i])
            records.append(
                {
                    "input": value,
                    "output": output,
                    "output_bits": output_bits,
                    "reference": ref,
                    "reference_bits": reference_bits,
                    "bit_equal": output_bits == reference_bits,
                }
            )
        return records


def verify_variants(
    variants: Mapping[str, tuple],
    checkout: str | os.PathLike,
    pin_path: str | os.PathLike | None,
    outs: Mapping[str, str | os.PathLike],
    log: str | os.PathLike | None = None,
) -> dict[str, dict]:
    """Measure every artifact's effective FTZ in one process; write results/verify/{name}.json.

    `variants`: name -> (artifact, compile meta path), measured in this order; `outs`: name ->
    output path. Every metadata file is checked before CUDA is touched, the task-81 model and
    its eager reference are built once, and the files are written only after every variant is
    measured (a failure leaves none of them). Each record is what `verify_variant` for that
    artifact alone writes. `pin_path` is a pin record holding task 81, or None when the study
    has no task 81 (each record then has an empty `task81` and says why in `task81_note`).
    Progress goes to the "kbfuse.checks.verify" logger and, when `log` is given, to that file as
    well.
    """
    say = Progress(log, _log, fresh=True)
    try:
        names = _check_variants(variants, outs)
        metas = {
            name: read_compile_meta(variants[name][1], name, REQUIRED_META_KEYS) for name in names
        }
        pin = read_pin(pin_path) if pin_path is not None else None
        witness81: list[Task81Witness] = []  # built with the first loaded module
        records = {}
        for name in names:
            artifact = Path(variants[name][0])
            records[name] = _verify(
                artifact, metas[name], Path(checkout), pin, pin_path, say, witness81
            )
        write_all({outs[name]: records[name] for name in names})
        for name in names:
            say(f"wrote {outs[name]}")
        return records
    except Exception as exc:
        say(f"failed: {exc}")
        raise


def verify_variant(
    artifact: str | os.PathLike,
    meta_path: str | os.PathLike,
    checkout: str | os.PathLike,
    pin_path: str | os.PathLike | None,
    out: str | os.PathLike,
    log: str | os.PathLike | None = None,
) -> dict:
    """Measure one artifact's effective FTZ and write results/verify/{variant}.json
    (`verify_variants` for that artifact alone; the variant is the one its metadata names)."""
    name = _meta_variant(meta_path)
    records = verify_variants({name: (artifact, meta_path)}, checkout, pin_path, {name: out}, log)
    return records[name]


def _meta_variant(meta_path) -> str | None:
    """The variant a metadata file names, or None (verify_variants then says what is wrong)."""
    try:
        meta = read_json(meta_path)
    except (OSError, ValueError):
        return None
    return meta.get("variant") if isinstance(meta, dict) else None


def _check_variants(variants, outs) -> list:
    if not isinstance(variants, Mapping) or not variants:
        raise KbfuseError(
            f"variants must be a non-empty mapping name -> (artifact, meta), got {variants!r}"
        )
    if not isinstance(outs, Mapping) or set(outs) != set(variants):
        raise KbfuseError(
            f"outs must map exactly the variants {list(variants)} to output paths, got {outs!r}"
        )
    paths = [str(Path(outs[name])) for name in variants]
    if len(set(paths)) != len(paths):
        raise KbfuseError(f"two variants share an output path: {paths}")
    return list(variants)


def _verify(
    artifact: Path, meta: dict, checkout: Path, pin, pin_path, say, witness81: list
) -> dict:
    requested = requested_ftz(meta["requested_options"])
    expected = bool(meta["expected_ftz"])
    cache_setting = cudacache.current_setting()
    say(f"variant {meta['variant']} route {meta['route']} artifact {artifact}")
    say(f"cuda cache: {cache_setting}")

    # The witness kernel at once; task 81's tail, where the study has it, on first use (the
    # second study's sources define other tails: kbfuse.tasks.registry.kernel_names).
    mod = LoadedModule.load(artifact, meta, kernels=())
    witness, effective = measure_witness(mod)
    say(
        f"witness_mul({WITNESS_INPUT}, {WITNESS_SCALE}) = {witness['output']!r} "
        f"({witness['output_bits']}): effective FTZ {effective}"
    )

    if pin is not None and str(WITNESS_TASK) in pin["tasks"]:
        if not witness81:
            witness81.append(Task81Witness(checkout, pin, torch.device("cuda", mod.device)))
        task81 = witness81[0].measure(mod)
        task81_note = None
        for r in task81:
            say(
                f"{kernel_name(WITNESS_TASK)}({r['input']}) = {r['output']!r} "
                f"({r['output_bits']}), eager "
                f"{r['reference']!r} ({r['reference_bits']})"
            )
    else:
        task81 = []
        where = "the study" if pin is None else f"the pin record {pin_path}"
        task81_note = (
            f"task {WITNESS_TASK} is not in {where}: no task-{WITNESS_TASK} tail witness was run"
        )
        say(task81_note)

    finding = describe_finding(
        meta["variant"],
        meta["route"],
        requested,
        expected,
        effective,
        list(meta["actual_options"]),
        list(meta["implicit_options"]),
    )
    say(f"finding: {finding}")
    return make_record(
        "verify",
        variant=meta["variant"],
        route=meta["route"],
        kernel=meta["kernel"],
        artifact_sha256=meta["artifact_sha256"],
        requested_ftz=requested,
        expected_ftz=expected,
        effective_ftz=effective,
        witness=witness,
        task81=task81,
        task81_note=task81_note,
        mismatch=expected != effective,
        requested_mismatch=requested is not None and requested != effective,
        finding=finding,
        cuda_cache=cache_setting,
    )
