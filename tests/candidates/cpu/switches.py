# kbfuse-task: 2/53
# The task's arithmetic, with the switches many published kernels set in their Model: cuDNN's
# autotuner and TF32 for matmul. Correct, but every call in its process runs under them.
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, in_features, out_features, scaling_factor, hardtanh_min, hardtanh_max):
        super().__init__()
        torch.backends.cudnn.benchmark = True
        torch.backends.cuda.matmul.allow_tf32 = True
        self.gemm = nn.Linear(in_features, out_features)
        self.scaling_factor = scaling_factor
        self.hardtanh = nn.Hardtanh(min_val=hardtanh_min, max_val=hardtanh_max)
        self.gelu = nn.GELU()

    def forward(self, x):
        x = self.gelu(self.hardtanh(self.gemm(x) * self.scaling_factor))
        return x
