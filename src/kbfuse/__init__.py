"""kbfuse: bit-exactness and timing study of fused pointwise CUDA tails on KernelBench."""

__version__ = "0.1.0"
