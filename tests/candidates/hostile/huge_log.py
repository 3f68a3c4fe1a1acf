# kbfuse-task: 2/53
# Right, but its log (its standard output, a file the parent opened) becomes 2 GiB long at
# once (sparse): a parent that reads the log whole to quote its end holds 2 GiB.
import os

import torch.nn as nn

os.ftruncate(1, 2 << 30)
print("attack: the log is 2 GiB long now", flush=True)


class ModelNew(nn.Module):
    def __init__(self, in_features, out_features, scaling_factor, hardtanh_min, hardtanh_max):
        super().__init__()
        self.gemm = nn.Linear(in_features, out_features)
        self.scaling_factor = scaling_factor
        self.hardtanh = nn.Hardtanh(min_val=hardtanh_min, max_val=hardtanh_max)
        self.gelu = nn.GELU()

    def forward(self, x):
        return self.gelu(self.hardtanh(self.gemm(x) * self.scaling_factor))
