// Study-faithful fused tails: one element per thread, float32 throughout.
//
// Each tail replays, op by op, what PyTorch eager runs on CUDA for the pinned
// KernelBench module: eager launches one kernel per op, so every intermediate
// is rounded to float before the next op, and each step below is written as
// the same float expression in the same order as the PyTorch kernel named in
// its comment (aten/src/ATen/native/cuda/...; opmath_t is float for float32).
// Only IEEE operations and the CUDA math library (expf, erff, tanhf, correctly
// rounded '/') are used, no fast-math intrinsics, so with --ftz=false and
// --fmad=false the results are bit-identical to eager. Options such as
// --ftz=true change the bits; the study measures exactly that.

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

__device__ __forceinline__ long long global_index() {
    return static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
}

// Task 53: gemm -> x * scaling_factor -> hardtanh(lo, hi) -> GELU.
// `x * python_float`: mul_kernel_cuda with a CPU scalar, MulFunctor<float>, the
// scalar converted to float on the host (the caller passes float(scale)).
extern "C" __global__ void tail53(const float* x, float* out, long long n, float scale,
                                  float lo, float hi) {
    long long i = global_index();
    if (i >= n) {
        return;
    }
    float v = x[i] * scale;
    v = clamp_scalar(v, lo, hi);
    out[i] = gelu_erf_eager(v);
}

// Task 81: gemm -> x * sigmoid(x) -> x / 2.0 -> clamp(-1, 1) -> tanh -> clamp(-1, 1).
// `x / 2.0`: div_true_kernel_cuda with a CPU scalar divisor computes
// x * (1.0f / 2.0f) (BinaryDivTrueKernel.cu), not a division.
extern "C" __global__ void tail81(const float* x, float* out, long long n) {
    long long i = global_index();
    if (i >= n) {
        return;
    }
    const float inv_divisor = 1.0f / 2.0f;
    float v = x[i];
    float s = sigmoid_eager(v);
    v = v * s;  // mul_kernel_cuda, MulFunctor<float>: a * b
    v = v * inv_divisor;
    v = clamp_scalar(v, -1.0f, 1.0f);
    v = tanh_eager(v);
    out[i] = clamp_scalar(v, -1.0f, 1.0f);
}

// Task 95: matmul -> x + add_value (broadcast over rows) -> sigmoid(x) * x -> tanh
// -> GELU -> hardtanh(-1, 1).
// `x + add_value`: add_kernel (ufunc add) a + alpha * b with alpha = 1, which is
// exactly a + b in float.
extern "C" __global__ void tail95(const float* x, const float* add, float* out, long long n,
                                  long long cols) {
    long long i = global_index();
    if (i >= n) {
        return;
    }
    float v = x[i] + add[i % cols];
    float s = sigmoid_eager(v);
    v = s * v;  // mul_kernel_cuda, MulFunctor<float>: a * b with a = sigmoid(x)
    v = tanh_eager(v);
    v = gelu_erf_eager(v);
    out[i] = clamp_scalar(v, -1.0f, 1.0f);
}

// The FTZ witness: 1e-10f * 1e-30f is a subnormal float (about 1e-40), kept as
// a subnormal without flush-to-zero and flushed to zero with it.
extern "C" __global__ void witness_mul(const float* x, float* out, long long n, float s) {
    long long i = global_index();
    if (i >= n) {
        return;
    }
    out[i] = x[i] * s;
}
