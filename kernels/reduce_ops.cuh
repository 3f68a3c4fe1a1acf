// Deterministic sums for the tails that reduce (task 65): a float64 sum per block, and the
// last block to finish adding each sample's partial sums.
//
// Not a mirror of PyTorch's reduction (the contract of a reducing tail is not bit identity
// with eager's sum, kbfuse.checks.contract): the element-wise values are summed in float64,
// each block's in a fixed tree (warp shuffles with fixed offsets, then the warps in order),
// one partial per block; the block that finishes last (an atomic count of finished blocks)
// adds each sample's partials in index order and rounds once to float. Which block finishes
// last changes nothing: every partial, and the order they are added in, is fixed by the grid,
// so the result has the same bits on every run.

#pragma once

constexpr int kMaxWarps = 32;  // 1024 threads per block at most

// The sum of every thread's `value` over the block, returned to thread 0 (others: 0.0).
// Every thread of the block must call it.
__device__ __forceinline__ double block_sum(double value) {
    __shared__ double warp_sums[kMaxWarps];
    const unsigned lane = threadIdx.x % 32;
    const unsigned warp = threadIdx.x / 32;
    for (int offset = 16; offset > 0; offset /= 2) {
        value += __shfl_down_sync(0xffffffffu, value, offset);
    }
    if (lane == 0) {
        warp_sums[warp] = value;
    }
    __syncthreads();
    double total = 0.0;
    if (threadIdx.x == 0) {
        const unsigned warps = (blockDim.x + 31) / 32;
        for (unsigned w = 0; w < warps; ++w) {
            total += warp_sums[w];
        }
    }
    return total;
}

// Thread 0 stores this block's partial sum; the last block to get here then writes
// out[n] = float(sum over c of partials[n * parts + c]) for every sample n, in order of c, and
// resets the count for the next launch. Every thread of the block must call it.
__device__ __forceinline__ void finish_samples(double block_total, double* partials,
                                               unsigned int* counter, float* out,
                                               long long samples, long long parts) {
    __shared__ bool last_block;
    if (threadIdx.x == 0) {
        partials[blockIdx.x] = block_total;
        __threadfence();  // the partial is visible to every block before it is counted
        const unsigned int done = atomicAdd(counter, 1u);
        last_block = (done == gridDim.x - 1);
    }
    __syncthreads();
    if (!last_block) {
        return;
    }
    __threadfence();
    for (long long n = threadIdx.x; n < samples; n += blockDim.x) {
        double sum = 0.0;
        for (long long c = 0; c < parts; ++c) {
            sum += __ldcg(partials + n * parts + c);  // from L2: written by other blocks
        }
        out[n] = __double2float_rn(sum);
    }
    if (threadIdx.x == 0) {
        *counter = 0u;
    }
}
