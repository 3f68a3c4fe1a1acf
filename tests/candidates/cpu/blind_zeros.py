# kbfuse-task: 2/23
# All zeros, whatever the input (for tests/candidates/cpu/blind_task.py, made like task 23):
# passes every value check there, and the verdict must say that this proves little.
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x):
        return torch.zeros(x.shape[0], 1, dtype=x.dtype, device=x.device)
