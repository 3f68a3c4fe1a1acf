// Deliberately WRONG tails for the timing gate test (tests/test_gpu_timing.py).
//
// Same extern "C" names and signatures as kernels/naive.cu, so it compiles and loads like
// any variant, but each tail drops one op of its task, far outside atol = rtol = 1e-4:
//   tail53 skips `x * scaling_factor`, tail81 skips `x / 2.0`, tail95 skips `+ add_value`.
// Correctness must fail it, and timing must then never load or launch it.
// witness_mul is the correct FTZ witness (out = x * s).
// kbfuse-launch: per-element threads=256

__device__ __forceinline__ float clamp_scalar(float v, float lo, float hi) {
    if (isnan(v)) {
        return v;
    }
    float result = (v < lo) ? lo : v;
    return (hi < result) ? hi : result;
}

__device__ __forceinline__ float sigmoid_eager(float a) {
    return 1.0f / (1.0f + expf(-a));
}

__device__ __forceinline__ float gelu_erf_eager(float x) {
    const float kAlpha = static_cast<float>(0.707106781186547524401);
    return x * 0.5f * (1.0f + erff(x * kAlpha));
}

__device__ __forceinline__ long long global_index() {
    return static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
}

// WRONG: the scaling factor is ignored.
extern "C" __global__ void tail53(const float* x, float* out, long long n, float scale,
                                  float lo, float hi) {
    long long i = global_index();
    if (i >= n) {
        return;
    }
    (void)scale;
    float v = clamp_scalar(x[i], lo, hi);
    out[i] = gelu_erf_eager(v);
}

// WRONG: the division by 2 is missing.
extern "C" __global__ void tail81(const float* x, float* out, long long n) {
    long long i = global_index();
    if (i >= n) {
        return;
    }
    float v = x[i];
    v = v * sigmoid_eager(v);
    v = clamp_scalar(v, -1.0f, 1.0f);
    v = tanhf(v);
    out[i] = clamp_scalar(v, -1.0f, 1.0f);
}

// WRONG: the add parameter is ignored.
extern "C" __global__ void tail95(const float* x, const float* add, float* out, long long n,
                                  long long cols) {
    long long i = global_index();
    if (i >= n) {
        return;
    }
    (void)add;
    (void)cols;
    float v = x[i];
    v = sigmoid_eager(v) * v;
    v = tanhf(v);
    v = gelu_erf_eager(v);
    out[i] = clamp_scalar(v, -1.0f, 1.0f);
}

extern "C" __global__ void witness_mul(const float* x, float* out, long long n, float s) {
    long long i = global_index();
    if (i >= n) {
        return;
    }
    out[i] = x[i] * s;
}
