"""What every GPU stage (verify, correctness, timing, controls) does around its measurements.

- `Progress`: one progress line at a time, to the stage's logger and appended to the job's log
  file, so an interrupted job leaves the lines it got to;
- `read_compile_meta(s)`: a variant's compile metadata (results/compile/{variant}/meta.json),
  checked before any CUDA work: a compile record, for that variant, with the keys the stage
  reads, and an artifact hash to check the artifact and the correctness records against;
- `load_modules`: the compiled artifacts of the named variants, and only those, loaded;
- `record` and `task_provenance`: the header every result record starts with (its kind,
  `schema_version`, the CUDA cache setting in force) and the provenance of a task's records
  (the pinned commit and the task file's sha256);
- `write_all`: a stage's records written only once every one is computed, and none left
  behind when one write fails;
- `Program`: what a stage runs on one task at one shape: the model and its input, the fused
  tail, the compiled baselines by name and the loaded variant modules;
- `measure_program`: every implementation of a program (baselines and loaded kernel modules)
  timed at both scopes (the whole program, the tail alone) with both methods, by the protocol
  of `kbfuse.timing.measure`: the timing stage's main measurement and the controls' small shape.

The stages differ in what they measure; this module holds what they share, so that a new
stage (or a change to what every record carries) is written once.
"""

from __future__ import annotations

import functools
import logging
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from kbfuse.compilation import cudacache, launch
from kbfuse.errors import KbfuseError
from kbfuse.io import read_json, write_json
from kbfuse.tasks import baselines as baseline_builders
from kbfuse.timing.measure import METHODS, SCOPES, assemble_scope, block_seed, time_interleaved

SCHEMA_VERSION = 1
# Keys every stage reads from compile metadata.
COMPILE_META_KEYS = ("variant", "artifact_sha256")


class Progress:
    """Progress lines to `logger` and, when a path is given, appended to that file.

    `fresh=True` empties the file first, for a stage whose log holds one run only."""

    def __init__(
        self,
        log: str | os.PathLike | None,
        logger: logging.Logger | str = "kbfuse",
        *,
        fresh: bool = False,
    ):
        self.path = Path(log) if log is not None else None
        self.logger = logging.getLogger(logger) if isinstance(logger, str) else logger
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            if fresh:
                self.path.write_text("")

    def __call__(self, message: str) -> None:
        self.logger.info("%s", message)
        if self.path is not None:
            with open(self.path, "a") as fh:
                fh.write(message + "\n")


def read_compile_meta(
    meta_path: str | os.PathLike, variant: str, required: Iterable[str] = ()
) -> dict:
    """The compile metadata of `variant`; KbfuseError naming the file unless it is a compile
    record for that variant holding `required` and COMPILE_META_KEYS, with a sha256 string."""
    try:
        meta = read_json(meta_path)
    except (OSError, ValueError) as exc:
        raise KbfuseError(f"variant {variant}: compile metadata {meta_path}: {exc}") from exc
    if not isinstance(meta, dict) or meta.get("kind") != "compile":
        raise KbfuseError(f"compile metadata {meta_path} is not a compile record (kind 'compile')")
    missing = [key for key in dict.fromkeys((*required, *COMPILE_META_KEYS)) if key not in meta]
    if missing:
        raise KbfuseError(f"compile metadata {meta_path} lacks key(s) {missing}")
    if meta["variant"] != variant:
        raise KbfuseError(
            f"compile metadata {meta_path} is for variant {meta['variant']!r}, not {variant!r}"
        )
    if not isinstance(meta["artifact_sha256"], str):
        raise KbfuseError(f"variant {variant}: {meta_path} has no artifact_sha256")
    return meta


def read_compile_metas(
    variants: Mapping[str, tuple], required: Iterable[str] = ()
) -> dict[str, dict]:
    """Variant -> compile metadata for `variants` (name -> (artifact, meta path)), in order."""
    required = tuple(required)
    return {
        name: read_compile_meta(meta_path, name, required)
        for name, (_artifact, meta_path) in variants.items()
    }


def load_modules(
    variants: Mapping[str, tuple],
    names: Iterable[str],
    metas: Mapping[str, dict],
    kernels: Iterable[str] = launch.KERNEL_NAMES,
) -> dict[str, Any]:
    """LoadedModule per named variant (only these are ever loaded), each with `kernels` looked
    up at once (the tail's: `Tail.kernels()`)."""
    kernels = tuple(kernels)
    return {
        name: launch.LoadedModule.load(Path(variants[name][0]), metas[name], kernels)
        for name in names
    }


def task_provenance(spec, **extra: Any) -> dict:
    """Where a task's record comes from: the pinned commit and the task file's sha256."""
    return {"pin_commit": spec.pin_commit, "task_sha256": spec.sha256, **extra}


def make_record(kind: str, **fields: Any) -> dict:
    """A result record of `kind`: its header, `fields`, and the CUDA cache setting in force
    (`cuda_cache`, unless given)."""
    return {
        "kind": kind,
        "schema_version": SCHEMA_VERSION,
        **fields,
        "cuda_cache": fields.get("cuda_cache", cudacache.current_setting()),
    }


def write_all(records: Mapping[Any, Any]) -> None:
    """write_json every path -> record, only once all are computed; if one write fails, the
    files already written are removed again, so a failure leaves no partial set behind."""
    written: list[Path] = []
    try:
        for path, content in records.items():
            write_json(path, content)
            written.append(Path(path))
    except BaseException:
        for path in written:
            path.unlink(missing_ok=True)
        raise


# --------------------------------------------------------------------------- timed programs


@dataclass(frozen=True)
class Program:
    """The implementations a stage runs on one task at one shape: the task's `model` and its
    input `x`, the task's fused `tail` (kbfuse.tasks.tails), the compiled baselines by name
    (`baseline_names`, eager included) and the loaded variant `modules` (name -> module)."""

    model: Any
    x: Any
    tail: Any
    baseline_names: Sequence[str]
    modules: Mapping[str, Any]

    def only(self, baseline_names: Sequence[str], modules: Mapping[str, Any]) -> Program:
        """The same program with only these baselines and modules."""
        return replace(self, baseline_names=list(baseline_names), modules=dict(modules))


def built_baseline(name: str, target, example) -> tuple[Callable[[], Any], float]:
    """(the zero-argument run of baseline `name` on `example`, its build seconds): the time
    to its first output, the build and the first call (where Inductor compiles, max-autotune
    benchmarking its candidate kernels too) with the device synchronised."""
    import torch

    start = time.perf_counter()
    run = functools.partial(baseline_builders.build(name, target, example), example)
    run()
    torch.cuda.synchronize()
    return run, time.perf_counter() - start


def scope_impls(
    scope: str, program: Program, y, build_s: dict[str, float] | None = None
) -> dict[str, Callable[[], Any]]:
    """Zero-argument callables for one scope, baselines first, then variants; each
    baseline's build seconds go into `build_s` when given.

    full: x -> the whole model (baselines) or FusedProgram (the model's library op, then the
    kernel). tail: the fixed library output y -> the model's tail (baselines, built on the
    model with its library op swapped for the tail's stand-in) or run_tail into a
    preallocated output.
    """
    import torch

    model, x, tail = program.model, program.x, program.tail
    if scope == "full":
        target, example = model, x
    elif scope == "tail":
        target, example = baseline_builders.tail_module(model, tail), y
    else:
        raise KbfuseError(f"timing scope {scope!r} is unknown; known: {list(SCOPES)}")
    impls: dict[str, Callable[[], Any]] = {}
    for name in program.baseline_names:
        impls[name], seconds = built_baseline(name, target, example)
        if build_s is not None:
            build_s[name] = seconds
    for variant, module in program.modules.items():
        if scope == "full":
            impls[variant] = functools.partial(launch.FusedProgram(module, tail, model), x)
        else:
            out = torch.empty(tail.output_shape(model, y), dtype=y.dtype, device=y.device)
            impls[variant] = functools.partial(launch.run_tail, module, tail, model, y, out)
    return impls


def measure_program(
    program: Program,
    protocol: Mapping[str, int],
    say: Callable[[str], None],
    labels: Sequence[Any] = (),
) -> dict:
    """Time both scopes with both methods; {measurements, ratios, tail_bytes, build_s} (each
    baseline's build seconds per scope: `built_baseline`).

    Each scope/method block gets its own balanced round orders, seeded from the protocol's
    order seed and `labels` (the task, and the control's name) plus the block's key.
    """
    import torch

    tail = program.tail
    with torch.no_grad():
        y = tail.library_output(program.model, program.x)
        measurements: dict[str, dict] = {}
        ratios: dict[str, dict] = {}
        build_s: dict[str, dict[str, float]] = {}
        for scope in SCOPES:
            impls = scope_impls(scope, program, y, build_s.setdefault(scope, {}))
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
                    samples, positions, program.baseline_names, list(program.modules)
                )
                for name, entry in measurements[key].items():
                    say(f"{key} {name}: median {entry['median_ms']:.6f} ms")
            del impls
            torch.cuda.empty_cache()
        tail_bytes = int(tail.bytes_moved(y))
    return {
        "measurements": measurements,
        "ratios": ratios,
        "tail_bytes": tail_bytes,
        "build_s": build_s,
    }
