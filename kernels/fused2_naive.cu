// The second study's tails, written plainly: one element (or one pooled value) per thread,
// float32 throughout, 64-bit indices. kernels/fused2_fast.cu has the same arithmetic with a
// memory access pattern built for bandwidth.
//
// The arithmetic is the per-task element functions of eager_ops_conv.cuh, so with --ftz=false
// and --fmad=false task 4's outputs and task 65's element-wise stage are bit-identical to
// eager. Task 65's sum is reduce_ops.cuh's: float64, in a fixed order (its contract is
// kbfuse.checks.contract's "reduction-float64").
//
// Launch: one thread per element for task 4 and for task 65's stage kernel; one block per
// (sample, channel) plane for task 65 (kbfuse.tasks.convtails: Tail.launch_items).
// kbfuse-launch: per-element threads=256
// kbfuse-launch tail65: per-block threads=256

#include "eager_ops_conv.cuh"
#include "reduce_ops.cuh"

__device__ __forceinline__ long long global_index() {
    return static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
}

// Task 4: y is the convolution's output without its bias, NCHW; hw = H * W.
extern "C" __global__ void tail4(const float* y, const float* bias, float* out, long long n,
                                 long long hw, long long channels) {
    long long i = global_index();
    if (i >= n) {
        return;
    }
    out[i] = tail4_element(y[i], bias[(i / hw) % channels]);
}

// Task 65: one block per (sample, channel) plane of y; its threads take the plane's pooled
// values in turn, each the sigmoid of one k x k window's average, summed in float64.
extern "C" __global__ void tail65(const float* y, const float* bias, float* out,
                                  double* partials, unsigned int* counter, long long batch,
                                  long long channels, long long height, long long width,
                                  long long pooled_h, long long pooled_w, long long k,
                                  long long stride) {
    const long long plane = blockIdx.x;
    const float b = bias[plane % channels];
    const float* src = y + plane * height * width;
    double sum = 0.0;
    for (long long p = threadIdx.x; p < pooled_h * pooled_w; p += blockDim.x) {
        const long long ph = p / pooled_w;
        const long long pw = p % pooled_w;
        const float* row = src + ph * stride * width + pw * stride;
        sum += static_cast<double>(tail65_stage_element(row, width, static_cast<int>(k), b));
    }
    finish_samples(block_sum(sum), partials, counter, out, batch, channels);
}

// Task 65's element-wise stage: stage[n, c, ph, pw] = sigmoid(avg_pool2d(y + bias)).
extern "C" __global__ void stage65(const float* y, const float* bias, float* stage,
                                   long long batch, long long channels, long long height,
                                   long long width, long long pooled_h, long long pooled_w,
                                   long long k, long long stride) {
    long long i = global_index();
    if (i >= batch * channels * pooled_h * pooled_w) {
        return;
    }
    const long long pw = i % pooled_w;
    const long long ph = (i / pooled_w) % pooled_h;
    const long long plane = i / (pooled_w * pooled_h);
    const float* row = y + plane * height * width + ph * stride * width + pw * stride;
    stage[i] = tail65_stage_element(row, width, static_cast<int>(k), bias[plane % channels]);
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
