# kbfuse-task: 2/53
# A wrong candidate: it forgets the scaling by scaling_factor (0.5), so GELU sees twice the
# value; every check that compares values must fail it.
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, in_features, out_features, scaling_factor, hardtanh_min, hardtanh_max):
        super().__init__()
        self.gemm = nn.Linear(in_features, out_features)
        self.scaling_factor = scaling_factor
        self.hardtanh = nn.Hardtanh(min_val=hardtanh_min, max_val=hardtanh_max)
        self.gelu = nn.GELU()

    def tail(self, x):
        return self.gelu(self.hardtanh(self.gemm(x) * self.scaling_factor))

    def forward(self, x):
        return self.gelu(self.hardtanh(self.gemm(x)))
