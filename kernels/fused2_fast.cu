// The second study's tails for the H200's memory system: the arithmetic of fused2_naive.cu,
// another way of reaching the data.
//
// Every value goes through the same element functions of eager_ops_conv.cuh, in the same
// order, so with --ftz=false and --fmad=false task 4's outputs and task 65's element-wise stage
// are bit-identical to eager; task 65's sum is reduce_ops.cuh's (float64, fixed order). Only the
// memory access pattern differs from the naive kernels:
//   - task 4: 16-byte loads and stores (float4), kUnroll of them in flight per thread, a grid
//     sized to the device with every thread striding over the tensor, 32-bit vector indices, and
//     one channel lookup per float4 (H * W a multiple of 4: a float4 never straddles two
//     channel planes). Loads bypass L1 allocation and stores are marked evict-first (every byte
//     is touched once). Mish twice in IEEE float32 is about a hundred instructions per
//     element, so this tail is bound by arithmetic, not by memory: the grid fills every SM.
//   - task 65: one pass over the convolution's output, nothing written back but one float64
//     partial sum per (sample, channel) plane. A block takes one plane; each thread takes whole
//     4 x 4 windows, each window row as one float4 where it is 16-byte aligned and two float2
//     otherwise (a row of 382 floats is 1528 bytes, so every other row is only 8-byte aligned),
//     two windows in flight, streaming loads. The stage kernel stage65 computes every pooled
//     value with the very function tail65 uses (`pooled_sigmoid`), so checking the stage's bits
//     checks the fused kernel's own element-wise path.
// Where the fast path's conditions do not hold (pointers not aligned, other windows, odd widths,
// more than 2^33 elements) the kernels fall back to one element (or window) per step with
// 64-bit indices, same arithmetic.
//
// kbfuse-launch: grid-stride threads=256 blocks-per-sm=8 items-per-thread=8
// kbfuse-launch tail65: per-block threads=256
// kbfuse-launch stage65: per-element threads=256

#include "eager_ops_conv.cuh"
#include "reduce_ops.cuh"

namespace {

constexpr long long kMaxVectorElements = 1LL << 33;  // 2^31 float4, so 32-bit indices hold
constexpr unsigned kUnroll = 2;                      // float4 loads issued before any compute

__device__ __forceinline__ bool aligned(const void* p, unsigned long long bytes) {
    return (reinterpret_cast<unsigned long long>(p) & (bytes - 1)) == 0;
}

__device__ __forceinline__ unsigned first_thread() {
    return blockIdx.x * blockDim.x + threadIdx.x;
}

__device__ __forceinline__ unsigned thread_count() {
    return gridDim.x * blockDim.x;
}

__device__ __forceinline__ float4 tail4_vector(float4 v, float bias) {
    v.x = tail4_element(v.x, bias);
    v.y = tail4_element(v.y, bias);
    v.z = tail4_element(v.z, bias);
    v.w = tail4_element(v.w, bias);
    return v;
}

// The 4 floats of one window row, left to right, added to the window's running sum.
__device__ __forceinline__ float pool_row4(float aveval, const float* p, float bias) {
    float v0, v1, v2, v3;
    if (aligned(p, 16)) {
        const float4 q = __ldcs(reinterpret_cast<const float4*>(p));
        v0 = q.x, v1 = q.y, v2 = q.z, v3 = q.w;
    } else {
        const float2 a = __ldcs(reinterpret_cast<const float2*>(p));
        const float2 b = __ldcs(reinterpret_cast<const float2*>(p) + 1);
        v0 = a.x, v1 = a.y, v2 = b.x, v3 = b.y;
    }
    aveval = pool_accumulate(aveval, v0, bias);
    aveval = pool_accumulate(aveval, v1, bias);
    aveval = pool_accumulate(aveval, v2, bias);
    return pool_accumulate(aveval, v3, bias);
}

// Whether a plane can take the vector path: 4 x 4 windows with stride 4, rows 8-byte
// aligned (the plane 8-byte aligned, an even width).
__device__ __forceinline__ bool pool4_path(const float* plane, long long width, long long k,
                                           long long stride) {
    return k == 4 && stride == 4 && width % 2 == 0 && aligned(plane, 8);
}

// sigmoid(avg_pool2d(y + bias)) of window (ph, pw) of one plane: the values added in the
// order avg_pool2d_out_cuda_frame adds them, whichever path loads them.
__device__ __forceinline__ float pooled_sigmoid(const float* plane, long long width,
                                               long long ph, long long pw, long long k,
                                               long long stride, float bias, bool vector) {
    const float* row = plane + ph * stride * width + pw * stride;
    if (!vector) {
        return tail65_stage_element(row, width, static_cast<int>(k), bias);
    }
    float aveval = 0.0f;
#pragma unroll
    for (int h = 0; h < 4; ++h) {
        aveval = pool_row4(aveval, row + h * width, bias);
    }
    return sigmoid_eager(pool_average(aveval, 16));
}

}  // namespace

// Task 4: y is the convolution's output without its bias, NCHW; hw = H * W.
extern "C" __global__ void __launch_bounds__(256) tail4(const float* __restrict__ y,
                                                        const float* __restrict__ bias,
                                                        float* __restrict__ out, long long n,
                                                        long long hw, long long channels) {
    const unsigned first = first_thread();
    const unsigned step = thread_count();
    if (!aligned(y, 16) || !aligned(out, 16) || n >= kMaxVectorElements || hw % 4 != 0 ||
        n % hw != 0) {
        for (long long i = first; i < n; i += step) {
            out[i] = tail4_element(y[i], bias[(i / hw) % channels]);
        }
        return;
    }
    const unsigned vectors = static_cast<unsigned>(n >> 2);
    const unsigned plane_vectors = static_cast<unsigned>(hw >> 2);
    const unsigned planes = static_cast<unsigned>(channels);
    const float4* y4 = reinterpret_cast<const float4*>(y);
    float4* out4 = reinterpret_cast<float4*>(out);
    unsigned v = first;
    for (; v + (kUnroll - 1) * step < vectors; v += kUnroll * step) {
        float4 in[kUnroll];
        float b[kUnroll];
#pragma unroll
        for (unsigned u = 0; u < kUnroll; ++u) {
            const unsigned at = v + u * step;
            in[u] = __ldcs(y4 + at);
            b[u] = __ldg(bias + (at / plane_vectors) % planes);
        }
#pragma unroll
        for (unsigned u = 0; u < kUnroll; ++u) {
            __stcs(out4 + v + u * step, tail4_vector(in[u], b[u]));
        }
    }
    for (; v < vectors; v += step) {
        const float b = __ldg(bias + (v / plane_vectors) % planes);
        __stcs(out4 + v, tail4_vector(__ldcs(y4 + v), b));
    }
    // n is a multiple of hw, itself a multiple of 4: no element is left over.
}

// Task 65: one block per (sample, channel) plane; each thread sums whole windows in float64,
// two in flight at a time.
extern "C" __global__ void __launch_bounds__(256) tail65(
    const float* __restrict__ y, const float* __restrict__ bias, float* __restrict__ out,
    double* __restrict__ partials, unsigned int* __restrict__ counter, long long batch,
    long long channels, long long height, long long width, long long pooled_h,
    long long pooled_w, long long k, long long stride) {
    const long long plane_index = blockIdx.x;
    const float b = __ldg(bias + plane_index % channels);
    const float* plane = y + plane_index * height * width;
    const bool vector = pool4_path(plane, width, k, stride);
    const long long windows = pooled_h * pooled_w;
    double sum = 0.0;
    long long p = threadIdx.x;
    for (; p + blockDim.x < windows; p += 2 * blockDim.x) {
        const long long q = p + blockDim.x;
        const float first = pooled_sigmoid(plane, width, p / pooled_w, p % pooled_w, k, stride,
                                           b, vector);
        const float second = pooled_sigmoid(plane, width, q / pooled_w, q % pooled_w, k, stride,
                                            b, vector);
        sum += static_cast<double>(first);
        sum += static_cast<double>(second);
    }
    for (; p < windows; p += blockDim.x) {
        sum += static_cast<double>(
            pooled_sigmoid(plane, width, p / pooled_w, p % pooled_w, k, stride, b, vector));
    }
    finish_samples(block_sum(sum), partials, counter, out, batch, channels);
}

// Task 65's element-wise stage: stage[n, c, ph, pw], computed as tail65 computes it.
extern "C" __global__ void __launch_bounds__(256) stage65(
    const float* __restrict__ y, const float* __restrict__ bias, float* __restrict__ stage,
    long long batch, long long channels, long long height, long long width, long long pooled_h,
    long long pooled_w, long long k, long long stride) {
    const long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= batch * channels * pooled_h * pooled_w) {
        return;
    }
    const long long pw = i % pooled_w;
    const long long ph = (i / pooled_w) % pooled_h;
    const long long plane_index = i / (pooled_w * pooled_h);
    const float* plane = y + plane_index * height * width;
    stage[i] = pooled_sigmoid(plane, width, ph, pw, k, stride, bias[plane_index % channels],
                              pool4_path(plane, width, k, stride));
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
