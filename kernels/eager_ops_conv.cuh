// The eager ops of the second study's tails (what follows a convolution), one helper per
// PyTorch op, on top of the first study's (eager_ops.cuh: sigmoid, clamp, GELU, tanh).
//
// As there: each helper is the float expression, in the same order, of the ATen CUDA kernel
// named in its comment (aten/src/ATen/native/..., read at pytorch/pytorch commit
// 035290b77d8b; the same in the torch 2.11 the H200 reference ran), with opmath_t = float for
// float32 and only IEEE operations and the CUDA math library (expf, log1pf, tanhf, correctly
// rounded '/'), so with --ftz=false and --fmad=false every intermediate rounds where eager's
// rounds. What decides the bits: the order of the operations and their rounding, the math
// library's expf/log1pf/tanhf (the same CUDA headers serve NVRTC and the nvcc that built
// torch), and flush-to-zero, which each variant sets and verify measures.
//
// Included by kernels/fused2_*.cu with #include "eager_ops_conv.cuh"; kbfuse inlines it (and
// eager_ops.cuh) before compiling, so every route sees one translation unit.

#pragma once

#include "eager_ops.cuh"

// The convolution's bias: ATen runs cuDNN's convolution without it, then
// `output.add_(reshape_bias(input.dim(), bias))` (Convolution.cpp, ConvBackend::Cudnn):
// add_kernel, CUDAFunctor_add<float>: ufunc::add(self, other, alpha) = self + alpha * other
// with alpha = 1, which is exactly self + other in float (one rounding, contracted or not).
__device__ __forceinline__ float conv_bias_add(float v, float bias) {
    return v + bias;
}

// torch.nn.functional.mish: mish_kernel (ActivationMishKernel.cu):
// x * c10::cuda::compat::tanh(c10::cuda::compat::log1p(c10::cuda::compat::exp(x))), whose
// float overloads are ::tanhf, ::log1pf, ::expf (c10/cuda/CUDAMathCompat.h).
__device__ __forceinline__ float mish_eager(float x) {
    return x * tanhf(log1pf(expf(x)));
}

// Task 4: conv (no bias) -> + bias -> mish -> mish.
__device__ __forceinline__ float tail4_element(float y, float bias) {
    float v = conv_bias_add(y, bias);
    v = mish_eager(v);
    return mish_eager(v);
}

// nn.AvgPool2d(k) (stride k, no padding, floor mode, count_include_pad, no divisor override)
// on a contiguous NCHW tensor: avg_pool2d_out_cuda_frame (AveragePool2d.cu). The window is
// summed in accscalar_t (float for float), starting from 0, row by row and left to right
// within a row, then divided by the int divide_factor (the window's size, k * k here):
// `aveval / divide_factor` is a float division by that int converted to float. Task 65 pools
// the bias-added values, each rounded to float first as eager's separate add rounds them.
// A kernel that loads the window another way (kernels/fused2_fast.cu) adds the same values in
// the same order with `pool_accumulate`, from 0.0f, and ends with `pool_average`.
__device__ __forceinline__ float pool_accumulate(float aveval, float y, float bias) {
    return aveval + conv_bias_add(y, bias);
}

__device__ __forceinline__ float pool_average(float aveval, int divide_factor) {
    return aveval / divide_factor;
}

// `row` points at the window's first element; `width` is the row pitch in elements.
__device__ __forceinline__ float avg_pool_of_biased(const float* row, long long width, int k,
                                                    float bias) {
    float aveval = 0.0f;
    for (int h = 0; h < k; ++h) {
        for (int w = 0; w < k; ++w) {
            aveval = pool_accumulate(aveval, row[h * width + w], bias);
        }
    }
    return pool_average(aveval, k * k);
}

// Task 65's element-wise stage, one pooled value: sigmoid(avg_pool2d(y + bias)), the tensor
// the pinned forward hands torch.sum.
__device__ __forceinline__ float tail65_stage_element(const float* row, long long width, int k,
                                                      float bias) {
    return sigmoid_eager(avg_pool_of_biased(row, width, k, bias));
}
