// Deliberately BROKEN kernel source for tests/test_bad_inputs.py: the workflow must stop at
// compile_variant with NVRTC's own error log (the missing ';' after `scale` below), leave no
// artifact or metadata, and never start a job that depends on the compile.
// Same extern "C" names as kernels/naive.cu, so only the syntax error can fail it.
// kbfuse-launch: per-element threads=256

extern "C" __global__ void tail53(const float* x, float* out, long long n, float scale,
                                  float lo, float hi) {
    long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i < n) {
        float v = x[i] * scale
        out[i] = fminf(fmaxf(v, lo), hi);
    }
}

extern "C" __global__ void tail81(const float* x, float* out, long long n) {}

extern "C" __global__ void tail95(const float* x, const float* add, float* out, long long n,
                                  long long cols) {}

extern "C" __global__ void witness_mul(const float* x, float* out, long long n, float s) {}
