"""Compiling the kernels and loading them: routes, NVRTC and nvcc, kernel sources, disassembly, the
CUDA caches and driver, launching."""
