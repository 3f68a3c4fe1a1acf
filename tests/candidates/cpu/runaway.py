# kbfuse-task: 2/53
# Never returns: the wall-time limit must end it. (It sleeps rather than spins: the limit is
# on wall time, and a spinning loop took a core from the rest of the suite for the whole limit.)
import time

import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, in_features, out_features, scaling_factor, hardtanh_min, hardtanh_max):
        super().__init__()
        self.gemm = nn.Linear(in_features, out_features)
        self.scaling_factor = scaling_factor
        self.hardtanh = nn.Hardtanh(min_val=hardtanh_min, max_val=hardtanh_max)
        self.gelu = nn.GELU()

    def forward(self, x):
        while True:
            time.sleep(0.1)
