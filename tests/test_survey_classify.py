"""The kernel-name classifier: real kernel names of eager and Inductor on the H200, each in
the category its library or framework says, and unknown names left unclassified."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from kbfuse.survey import classify as c

# (name as torch.profiler reports it, category)
NAMES = [
    (
        "sm90_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize128x128x8_execute_kernel__5x_cublas",
        c.LIBRARY,
    ),
    ("nvjet_tst_128x64_64x8_2x1_v_bz_TNT", c.LIBRARY),
    ("ampere_sgemm_128x64_tn", c.LIBRARY),
    ("cutlass_80_simt_sgemm_128x64_8x5_tn_align1", c.LIBRARY),
    (
        "void cutlass::Kernel2<cutlass_80_tensorop_s1688gemm_64x64_16x6_tn_align4>(cutlass_80_"
        "tensorop_s1688gemm_64x64_16x6_tn_align4::Params)",
        c.LIBRARY,
    ),
    (
        "void gemv2T_kernel_val<int, int, float, float, float, float, 128, 16, 4, 4, false, false, "
        "cublasGemvParamsEx<int, cublasGemvTensorStridedBatched<float const>, "
        "cublasGemvTensorStridedBatched<float const>, cublasGemvTensorStridedBatched<float>, "
        "float> >(cublasGemvParamsEx<int, cublasGemvTensorStridedBatched<float const>, "
        "cublasGemvTensorStridedBatched<float const>, cublasGemvTensorStridedBatched<float>, "
        "float>, float, float)",
        c.LIBRARY,
    ),
    (
        "void splitKreduce_kernel<32, 16, int, float, float, float, float, true, false, false>"
        "(cublasSplitKParams<float>, float const*, float const*, float*, float const*, "
        "float const*, float const*, float const*, float*, void*, long, float*, int*)",
        c.LIBRARY,
    ),
    (
        "sm90_xmma_fprop_implicit_gemm_f32f32_tf32f32_f32_nhwckrsc_nhwc_tilesize128x128x32_"
        "warpgroupsize1x1x1_g1_execute_segment_k_off_kernel__5x_cudnn",
        c.LIBRARY,
    ),
    (
        "void implicit_convolve_sgemm<float, float, 1024, 5, 5, 3, 3, 3, 1, false, false, true>"
        "(int, int, int, float const*, int, float*, float const*, kernel_conv_params, unsigned "
        "long long, int, float, float, int, float const*, float const*, bool, int, int)",
        c.LIBRARY,
    ),
    (
        "void cudnn::engines_precompiled::nchwToNhwcKernel<float, float, float, false, true, "
        "(cudnnKernelDataType_t)2>(cudnn::engines_precompiled::nchw2nhwc_params_t<float>, "
        "float const*, float*)",
        c.LIBRARY,
    ),
    (
        "void fft2d_r2c_32x32<float, false, 1u, false>(float2*, float const*, int, int, int, int, "
        "int, int, int, int, int, cudnn::reduced_divisor, bool, int2, int, int)",
        c.LIBRARY,
    ),
    (
        "void at::native::vol2col_kernel<float>(long, float const*, int, int, int, int, int, int, "
        "int, int, int, int, int, int, int, int, int, int, int, float*)",
        c.LIBRARY,
    ),
    ("triton_tem_fused_addmm_0", c.LIBRARY),
    ("triton_poi_fused_gelu_hardtanh_mul_0", c.GENERATED),
    ("triton_red_fused__softmax_mean_1", c.GENERATED),
    ("triton_per_fused_native_group_norm_2", c.GENERATED),
    (
        "void cudnn::bn_fw_tr_1C11_kernel_NCHW<float, float, int, 512, true, 1, true>"
        "(cudnnTensorStruct, float const*, cudnnTensorStruct, float*, float const*, float const*, "
        "float, float, float*, float*, float*, float*, float, float)",
        c.REDUCTION,
    ),
    (
        "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, "
        "at::native::MeanOps<float, float, float, float>, unsigned int, float, 4, 4> >"
        "(at::native::ReduceOp<float, at::native::MeanOps<float, float, float, float>, "
        "unsigned int, float, 4, 4>)",
        c.REDUCTION,
    ),
    (
        "void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, float, float, "
        "at::native::(anonymous namespace)::SoftMaxForwardEpilogue>(float*, float const*, int)",
        c.REDUCTION,
    ),
    (
        "void at::native::batch_norm_collect_statistics_kernel<at::native::Var, float, float, "
        "int, 2>(...)",
        c.REDUCTION,
    ),
    (
        "void at::native::(anonymous namespace)::RowwiseMomentsCUDAKernel<float>(long, float, "
        "float const*, float*, float*)",
        c.REDUCTION,
    ),
    (
        "void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<float, float>(int, "
        "float, float const*, float const*, float const*, float*, float*, float*)",
        c.REDUCTION,
    ),
    (
        "void at::native::(anonymous namespace)::max_pool_forward_nchw<float, float>(int, "
        "float const*, long, long, long, int, int, int, int, int, int, int, int, int, int, "
        "float*, long*)",
        c.REDUCTION,
    ),
    ("Memcpy HtoD (Pageable -> Device)", c.COPY),
    ("Memset (Device)", c.COPY),
    (
        "void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda("
        "at::TensorIteratorBase&)::{lambda()#3}::operator()() const::{lambda()#7}::operator()() "
        "const::{lambda(float)#1}, std::array<char*, 2ul>, 4, TrivialOffsetCalculator<1, "
        "unsigned int>, TrivialOffsetCalculator<1, unsigned int>, "
        "at::native::memory::LoadWithCast<1>, at::native::memory::StoreWithCast<1> >(int, "
        "...)",
        c.COPY,
    ),
    (
        "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, "
        "std::array<char*, 1ul> >(int, at::native::FillFunctor<float>, std::array<char*, 1ul>)",
        c.COPY,
    ),
    (
        "void at::native::(anonymous namespace)::CatArrayBatchedCopy<float, unsigned int, 4, 64, "
        "64>(...)",
        c.COPY,
    ),
    (
        "void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl("
        "at::TensorIteratorBase&, at::native::GeluType)::{lambda()#2}::operator()() const::"
        "{lambda(float)#1}, std::array<char*, 2ul> >(int, ...)",
        c.POINTWISE,
    ),
    (
        "void at::native::elementwise_kernel<128, 2, at::native::gpu_kernel_impl_nocast<"
        "at::native::BinaryFunctor<float, float, float, at::native::binary_internal::MulFunctor"
        "<float> > >(at::TensorIteratorBase&, ...)",
        c.POINTWISE,
    ),
    (
        "void at::native::vectorized_elementwise_kernel<4, at::native::copysign_kernel_cuda("
        "at::TensorIteratorBase&)::{lambda()#1}, std::array<char*, 3ul> >(int, ...)",
        c.POINTWISE,
    ),
    (
        "void at::native::(anonymous namespace)::fused_dropout_kernel_vec<float, float, unsigned "
        "int, 1, 4, bool>(...)",
        c.POINTWISE,
    ),
    # TorchScript's TensorExpr fuser (NNC): "fused" and the traced ops' names (the H200 survey)
    ("fused_mish_mish", c.GENERATED),
    ("fused_relu_leaky_relu_gelu_sigmoid_add", c.GENERATED),
    ("aten::addmm", c.LIBRARY),
    ("aten::mkldnn_convolution", c.LIBRARY),
    ("aten::native_batch_norm", c.REDUCTION),
    ("aten::_softmax", c.REDUCTION),
    ("aten::copy_", c.COPY),
]


@pytest.mark.parametrize(("name", "category"), NAMES, ids=[n[:40] for n, _ in NAMES])
def test_real_names_are_classified(name, category):
    assert c.classify(name) == category


@pytest.mark.parametrize("name", ["my_custom_kernel", "aten::frobnicate", "tail53_fused", ""])
def test_unknown_names_are_unclassified_not_guessed(name):
    assert c.classify(name) == c.UNCLASSIFIED
    assert c.unclassified([{"name": name, "device_us": 1.0}]) == [{"name": name, "device_us": 1.0}]


def test_time_by_category_sums_per_category_and_lists_every_category():
    kernels = [
        {"name": "ampere_sgemm_128x64_tn", "device_us": 100.0, "calls": 1},
        {"name": "triton_poi_fused_add_0", "device_us": 20.0, "calls": 2},
        {"name": "triton_red_fused_sum_1", "device_us": 5.5, "calls": 1},
        {"name": "mystery", "device_us": 1.25, "calls": 1},
    ]
    assert c.time_by_category(kernels) == {
        c.LIBRARY: 100.0,
        c.GENERATED: 25.5,
        c.POINTWISE: 0.0,
        c.REDUCTION: 0.0,
        c.COPY: 0.0,
        c.UNCLASSIFIED: 1.25,
    }


def test_every_pattern_compiles_and_names_a_category_and_a_reason():
    for category, pattern, why in c.PATTERNS:
        assert category in c.CATEGORIES
        assert re.compile(pattern) and why


# ---------------------------------------------------------------- real H200 profiles

DATA = Path(__file__).parent / "data"
# Every kernel name torch.profiler saw on an H200 (torch 2.11 + CUDA 13.0, TF32 off, training
# mode) for eager and Inductor (default mode) on level-2 tasks 1, 3, 11, 17, 18, 23, 28, 33,
# 42, 53, 66, 72, 100; kernel_profile_h200.json holds them per task with device us per forward.
H200_NAMES = [n for n in (DATA / "kernel_names_h200.txt").read_text().splitlines() if n]
# Decisions the table makes on those names, and why
DECIDED = {
    # cuDNN's own layout transforms and tensor fills belong to its convolution call
    "cudnn::engines_precompiled::nchwToNhwcKernel": c.LIBRARY,
    "cudnn::engines_precompiled::nhwcToNchwKernel": c.LIBRARY,
    "cudnn::engines_precompiled::setTensor5d_kernel": c.LIBRARY,
    # cuDNN's FFT convolution: the transforms and the complex GEMM between them
    "void fft2d_r2c_32x32": c.LIBRARY,
    "void fft2d_c2r_32x32": c.LIBRARY,
    "sm80_xmma_gemm_cf32cf32": c.LIBRARY,
    # ConvTranspose3d runs as cuDNN's data-gradient convolution
    "void convolveNd_dgrad_float_engine": c.LIBRARY,
    # masked_fill is a select per element, not a fill of memory
    "masked_fill_kernel": c.POINTWISE,
    # batch norm's statistics and its elementwise pieces are the normalisation
    "batch_norm_calc_invstd": c.REDUCTION,
    "batch_norm_update_stats_and_invert": c.REDUCTION,
    "GroupNormKernelImplInternal": c.REDUCTION,
    # random numbers for dropout masks are generated elementwise
    "random_from_to_kernel": c.POINTWISE,
    # Inductor's fusions named after the convolution are its own Triton kernels
    "triton_poi_fused_convolution_0": c.GENERATED,
}


def test_every_h200_kernel_name_is_classified():
    assert len(H200_NAMES) == 94
    assert [n for n in H200_NAMES if c.classify(n) == c.UNCLASSIFIED] == []


@pytest.mark.parametrize(("fragment", "category"), DECIDED.items())
def test_decided_names_of_the_h200_list(fragment, category):
    names = [n for n in H200_NAMES if fragment in n]
    assert names, fragment
    assert {c.classify(n) for n in names} == {category}


def shares(task: str, baseline: str) -> dict[str, float]:
    profile = json.loads((DATA / "kernel_profile_h200.json").read_text())[task][baseline]
    kernels = [{"name": n, "device_us": us, "calls": calls} for n, us, calls in profile]
    by_category = c.time_by_category(kernels)
    total = sum(by_category.values())
    return {k: round(100 * v / total) for k, v in by_category.items() if v}


def test_where_the_time_goes_on_the_h200():
    # task 23 (Conv3d, GroupNorm, mean): Inductor leaves 30 % outside cuDNN
    assert shares("23", "inductor") == {c.LIBRARY: 70, c.GENERATED: 30}
    # task 72 (ConvTranspose3d, BatchNorm, two AvgPools): eager spends 43 % in reductions
    assert shares("72", "eager")[c.REDUCTION] == 43
    assert shares("72", "inductor") == {c.LIBRARY: 87, c.GENERATED: 13}
    # task 18 (Matmul and a chain of reductions to one column): all but nothing in cuBLAS
    assert shares("18", "inductor")[c.LIBRARY] == 100


# Every row torch.profiler's CPU list gave for eager, TorchScript and Inductor on the survey's
# CPU fixture (a convolution, conv + GroupNorm, dropout + softmax, a GEMM tail).
CPU_ROWS = {
    c.LIBRARY: "aten::_convolution aten::addmm aten::conv2d aten::conv3d aten::convolution "
    "aten::linear aten::mkldnn_convolution",
    c.REDUCTION: "aten::_softmax aten::group_norm aten::mean aten::native_group_norm "
    "aten::softmax aten::sum",
    c.POINTWISE: "aten::add aten::bernoulli_ aten::clamp_min aten::div_ aten::dropout aten::mul "
    "aten::randint aten::random_ aten::relu aten::tanh",
    c.COPY: "aten::_to_copy aten::as_strided aten::as_strided_ aten::copy_ aten::empty "
    "aten::empty_like aten::empty_strided aten::expand aten::fill_ aten::resize_ "
    "aten::resolve_conj aten::t aten::to aten::transpose forward",
}
CPU_WRAPPERS = {
    "## Call CompiledFxGraph fj6w4qttydwgkcfomlbukdiza74hqidd4rachgyarqlyovtx2bhw ##": c.GENERATED,
    "AOTDispatcher Runtime Wrapper Prologue": c.COPY,
    "Pregraph bytecode": c.COPY,
    "Torch-Compiled Region: 0/0": c.COPY,
    "TorchDynamo Cache Lookup": c.COPY,
}


@pytest.mark.parametrize(
    ("name", "category"),
    [(n, cat) for cat, names in CPU_ROWS.items() for n in names.split()]
    + list(CPU_WRAPPERS.items()),
)
def test_cpu_profiler_rows_are_classified(name, category):
    assert c.classify(name) == category
