# kbfuse-task: 2/53
# good.py's arithmetic, from a file that sets torch's default dtype to float64 when imported
# (its own layers are float32 explicitly). Its inputs and the eager baseline's Model must
# still be made as in a fresh process: drawn under float64 they would be other values.
import torch
import torch.nn as nn

torch.set_default_dtype(torch.float64)


class ModelNew(nn.Module):
    def __init__(self, in_features, out_features, scaling_factor, hardtanh_min, hardtanh_max):
        super().__init__()
        self.gemm = nn.Linear(in_features, out_features, dtype=torch.float32)
        self.scaling_factor = scaling_factor
        self.hardtanh = nn.Hardtanh(min_val=hardtanh_min, max_val=hardtanh_max)
        self.gelu = nn.GELU()

    def forward(self, x):
        return self.gelu(self.hardtanh(self.gemm(x) * self.scaling_factor))
