# A tiny KernelBench-shaped task made for the CPU tests of kbfuse check: a linear layer, then
# GroupNorm-like centring and a mean over the features, as in level-2 task 23. The output is
# the mean of a centred row, a few float32 ULPs away from zero, so an all-zeros output passes
# KernelBench's official check (atol = rtol = 1e-2) on this task: a blind spot by design.
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x):
        x = self.linear(x)
        x = x - x.mean(dim=1, keepdim=True)
        return x.mean(dim=1, keepdim=True)


batch_size = 8
in_features = 16
out_features = 32


def get_inputs():
    return [torch.rand(batch_size, in_features)]


def get_init_inputs():
    return [in_features, out_features]
