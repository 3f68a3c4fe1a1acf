"""Kernel names -> where the time goes: a small table of name patterns, first match wins.

The survey asks how much of a task's time is spent outside the library kernels that do its
main op (GEMM, convolution, FFT), since that is the only time a custom kernel can still win.
Each profiled kernel name (as torch.profiler reports it: demangled, with template arguments)
is put in one category:

- `library`: cuBLAS / cuBLASLt / cuDNN / CUTLASS / cuFFT kernels and the pieces of a library
  call: split-K reduction, cuDNN's layout transforms and tensor fills (`nchwToNhwcKernel`,
  `setTensor5d_kernel`: only a different convolution removes them), cuDNN's FFT convolution
  (`fft2d_*` and the complex `cf32` GEMM between them), ATen's im2col lowering and depthwise
  convolutions; plus Inductor's Triton *templates* (`triton_tem_`), which max-autotune emits in
  place of a library GEMM or convolution;
- `generated`: every other Triton kernel Inductor writes (`triton_poi_`, `triton_red_`,
  `triton_per_`), and the kernels TorchScript's TensorExpr fuser (NNC) writes for a traced
  graph's pointwise ops (`fused_mish_mish`: "fused" and the ops' names, torch's
  `SubgraphUtils::generateNameForGraph`);
- `framework_reduction`: ATen (and cuDNN) reductions and normalisations: reduce_kernel,
  softmax, batch/layer/group norm (with their elementwise pieces, e.g. batch_norm_calc_invstd),
  pooling, scans;
- `copy_other`: memcpy, memset, copies, concatenation, fills;
- `framework_pointwise`: ATen's elementwise kernels (elementwise_kernel,
  vectorized_elementwise_kernel, unrolled_elementwise_kernel: masked_fill too, a select per
  element), dropout and its random numbers;
- on the CPU (tests, CI), the profiler's CPU rows: `aten::` operators (GEMM/convolution,
  reductions, elementwise, copies and views), Inductor's compiled graph (`## Call
  CompiledFxGraph`, generated) and the wrappers of torch.compile and TorchScript (other).

Order matters: a cuDNN batch norm is a normalisation, not a library GEMM, and an ATen copy runs
inside `unrolled_elementwise_kernel`, so those rows come first. A name that matches no row is
`unclassified`: it is listed in the survey's unclassified table, never guessed.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

LIBRARY = "library"
GENERATED = "generated"
POINTWISE = "framework_pointwise"
REDUCTION = "framework_reduction"
COPY = "copy_other"
UNCLASSIFIED = "unclassified"
CATEGORIES = (LIBRARY, GENERATED, POINTWISE, REDUCTION, COPY)

# (category, pattern, why): searched in order, case-sensitive unless the pattern says (?i).
PATTERNS: tuple[tuple[str, str, str], ...] = (
    (LIBRARY, r"^triton_tem_", "Inductor's Triton template for a GEMM/convolution"),
    (GENERATED, r"^triton_", "Inductor's generated Triton kernels"),
    (
        GENERATED,
        r"^fused_",
        "TorchScript's TensorExpr fuser (NNC): its kernels are named fused_<ops>",
    ),
    (REDUCTION, r"cudnn::bn_|\bbn_fw_|\bbn_bw_", "cuDNN's batch norm is a normalisation"),
    (
        LIBRARY,
        r"(?i)gemm|gemv|cublas|cutlass|xmma|nvjet|cudnn|convolve|winograd|fft",
        "cuBLAS, cuBLASLt, cuDNN, CUTLASS, cuFFT kernels by name",
    ),
    (
        LIBRARY,
        r"splitKreduce|conv_depthwise|im2col|col2im|vol2col|col2vol|flip_filter",
        "pieces of a library call, ATen's convolution lowering",
    ),
    (
        COPY,
        r"^Memcpy|^Memset|copy_kernel|direct_copy|CatArray|FillFunctor|(?<!masked_)fill_kernel"
        r"|index_select|indexSelect|scatter_gather|reflection_pad|replication_pad",
        "copies, memset, concatenation, fills",
    ),
    (
        REDUCTION,
        r"reduce_kernel|(?i:softmax)|batch_norm|layer_norm|group_norm|GroupNorm|LayerNorm"
        r"|RowwiseMoments|ComputeFusedParams|(?i:welford)|(?i:pool)|tensor_kernel_scan"
        r"|logsumexp|norm_kernel",
        "ATen reductions and normalisations, pooling, scans",
    ),
    (
        POINTWISE,
        r"at::native::.*elementwise|elementwise_kernel|dropout",
        "ATen's elementwise kernels",
    ),
    # torch.profiler's CPU operator names (the CPU stand-in of the tests)
    (
        LIBRARY,
        r"^aten::(addmm|mm|bmm|baddbmm|addmv|mv|linear|_?convolution|conv\w*|\w*_conv\w*)$",
        "CPU: ATen GEMM/convolution operators",
    ),
    (
        REDUCTION,
        r"^aten::(native_|_)?(batch|layer|group|instance)_norm\w*$"
        r"|^aten::_?(log_)?softmax$|^aten::(sum|mean|amax|amin|max|min|logsumexp|\w*pool\w*)$",
        "CPU: ATen reductions and normalisations",
    ),
    (
        COPY,
        r"^aten::(copy_|_to_copy|to|clone|contiguous|cat|fill_|zero_|empty\w*|resize_"
        r"|as_strided_?|t|transpose|permute|expand|view|_unsafe_view|reshape|squeeze|unsqueeze"
        r"|select|slice|detach|alias|resolve_conj|resolve_neg|lift_fresh)$",
        "CPU: ATen copies, allocations and views",
    ),
    (
        POINTWISE,
        r"^aten::(add|sub|mul|div|neg|abs|exp|log|sqrt|rsqrt|pow|tanh|sigmoid|relu|gelu|silu"
        r"|mish|hardtanh|hardswish|hardsigmoid|leaky_relu|elu|selu|softplus|clamp\w*|where"
        r"|minimum|maximum|sign|erf|dropout|native_dropout|bernoulli|rand\w*|random|normal"
        r"|uniform|masked_fill|lt|gt|le|ge|eq|ne)_?$",
        "CPU: ATen elementwise operators",
    ),
    (GENERATED, r"^## Call CompiledFxGraph", "CPU: the code Inductor compiled for a graph"),
    (
        COPY,
        r"^(Torch-Compiled Region|TorchDynamo Cache Lookup|AOTDispatcher|Pregraph bytecode"
        r"|forward$)",
        "CPU: torch.compile's and TorchScript's own wrappers around a forward",
    ),
)
_COMPILED = tuple((category, re.compile(pattern)) for category, pattern, _ in PATTERNS)


def classify(name: str) -> str:
    """The category of one kernel name (first matching row of PATTERNS), or 'unclassified'."""
    for category, pattern in _COMPILED:
        if pattern.search(name):
            return category
    return UNCLASSIFIED


def time_by_category(kernels: Iterable[Mapping[str, Any]]) -> dict[str, float]:
    """Device microseconds per category (every category of CATEGORIES and 'unclassified',
    zero when absent) of one forward's kernel list [{name, device_us, calls}]."""
    totals = dict.fromkeys((*CATEGORIES, UNCLASSIFIED), 0.0)
    for kernel in kernels:
        totals[classify(kernel["name"])] += float(kernel["device_us"])
    return totals


def unclassified(kernels: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The kernels of a list whose names match no pattern."""
    return [k for k in kernels if classify(k["name"]) == UNCLASSIFIED]
