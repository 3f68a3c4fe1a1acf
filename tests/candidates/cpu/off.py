# kbfuse-task: 2/53
# The task's arithmetic, then 0.3 % too large: within KernelBench v0.1's tolerance (1e-2),
# outside the pinned evaluator's (1e-4).
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, in_features, out_features, scaling_factor, hardtanh_min, hardtanh_max):
        super().__init__()
        self.gemm = nn.Linear(in_features, out_features)
        self.scaling_factor = scaling_factor
        self.hardtanh = nn.Hardtanh(min_val=hardtanh_min, max_val=hardtanh_max)
        self.gelu = nn.GELU()

    def forward(self, x):
        return self.gelu(self.hardtanh(self.gemm(x) * self.scaling_factor)) * 1.003
