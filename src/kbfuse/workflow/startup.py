"""What one GPU job of the workflow pays before its real work, phase by phase.

Every GPU job is a fresh Python process (Snakemake's `script:` directive): the interpreter
starts, Snakemake's preamble imports `snakemake`, the script imports torch, CuPy and the
kbfuse stage modules, initialises CUDA, loads the pinned KernelBench task and builds its
model as KernelBench does (on the CPU, then moved to the GPU), and the baseline jobs compile
the task's tail with Inductor. `measure` times each phase in a *fresh* child process, N
times, and reports medians: a child first runs the phase's prerequisites untimed (e.g.
`import torch` before timing `import cupy`, CUDA initialised before timing the move of the
model to the GPU), so each row is the marginal cost of its phase in a job, measured
without anything already imported or cached in the benchmark's own process.

Inductor is timed twice per repeat: with a COLD cache (fresh empty TORCHINDUCTOR_CACHE_DIR
and TRITON_CACHE_DIR), then in a second fresh process on the same directories (WARM: FX
graph and Triton kernels found on disk). Phases that need a GPU are listed as not measured
when torch sees none, so the CPU phases run anywhere; a GPU child started without a GPU
stops with kbfuse.workflow.jobs' "needs a CUDA GPU" message.
"""

from __future__ import annotations

import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kbfuse
from kbfuse.errors import KbfuseError
from kbfuse.tasks.kernelbench import read_pin

SCHEMA_VERSION = 1
KIND = "gpu_job_startup"
MARKER = "KBFUSE_STARTUP "
CHILD_TIMEOUT_S = 300.0
NO_GPU = "not measured: no GPU"


@dataclass(frozen=True)
class Phase:
    name: str
    label: str
    child: str  # the child process that times it (several phases may share one)
    gpu: bool = False


PHASES = (
    Phase("interpreter", "interpreter start (`python -c pass`, whole process)", "interpreter"),
    Phase("import_torch", "`import torch`", "import_torch"),
    Phase("import_cupy", "`import cupy` (after torch)", "import_cupy"),
    Phase(
        "import_snakemake",
        "`import snakemake` (the `script:` preamble's imports)",
        "import_snakemake",
    ),
    Phase("import_kbfuse", "import the kbfuse stage modules (after torch)", "import_kbfuse"),
    Phase(
        "cuda_init",
        "CUDA init: torch.cuda.init(), 1-element allocation, synchronize",
        "cuda_init",
        True,
    ),
    Phase("load_task", "load the pinned KernelBench task (re-hash + import)", "model"),
    Phase("build_model_cpu", "build the model on the CPU (seeded, as KernelBench does)", "model"),
    Phase("model_to_cuda", "move the model to the GPU (+ synchronize)", "model", True),
    Phase(
        "inductor_cold",
        "Inductor: compile the tail + first call, COLD cache",
        "inductor_cold",
        True,
    ),
    Phase(
        "inductor_warm",
        "Inductor: compile the tail + first call, WARM cache (new process)",
        "inductor_warm",
        True,
    ),
)
PHASE_NAMES = tuple(p.name for p in PHASES)
# What every GPU job pays (Inductor compiles only in the jobs that run the baselines).
STARTUP_PHASES = PHASE_NAMES[:-2]


# ---------------------------------------------------------------- child programs
#
# Each child is `python -c <program> <json args>`; it prints one line MARKER + JSON of
# {phase: seconds}. Only the statements between perf_counter() calls are timed.

_PRELUDE = """\
import json, sys, time
_args = json.loads(sys.argv[1])
_out = {}
"""
_EMIT = "print(" + repr(MARKER) + " + json.dumps(_out), flush=True)\n"
_ISOLATE = """\
from kbfuse.compilation import cudacache
cudacache.isolate(_args["scratch"])
"""
_REQUIRE_GPU = """\
from kbfuse.workflow.jobs import require_gpu
require_gpu("startup benchmark: " + _args["child"])
"""
_TORCH = "import torch\n"
_CUDA = "torch.cuda.init(); torch.empty(1, device='cuda'); torch.cuda.synchronize()\n"
_TASK = """\
from kbfuse.tasks.kernelbench import build_model, load_task, read_pin
_pin = read_pin(_args["pin"])
"""


def _timed(name: str, code: str) -> str:
    """`code` timed as phase `name`."""
    return f"_t = time.perf_counter()\n{code}_out[{name!r}] = time.perf_counter() - _t\n"


def child_program(child: str, gpu: bool) -> str:
    """The Python source of one child (`gpu`: whether the model child moves it to the GPU)."""
    body = {
        "import_torch": _timed("import_torch", _TORCH),
        "import_cupy": _TORCH + _timed("import_cupy", "import cupy\n"),
        "import_snakemake": _timed(
            "import_snakemake",
            "from snakemake.logging import logger\nfrom snakemake.iocontainers import Snakemake\n",
        ),
        "import_kbfuse": _TORCH
        + _timed(
            "import_kbfuse",
            "import kbfuse.workflow.jobs, kbfuse.checks.correctness, kbfuse.timing.timing, "
            "kbfuse.checks.controls\n",
        ),
        "cuda_init": _ISOLATE + _TORCH + _REQUIRE_GPU + _timed("cuda_init", _CUDA),
        "model": (_ISOLATE + _TORCH + _REQUIRE_GPU + _CUDA if gpu else _TORCH)
        + _TASK
        + _timed("load_task", '_spec = load_task(_args["checkout"], _pin, _args["task"])\n')
        + _timed("build_model_cpu", '_model = build_model(_spec, _args["seed"], device="cpu")\n')
        + (
            _timed("model_to_cuda", "_model = _model.to('cuda'); torch.cuda.synchronize()\n")
            if gpu
            else ""
        ),
    }
    inductor = (
        _ISOLATE
        + _TORCH
        + _REQUIRE_GPU
        + _CUDA
        + _TASK
        + """\
from kbfuse.tasks import baselines, tails
baselines.set_numerics()
_spec = load_task(_args["checkout"], _pin, _args["task"])
_model = build_model(_spec, _args["seed"], device="cuda")
_tail = tails.tail_for(_args["task"])
_module = baselines.tail_module(_model, _tail)
_y = torch.rand(_spec.input_shape()[0], _tail.library(_model).out_features, device="cuda")
torch.cuda.synchronize()
"""
    )
    compile_and_call = (
        "_fn = baselines.build('inductor', _module, _y); _fn(_y); torch.cuda.synchronize()\n"
    )
    body["inductor_cold"] = inductor + _timed("inductor_cold", compile_and_call)
    body["inductor_warm"] = inductor + _timed("inductor_warm", compile_and_call)
    if child not in body:
        raise KbfuseError(f"unknown startup child {child!r}; known: {sorted(body)}")
    return _PRELUDE + body[child] + _EMIT


# ---------------------------------------------------------------- running children


def child_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This environment, with the kbfuse being measured first on PYTHONPATH."""
    env = dict(os.environ)
    src = str(Path(kbfuse.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [src, env.get("PYTHONPATH")]))
    env.update(extra or {})
    return env


def run_child(
    argv: Sequence[str],
    env: Mapping[str, str],
    what: str,
    timeout_s: float = CHILD_TIMEOUT_S,
    expect_result: bool = True,
) -> tuple[dict[str, float], float]:
    """Run one child; ({phase: seconds} it printed, its wall time in seconds)."""
    start = time.perf_counter()
    try:
        proc = subprocess.run(
            list(argv),
            env=dict(env),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
    except subprocess.TimeoutExpired as exc:
        raise KbfuseError(f"startup child {what} ran past {timeout_s:.0f} s") from exc
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-15:])
        raise KbfuseError(f"startup child {what} exited {proc.returncode}:\n{tail}")
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(MARKER)]
    if not expect_result:
        return {}, wall
    if not lines:
        raise KbfuseError(f"startup child {what} printed no result:\n{proc.stdout[-2000:]}")
    return json.loads(lines[-1][len(MARKER) :]), wall


def gpu_available(env: Mapping[str, str]) -> bool:
    """Whether torch sees a CUDA GPU, asked in a child so this process never touches CUDA."""
    code = "import torch; print(" + repr(MARKER) + " + str(int(torch.cuda.is_available())))"
    proc = subprocess.run(
        [sys.executable, "-c", code], env=dict(env), capture_output=True, text=True, timeout=120
    )
    if proc.returncode != 0:
        raise KbfuseError(f"asking torch for a GPU failed:\n{proc.stderr[-2000:]}")
    return any(ln == MARKER + "1" for ln in proc.stdout.splitlines())


def _summary(samples: list[float]) -> dict:
    return {
        "samples_s": samples,
        "median_s": statistics.median(samples),
        "min_s": min(samples),
        "max_s": max(samples),
    }


def check_phases(phases: Iterable[str] | None) -> list[str]:
    if phases is None:
        return list(PHASE_NAMES)
    phases = list(phases)
    unknown = [p for p in phases if p not in PHASE_NAMES]
    if unknown:
        raise KbfuseError(f"unknown phase(s) {unknown}; known: {', '.join(PHASE_NAMES)}")
    if "inductor_warm" in phases and "inductor_cold" not in phases:
        raise KbfuseError("phase inductor_warm needs inductor_cold (the cold run fills the cache)")
    return [p for p in PHASE_NAMES if p in phases]


def measure(
    checkout: str | os.PathLike,
    pin: str | os.PathLike,
    task: int = 53,
    repeats: int = 3,
    phases: Iterable[str] | None = None,
    seed: int = 42,
    gpu: bool | None = None,
    progress: Callable[[str], None] | None = None,
) -> dict:
    """Time the selected phases (default: all) `repeats` times each, in fresh processes.

    `pin`: results/kernelbench/pin.json or a task pin results/kernelbench/tasks/{task}.json
    (both are pin records; `task` must be in it). `gpu`: None asks torch in a child when a
    selected phase needs the GPU (the report's `gpu` stays None when none does).
    Repeats are interleaved (every child once per round), so drift spreads over all phases.
    """
    say = progress or (lambda _msg: None)
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise KbfuseError(f"repeats is {repeats!r}: it must be an integer >= 1")
    selected = check_phases(phases)
    given = os.fspath(checkout)  # recorded as given: a path of this machine is not a result
    checkout = Path(checkout).resolve()
    record = read_pin(pin)
    if str(int(task)) not in record["tasks"]:
        raise KbfuseError(
            f"task {task} is not in the pin record {pin} (pinned tasks: "
            f"{sorted(record['tasks'], key=int)}); pass results/kernelbench/pin.json or "
            f"results/kernelbench/tasks/{task}.json"
        )
    if not checkout.is_dir():
        raise KbfuseError(f"KernelBench checkout {checkout} is not a directory")
    env = child_env()
    if gpu is None and any(p.gpu for p in PHASES if p.name in selected):
        gpu = gpu_available(env)
    notes: dict[str, str] = {}
    if not gpu:
        notes.update({p.name: NO_GPU for p in PHASES if p.gpu})
    for module in ("cupy", "snakemake"):
        if importlib.util.find_spec(module) is None:
            notes[f"import_{module}"] = f"not measured: {module} is not installed"
    to_run = [p for p in selected if p not in notes]
    children = list(dict.fromkeys(p.child for p in PHASES if p.name in to_run))

    samples: dict[str, list[float]] = {p: [] for p in to_run}
    walls: dict[str, list[float]] = {c: [] for c in children}
    with tempfile.TemporaryDirectory(prefix="kbfuse-startup-") as tmp:
        for index in range(repeats):
            caches = Path(tmp) / f"inductor-{index}"
            cache_env = {
                "TORCHINDUCTOR_CACHE_DIR": str(caches / "torchinductor"),
                "TRITON_CACHE_DIR": str(caches / "triton"),
            }
            for child in children:
                what = f"{child} (round {index + 1}/{repeats})"
                if child == "interpreter":
                    argv = [sys.executable, "-c", "pass"]
                    _, wall = run_child(argv, env, what, expect_result=False)
                    got = {"interpreter": wall}
                else:
                    args = {
                        "child": child,
                        "checkout": str(checkout),
                        "pin": str(Path(pin).resolve()),
                        "task": int(task),
                        "seed": int(seed),
                        "scratch": str(Path(tmp) / f"scratch-{child}-{index}"),
                    }
                    argv = [sys.executable, "-c", child_program(child, gpu), json.dumps(args)]
                    extra = cache_env if child.startswith("inductor") else None
                    got, wall = run_child(argv, child_env(extra), what)
                walls[child].append(wall)
                for name, seconds in got.items():
                    if name in samples:
                        samples[name].append(float(seconds))
                say(f"{what}: " + ", ".join(f"{k} {v:.3f} s" for k, v in got.items()))

    rows = []
    for phase in PHASES:
        if phase.name not in selected:
            continue
        row = {
            "phase": phase.name,
            "label": phase.label,
            "child": phase.child,
            "gpu": phase.gpu,
            "measured": phase.name in samples,
            "note": notes.get(phase.name),
            "repeats": len(samples.get(phase.name, [])),
        }
        if phase.name in samples:
            row.update(_summary(samples[phase.name]))
        rows.append(row)
    measured = {r["phase"]: r for r in rows if r["measured"]}
    summed = [p for p in STARTUP_PHASES if p in measured]
    report = {
        "kind": KIND,
        "schema_version": SCHEMA_VERSION,
        "task": int(task),
        "repeats": repeats,
        "gpu": gpu if gpu is None else bool(gpu),
        "python": sys.version.split()[0],
        "executable": sys.executable,
        "checkout": given,
        "pin": str(pin),
        "phases": rows,
        "children": {c: _summary(w) for c, w in walls.items()},
        "startup_sum_s": sum(measured[p]["median_s"] for p in summed),
        "startup_phases_summed": summed,
        "startup_phases_missing": [p for p in STARTUP_PHASES if p not in measured],
        "inductor_cold_over_warm": (
            measured["inductor_cold"]["median_s"] / measured["inductor_warm"]["median_s"]
            if "inductor_cold" in measured and "inductor_warm" in measured
            else None
        ),
    }
    return report


def _gpu_words(gpu: bool | None) -> str:
    return "not asked, no GPU phase selected" if gpu is None else ("yes" if gpu else "no")


def report_markdown(report: Mapping[str, Any]) -> str:
    """The phases as a Markdown table, then the per-job sum and the Inductor cache effect."""
    lines = [
        f"GPU job start-up, task {report['task']}: medians of {report['repeats']} fresh "
        f"processes per phase (Python {report['python']}, GPU: {_gpu_words(report['gpu'])})",
        "",
        "| phase | what is timed | median (s) | min (s) | max (s) | note |",
        "|:---|:---|---:|---:|---:|:---|",
    ]
    for row in report["phases"]:
        if row["measured"]:
            nums = f"{row['median_s']:.3f} | {row['min_s']:.3f} | {row['max_s']:.3f}"
        else:
            nums = "— | — | —"
        lines.append(f"| {row['phase']} | {row['label']} | {nums} | {row['note'] or ''} |")
    lines += [
        "",
        f"Sum of the start-up medians ({', '.join(report['startup_phases_summed']) or 'none'}): "
        f"{report['startup_sum_s']:.2f} s per GPU job"
        + (
            "; not included (not measured or not selected): "
            + ", ".join(report["startup_phases_missing"])
            if report["startup_phases_missing"]
            else ""
        )
        + ".",
    ]
    ratio = report["inductor_cold_over_warm"]
    if ratio is not None:
        cold, warm = (
            next(r for r in report["phases"] if r["phase"] == name)["median_s"]
            for name in ("inductor_cold", "inductor_warm")
        )
        lines.append(
            f"Inductor tail compile: cold cache {cold:.2f} s, warm cache {warm:.2f} s "
            f"({ratio:.1f}x)."
        )
    return "\n".join(lines) + "\n"
