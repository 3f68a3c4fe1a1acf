"""Effective flush-to-zero of a candidate's build flags, measured on the device.

The study's witness (kbfuse.checks.verify): multiply 1e-10f by 1e-30f, both passed at run time so
nothing folds at compile time. The exact product is subnormal; an output of zero means the
code flushes subnormals, the float32 product computed on the host means it keeps them.

For every distinct set of device flags a candidate built with, a witness is built by the same
route with the same flags, in this process (the `witness` role: never the candidate's):
`torch.utils.cpp_extension.load_inline` with the candidate's `extra_cuda_cflags` (torch adds
its own flags exactly as it did for the candidate), or `cupy.RawKernel` with its `options`
(CuPy appends its `-ftz=true` as it did for the candidate).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np

from kbfuse.candidates.childio import write_json

X, S = 1e-10, 1e-30

KERNEL = r"""
extern "C" __global__ void kbfuse_witness_mul(const float* x, float* out, float s) {
    out[0] = x[0] * s;
}
"""

TORCH_SOURCE = (
    "#include <torch/extension.h>\n#include <ATen/cuda/CUDAContext.h>\n"
    + KERNEL
    + r"""
torch::Tensor witness(torch::Tensor x, double s) {
    auto out = torch::full_like(x, NAN);
    kbfuse_witness_mul<<<1, 1, 0, at::cuda::getCurrentCUDAStream()>>>(
        x.data_ptr<float>(), out.data_ptr<float>(), (float)s);
    return out;
}
"""
)


def kept_value() -> float:
    """The float32 product with subnormals kept (numpy on the host)."""
    return float(np.float32(X) * np.float32(S))


def classify(output: float) -> bool | None:
    """True: flushed; False: kept; None: neither (the witness itself went wrong)."""
    if output == 0.0:
        return True
    if output == kept_value():
        return False
    return None


def extension_name(flags: list[str]) -> str:
    """The witness extension of one flag set (its build folder's name in the extensions
    folder: the parent binds just these folders of a shared cache into the sandbox)."""
    return "kbfuse_witness_" + hashlib.sha256(json.dumps(flags).encode()).hexdigest()[:12]


def _torch_module(flags: list[str]):
    """The witness extension of these flags, built unless its extensions folder has it."""
    from torch.utils.cpp_extension import load_inline

    return load_inline(
        name=extension_name(flags),
        cpp_sources="torch::Tensor witness(torch::Tensor x, double s);",
        cuda_sources=TORCH_SOURCE,
        functions=["witness"],
        extra_cuda_cflags=flags,
        verbose=False,
    )


def _torch_witness(flags: list[str]) -> float:
    import torch

    module = _torch_module(flags)
    x = torch.full((1,), X, dtype=torch.float32, device="cuda")
    return float(module.witness(x, S).item())


def _cupy_witness(options: list[str]) -> float:
    import cupy

    kernel = cupy.RawKernel(KERNEL, "kbfuse_witness_mul", options=tuple(options))
    x = cupy.full((1,), X, dtype=cupy.float32)
    out = cupy.full((1,), np.nan, dtype=cupy.float32)
    kernel((1,), (1,), (x, out, np.float32(S)))
    return float(out.get()[0])


def run_witness(request: dict, out: Path) -> None:
    """Measure every build of the request; with `build_only`, only build the load_inline
    extensions (the parent runs that outside the GPU lock: it launches nothing)."""
    if request.get("build_only"):
        for build in request["builds"]:
            if not build["route"].startswith("cupy"):
                _torch_module(build["flags"])
        return
    results = []
    for build in request["builds"]:
        if build["route"].startswith("cupy"):
            value = _cupy_witness(build["options"])
        else:
            value = _torch_witness(build["flags"])
        results.append({**build, "output": value, "effective_ftz": classify(value)})
    write_json(out / "witness.json", results)
