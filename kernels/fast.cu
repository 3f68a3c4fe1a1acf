// Fast fused tails: the arithmetic of naive.cu, a memory access pattern built for bandwidth.
//
// Each element goes through the same per-task element function of eager_ops.cuh as in
// naive.cu, so with --ftz=false and --fmad=false the results are bit-identical to eager. Only
// the way elements reach those functions differs:
//   - 16-byte loads and stores (float4), kUnroll of them in flight per thread per iteration;
//   - a grid sized to the device (blocks-per-sm blocks of `threads` on every SM, kbfuse.launch
//     reads the line below), each thread striding over the tensor;
//   - 32-bit vector indices, and for task 95 a column index that is carried from one
//     iteration to the next (one compare and subtract) instead of a 64-bit modulo per element;
//   - loads that bypass L1 allocation and stores marked evict-first (__ldcs/__stcs): every
//     byte is touched once.
// Where the fast path's conditions do not hold (a pointer not 16-byte aligned, more than 2^33
// elements, a column count that is not a multiple of 4) the kernel falls back to one element
// per step with 64-bit indices, same arithmetic.
//
// The grids below were picked on an H200 (docs/device-runs.md, 2026-11-29 probes): task 53 is
// memory-bound and does best with enough blocks for 8 elements per thread; tasks 81 and 95 are
// closer to compute-bound and do best with one or two full waves of resident blocks.
// kbfuse-launch: grid-stride threads=256 blocks-per-sm=16 items-per-thread=8
// kbfuse-launch tail53: grid-stride threads=256 blocks-per-sm=64 items-per-thread=8
// kbfuse-launch tail81: grid-stride threads=256 blocks-per-sm=8 items-per-thread=8

#include "eager_ops.cuh"

namespace {

constexpr long long kMaxVectorElements = 1LL << 33;  // 2^31 float4, so 32-bit indices hold

#ifndef KBFUSE_FAST_UNROLL
#define KBFUSE_FAST_UNROLL 2
#endif
constexpr unsigned kUnroll = KBFUSE_FAST_UNROLL;  // float4 loads issued before any compute

__device__ __forceinline__ bool aligned16(const void* p) {
    return (reinterpret_cast<unsigned long long>(p) & 15ULL) == 0;
}

__device__ __forceinline__ unsigned first_thread() {
    return blockIdx.x * blockDim.x + threadIdx.x;
}

__device__ __forceinline__ unsigned thread_count() {
    return gridDim.x * blockDim.x;
}

// (col + col_step) mod col_vectors for col, col_step < col_vectors: no division.
__device__ __forceinline__ unsigned next_column(unsigned col, unsigned col_step,
                                                unsigned col_vectors) {
    const unsigned next = col + col_step;
    return next >= col_vectors ? next - col_vectors : next;
}

template <class Op>
__device__ __forceinline__ float4 map4(const Op& op, float4 v, float4 a) {
    v.x = op(v.x, a.x);
    v.y = op(v.y, a.y);
    v.z = op(v.z, a.z);
    v.w = op(v.w, a.w);
    return v;
}

// out = op(x, 0) over n elements: the tails with no per-column operand.
template <class Op>
__device__ __forceinline__ void map_elements(const float* __restrict__ x,
                                             float* __restrict__ out, long long n,
                                             const Op& op) {
    const unsigned first = first_thread();
    const unsigned step = thread_count();
    if (!aligned16(x) || !aligned16(out) || n >= kMaxVectorElements) {
        for (long long i = first; i < n; i += step) {
            out[i] = op(x[i], 0.0f);
        }
        return;
    }
    const unsigned vectors = static_cast<unsigned>(n >> 2);
    const float4* x4 = reinterpret_cast<const float4*>(x);
    float4* out4 = reinterpret_cast<float4*>(out);
    const float4 none = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    unsigned v = first;
    for (; v + (kUnroll - 1) * step < vectors; v += kUnroll * step) {
        float4 in[kUnroll];
#pragma unroll
        for (unsigned u = 0; u < kUnroll; ++u) {
            in[u] = __ldcs(x4 + v + u * step);
        }
#pragma unroll
        for (unsigned u = 0; u < kUnroll; ++u) {
            __stcs(out4 + v + u * step, map4(op, in[u], none));
        }
    }
    for (; v < vectors; v += step) {
        __stcs(out4 + v, map4(op, __ldcs(x4 + v), none));
    }
    const long long rest = 4LL * vectors + first;  // the last n % 4 elements
    if (rest < n) {
        out[rest] = op(x[rest], 0.0f);
    }
}

struct ScaleHardtanhGelu {
    float scale, lo, hi;
    __device__ __forceinline__ float operator()(float v, float) const {
        return tail53_element(v, scale, lo, hi);
    }
};

struct SwishDivClampTanhClamp {
    __device__ __forceinline__ float operator()(float v, float) const {
        return tail81_element(v);
    }
};

struct AddSwishTanhGeluHardtanh {
    __device__ __forceinline__ float operator()(float v, float add) const {
        return tail95_element(v, add);
    }
};

}  // namespace

extern "C" __global__ void __launch_bounds__(256) tail53(const float* __restrict__ x,
                                                         float* __restrict__ out, long long n,
                                                         float scale, float lo, float hi) {
    map_elements(x, out, n, ScaleHardtanhGelu{scale, lo, hi});
}

extern "C" __global__ void __launch_bounds__(256) tail81(const float* __restrict__ x,
                                                         float* __restrict__ out, long long n) {
    map_elements(x, out, n, SwishDivClampTanhClamp{});
}

// Rows of `cols` elements; add[c] goes with column c. On the fast path (cols a multiple of 4)
// a float4 never straddles two rows, and a thread's column advances by the same amount every
// iteration, so it is carried as a remainder in [0, cols / 4).
extern "C" __global__ void __launch_bounds__(256) tail95(const float* __restrict__ x,
                                                         const float* __restrict__ add,
                                                         float* __restrict__ out, long long n,
                                                         long long cols) {
    const AddSwishTanhGeluHardtanh op;
    const unsigned first = first_thread();
    const unsigned step = thread_count();
    if (!aligned16(x) || !aligned16(out) || !aligned16(add) || n >= kMaxVectorElements ||
        cols % 4 != 0 || n % cols != 0) {
        for (long long i = first; i < n; i += step) {
            out[i] = op(x[i], add[i % cols]);
        }
        return;
    }
    const unsigned vectors = static_cast<unsigned>(n >> 2);
    const unsigned col_vectors = static_cast<unsigned>(cols >> 2);
    const float4* x4 = reinterpret_cast<const float4*>(x);
    const float4* add4 = reinterpret_cast<const float4*>(add);
    float4* out4 = reinterpret_cast<float4*>(out);
    const unsigned col_step = step % col_vectors;  // the column moved by one stride
    unsigned v = first;
    unsigned col = first % col_vectors;
    for (; v + (kUnroll - 1) * step < vectors; v += kUnroll * step) {
        float4 in[kUnroll];
        unsigned cols_of[kUnroll];
#pragma unroll
        for (unsigned u = 0; u < kUnroll; ++u) {
            in[u] = __ldcs(x4 + v + u * step);
            cols_of[u] = col;
            col = next_column(col, col_step, col_vectors);
        }
#pragma unroll
        for (unsigned u = 0; u < kUnroll; ++u) {
            __stcs(out4 + v + u * step, map4(op, in[u], add4[cols_of[u]]));
        }
    }
    for (; v < vectors; v += step) {
        __stcs(out4 + v, map4(op, __ldcs(x4 + v), add4[col]));
        col = next_column(col, col_step, col_vectors);
    }
    // n is rows * cols and cols is a multiple of 4 here, so no elements are left over.
}

// The FTZ witness: 1e-10f * 1e-30f is a subnormal float (about 1e-40), kept as
// a subnormal without flush-to-zero and flushed to zero with it.
extern "C" __global__ void __launch_bounds__(256) witness_mul(const float* __restrict__ x,
                                                              float* __restrict__ out,
                                                              long long n, float s) {
    for (long long i = first_thread(); i < n; i += thread_count()) {
        out[i] = x[i] * s;
    }
}
