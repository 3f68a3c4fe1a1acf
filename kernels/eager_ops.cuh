// The eager ops the fused tails are made of, one helper per PyTorch op.
//
// Each helper replays what PyTorch eager runs on CUDA for that op: eager launches one kernel
// per op, so every intermediate is rounded to float before the next op, and each helper is the
// same float expression, in the same order, as the PyTorch kernel named in its comment
// (aten/src/ATen/native/cuda/...; opmath_t is float for float32). Only IEEE operations and the
// CUDA math library (expf, erff, tanhf, correctly rounded '/') are used, no fast-math
// intrinsics, so with --ftz=false and --fmad=false a kernel built from these helpers is
// bit-identical to eager whatever its memory access pattern. Options such as --ftz=true change
// the bits; the study measures exactly that.
//
// Included by kernels/*.cu with #include "eager_ops.cuh"; kbfuse inlines it before compiling
// (kbfuse.kernelsrc), so every compile route sees one translation unit.

#pragma once

// nn.Hardtanh / F.hardtanh / torch.clamp(x, lo, hi) with scalar bounds:
// hardtanh_out -> clamp_out -> launch_clamp_scalar (TensorCompare.cu, MinMax).
// NaN input is returned unchanged; bounds are compared with '<' in this order.
__device__ __forceinline__ float clamp_scalar(float v, float lo, float hi) {
    if (isnan(v)) {
        return v;
    }
    float result = (v < lo) ? lo : v;
    return (hi < result) ? hi : result;
}

// torch.sigmoid: sigmoid_kernel_cuda (UnarySpecialOpsKernel.cu): 1 / (1 + exp(-a)).
__device__ __forceinline__ float sigmoid_eager(float a) {
    return 1.0f / (1.0f + expf(-a));
}

// nn.GELU() / F.gelu(approximate='none'): GeluCUDAKernelImpl (ActivationGeluKernel.cu):
// x * 0.5 * (1 + erf(x * kAlpha)), kAlpha = M_SQRT1_2 converted to float,
// evaluated left to right: (x * 0.5f) * (1.0f + erff(x * kAlpha)).
__device__ __forceinline__ float gelu_erf_eager(float x) {
    const float kAlpha = static_cast<float>(0.707106781186547524401);  // M_SQRT1_2
    return x * 0.5f * (1.0f + erff(x * kAlpha));
}

// torch.tanh: tanh_kernel_cuda (UnaryGeometricTanhKernel.cu): ::tanh(a) on float.
__device__ __forceinline__ float tanh_eager(float a) {
    return tanhf(a);
}

// One element of each task's tail, op by op as the pinned KernelBench forward runs it.

// Task 53: gemm -> x * scaling_factor -> hardtanh(lo, hi) -> GELU.
// `x * python_float`: mul_kernel_cuda with a CPU scalar, MulFunctor<float>, the
// scalar converted to float on the host (the caller passes float(scale)).
__device__ __forceinline__ float tail53_element(float x, float scale, float lo, float hi) {
    float v = x * scale;
    v = clamp_scalar(v, lo, hi);
    return gelu_erf_eager(v);
}

// Task 81: gemm -> x * sigmoid(x) -> x / 2.0 -> clamp(-1, 1) -> tanh -> clamp(-1, 1).
// `x / 2.0`: div_true_kernel_cuda with a CPU scalar divisor computes
// x * (1.0f / 2.0f) (BinaryDivTrueKernel.cu), not a division.
__device__ __forceinline__ float tail81_element(float x) {
    const float inv_divisor = 1.0f / 2.0f;
    float s = sigmoid_eager(x);
    float v = x * s;  // mul_kernel_cuda, MulFunctor<float>: a * b
    v = v * inv_divisor;
    v = clamp_scalar(v, -1.0f, 1.0f);
    v = tanh_eager(v);
    return clamp_scalar(v, -1.0f, 1.0f);
}

// Task 95: matmul -> x + add_value (broadcast over rows) -> sigmoid(x) * x -> tanh
// -> GELU -> hardtanh(-1, 1).
// `x + add_value`: add_kernel (ufunc add) a + alpha * b with alpha = 1, which is
// exactly a + b in float.
__device__ __forceinline__ float tail95_element(float x, float add) {
    float v = x + add;
    float s = sigmoid_eager(v);
    v = s * v;  // mul_kernel_cuda, MulFunctor<float>: a * b with a = sigmoid(x)
    v = tanh_eager(v);
    v = gelu_erf_eager(v);
    return clamp_scalar(v, -1.0f, 1.0f);
}
