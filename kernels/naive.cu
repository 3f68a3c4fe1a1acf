// Study-faithful fused tails: one element per thread, float32 throughout, 64-bit indices.
//
// The kernels the study was first run with, kept for reproduction; kernels/fast.cu has the
// same arithmetic with a memory access pattern built for bandwidth. The arithmetic is the
// per-task element functions of eager_ops.cuh, so with --ftz=false and --fmad=false the
// results are bit-identical to eager.
//
// kbfuse-launch: per-element threads=256

#include "eager_ops.cuh"

__device__ __forceinline__ long long global_index() {
    return static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
}

extern "C" __global__ void tail53(const float* x, float* out, long long n, float scale,
                                  float lo, float hi) {
    long long i = global_index();
    if (i >= n) {
        return;
    }
    out[i] = tail53_element(x[i], scale, lo, hi);
}

extern "C" __global__ void tail81(const float* x, float* out, long long n) {
    long long i = global_index();
    if (i >= n) {
        return;
    }
    out[i] = tail81_element(x[i]);
}

extern "C" __global__ void tail95(const float* x, const float* add, float* out, long long n,
                                  long long cols) {
    long long i = global_index();
    if (i >= n) {
        return;
    }
    out[i] = tail95_element(x[i], add[i % cols]);
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
