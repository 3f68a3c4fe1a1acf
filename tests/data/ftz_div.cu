// kbfuse test source: float multiply, add and IEEE division. The division's slow path is an
// NVIDIA helper routine ($__internal_*) whose SASS uses .FTZ even under --ftz=false.
// kbfuse-launch: per-element threads=256
extern "C" __global__ void ratio(const float* x, float* out, long long n, float s) {
    long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i < n) {
        out[i] = x[i] * s / (x[i] + 1.0f);
    }
}
