"""Survey records built by hand, per the `survey_task` contract (docs/contracts.md, "Survey").

`record(task, ...)` gives a valid record with every required field; the keyword arguments set
what a test varies (times, kernels, failures, flags). Times are given as medians in ms; the
samples are the median +- a fixed spread so that q1 <= median <= q3 holds.
"""

from __future__ import annotations

import copy
from typing import Any

from kbfuse.io import write_json

FILES = {
    1: "1_Conv2D_ReLU_BiasAdd.py",
    12: "12_Gemm_Multiply_LeakyReLU.py",
    53: "53_Gemm_Scaling_Hardtanh_GELU.py",
    66: "66_Matmul_Dropout_Softmax.py",
    81: "81_Gemm_Swish_Divide_Clamp_Tanh_Clamp.py",
}
GEMM = "sm90_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize128x128x8_execute_kernel__5x_cublas"
CONV = "sm90_xmma_fprop_implicit_gemm_f32f32_f32f32_f32_nhwckrsc_nhwc_tilesize64x64x8_cudnn"
GELU = (
    "void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl("
    "at::TensorIteratorBase&, at::native::GeluType)::{lambda()#2}::operator()() const::"
    "{lambda(float)#1}, std::array<char*, 2ul> >(int, at::native::GeluCUDAKernelImpl, "
    "std::array<char*, 2ul>)"
)
TRITON = "triton_poi_fused_gelu_hardtanh_mul_0"


def stats(median: float, spread: float = 0.01) -> dict:
    """A measure.stats dict around `median` (5 samples, quartiles median -+ spread)."""
    samples = [median - 2 * spread, median - spread, median, median + spread, median + 2 * spread]
    return {
        "median_ms": median,
        "q1_ms": median - spread,
        "q3_ms": median + spread,
        "samples_ms": samples,
        "positions": [0, 1, 2, 0, 1],
    }


def kernel(name: str, us: float, calls: int = 1) -> dict:
    return {"name": name, "device_us": us, "calls": calls}


TRIAL_SEEDS = [1, 2, 3, 4, 5]


def timeline(idle_us: float, busy_us: float = 100.0) -> dict:
    """A baseline's `timeline` (kbfuse.survey.profile.forward_gaps) with this idle time."""
    return {
        "forwards": 3,
        "span_us": busy_us + idle_us,
        "busy_us": busy_us,
        "idle_us": idle_us,
        "unassigned": 0,
    }


def ok(
    ms: float,
    kernels: list | None,
    graph: bool = True,
    cold: float | None = None,
    spread=0.01,
    official: bool = True,
    idle_us: float | None = 10.0,
):
    """A baseline that built, passed (or not: `official`), was timed and profiled; `idle_us`
    None leaves out its timeline, as records made before the timeline existed do."""
    timing = {
        "events": stats(ms * 1.05, spread),
        "graph": stats(ms, spread) if graph else None,
        "graph_missing": None if graph else "forward copies host data",
        "cold_l2": stats(cold, spread) if cold else None,
    }
    return {
        "status": "ok",
        "failure": None,
        "built_in": "strict",
        "build_s": 0.5,
        "correctness": {
            "official_pass": official,
            "atol": 1e-4,
            "rtol": 1e-4,
            "source": "src/kernelbench/eval.py:95 get_tolerance_for_precision, torch.float32",
            "compared": "eager on KernelBench's 5 official trials",
            "trials": 5,
            "failed_trials": [] if official else [0, 1, 2, 3, 4],
            "numel": 1024,
            "not_bit_equal": 3,
            "max_abs": 1e-6,
            "max_rel": 1e-5,
            "direction": {"reference_scaled_pass": True, "candidate_scaled_pass": True},
        },
        "timing": timing,
        "kernels": kernels,
        **({"timeline": timeline(idle_us)} if idle_us is not None and kernels else {}),
    }


def failed(stage: str, error: str, message: str) -> dict:
    return {
        "status": "failed",
        "failure": {"stage": stage, "error": error, "message": message},
        "built_in": None,
        "build_s": None,
        "correctness": None,
        "timing": None,
        "kernels": None,
    }


def record(
    task: int = 53,
    mode: str = "strict",
    baselines: dict[str, dict] | None = None,
    flops: dict[str, int] | None = None,
    device: str = "NVIDIA H200",
    blind_spot: bool = False,
    verdict: str = "deterministic",
) -> dict[str, Any]:
    """A valid survey_task record; by default a GEMM tail where Inductor beats eager."""
    if baselines is None:
        baselines = {
            "eager": ok(0.30, [kernel(GEMM, 200.0), kernel(GELU, 60.0)]),
            "torchscript": ok(0.28, [kernel(GEMM, 200.0), kernel(GELU, 50.0)]),
            "inductor": ok(0.25, [kernel(GEMM, 200.0), kernel(TRITON, 30.0)]),
        }
    flops = flops if flops is not None else {"aten.addmm": 2 * 128 * 4096 * 4096}
    tf32 = mode == "kernelbench-defaults"
    return copy.deepcopy(
        {
            "kind": "survey_task",
            "schema_version": 1,
            "task": task,
            "level": 2,
            "file": FILES.get(task, f"{task}_Task.py"),
            "sha256": "0" * 64,
            "commit": "423217d9fda91e0c2d67e4a43bf62f96f6d104f1",
            "semantics": "kernelbench",
            "numerics": {"mode": mode, "matmul_tf32": False, "cudnn_tf32": tf32},
            "device": "cpu" if device == "cpu" else "cuda",
            "environment": {
                "device": "cpu" if device == "cpu" else "cuda",
                "device_name": device,
                "torch": "2.13.0",
                "cuda": None if device == "cpu" else "13.0",
            },
            "seed": 42,
            "official": {
                "atol": 1e-4,
                "rtol": 1e-4,
                "source": "src/kernelbench/eval.py:95 get_tolerance_for_precision, torch.float32",
                "argument_order": ["reference", "candidate"],
                "trials": 5,
                "trial_seeds": TRIAL_SEEDS,
                "contract_commit": "423217d9fda91e0c2d67e4a43bf62f96f6d104f1",
            },
            "inputs": [{"shape": [128, 4096], "dtype": "float32"}],
            "output": {
                "shape": [128, 4096],
                "dtype": "float32",
                "mean": 0.1,
                "std": 0.5,
                "abs_mean": 0.3,
                "abs_max": 2.0,
            },
            "determinism": {
                "same_seed_equal": verdict == "deterministic",
                "different_seed_equal": False,
                "verdict": verdict,
            },
            "flops": {
                "total": sum(flops.values()),
                "by_op": flops,
                "main_op": max(flops, key=flops.get) if flops else None,
            },
            "bytes": {"inputs": 2097152, "output": 2097152, "parameters": 67125248},
            "timing_protocol": {
                "warmup": 3,
                "rounds": 5,
                "invocations_per_pair": 10,
                "order_seed": 913,
                "methods": ["events", "graph", "cold_l2"],
                "max_invocations_per_pair": 10,
                "min_sample_ms": 1.0,
                "fastest_call_ms": 0.25,
            },
            "baselines": baselines,
            "ratios": {},
            "blind_spots": {
                "compared": "eager output on KernelBench's 5 official trials",
                "trials": 5,
                "zeros": {"applicable": True, "passes": blind_spot},
                "mean_constant": {"applicable": True, "passes": False, "value": 0.1},
                "input_identity": {"applicable": False, "passes": None},
            },
            "blind_spot": blind_spot,
            "job": {
                "modes": ["strict", "kernelbench-defaults"],
                "built_in": "strict",
                "rerun_alone": False,
            },
        }
    )


def write_records(root, recs: list[dict]) -> dict[str, list[str]]:
    """Write records where the survey rules put them (root/survey/{mode}/tasks/{task}.json);
    mode -> paths."""
    paths: dict[str, list[str]] = {}
    for rec in recs:
        mode = rec["numerics"]["mode"]
        path = root / "survey" / mode / "tasks" / f"{rec['task']}.json"
        write_json(path, rec)
        paths.setdefault(mode, []).append(str(path))
    return paths
