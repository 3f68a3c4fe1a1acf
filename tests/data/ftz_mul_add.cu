// kbfuse test source: float multiply and add only (no division), so that with --ftz=false
// neither the PTX nor the SASS carries any flush-to-zero instruction.
// kbfuse-launch: per-element threads=256
extern "C" __global__ void scale_add(const float* x, float* out, long long n, float s) {
    long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i < n) {
        out[i] = x[i] * s + s;
    }
}
