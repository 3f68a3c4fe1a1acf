"""A KernelBench-shaped git repository for the survey's tests: tasks of different kinds.

Beside kbrepo's GEMM tails (53, 81, 95), tiny level-2-shaped tasks with the real tasks'
numbers and kinds: a convolution (1), a normalisation (23: conv + GroupNorm + mean), a Dropout
in training mode (66: nondeterministic under KernelBench's semantics), one that
torch.jit.trace cannot trace (7: `get_inputs` hands `forward` a Python int) and one whose
forward reads a value back to the host (9: `.item()`, which no CUDA graph can capture).
Shapes are tiny, so a whole survey job runs in CPU seconds.
"""

from __future__ import annotations

from pathlib import Path

from kbrepo import LEVEL_DIR, README, TASK_FILES, commit_files, evaluator_files, git

SURVEY_TASK_FILES = {
    1: (
        "1_Conv2D_ReLU_BiasAdd.py",
        """import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, bias_shape):
        super(Model, self).__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)
        self.bias = nn.Parameter(torch.randn(bias_shape))

    def forward(self, x):
        x = self.conv(x)
        x = torch.relu(x)
        x = x + self.bias
        return x

batch_size = 2
in_channels = 3
out_channels = 4
height, width = 8, 8
kernel_size = 3
bias_shape = (out_channels, 1, 1)

def get_inputs():
    return [torch.rand(batch_size, in_channels, height, width)]

def get_init_inputs():
    return [in_channels, out_channels, kernel_size, bias_shape]
""",
    ),
    7: (
        "7_Gemm_Scale_By_Int.py",
        """import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self, in_features, out_features):
        super(Model, self).__init__()
        self.gemm = nn.Linear(in_features, out_features)

    def forward(self, x, repeats):
        for _ in range(repeats):
            x = torch.tanh(x)
        return self.gemm(x)

batch_size = 4
in_features = 8
out_features = 8

def get_inputs():
    return [torch.rand(batch_size, in_features), 2]

def get_init_inputs():
    return [in_features, out_features]
""",
    ),
    9: (
        "9_Matmul_Divide_By_Max.py",
        """import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self, in_features, out_features):
        super(Model, self).__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x):
        x = self.linear(x)
        peak = float(x.abs().max().item())
        return x / peak

batch_size = 4
in_features = 8
out_features = 8

def get_inputs():
    return [torch.rand(batch_size, in_features)]

def get_init_inputs():
    return [in_features, out_features]
""",
    ),
    23: (
        "23_Conv3d_GroupNorm_Mean.py",
        """import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, num_groups):
        super(Model, self).__init__()
        self.conv = nn.Conv3d(in_channels, out_channels, kernel_size)
        self.group_norm = nn.GroupNorm(num_groups, out_channels)

    def forward(self, x):
        x = self.conv(x)
        x = self.group_norm(x)
        x = x.mean(dim=[1, 2, 3, 4])
        return x

batch_size = 2
in_channels = 2
out_channels = 4
D, H, W = 4, 4, 4
kernel_size = 3
num_groups = 2

def get_inputs():
    return [torch.rand(batch_size, in_channels, D, H, W)]

def get_init_inputs():
    return [in_channels, out_channels, kernel_size, num_groups]
""",
    ),
    66: (
        "66_Matmul_Dropout_Mean_Softmax.py",
        """import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self, in_features, out_features, dropout_p):
        super(Model, self).__init__()
        self.matmul = nn.Linear(in_features, out_features)
        self.dropout = nn.Dropout(dropout_p)

    def forward(self, x):
        x = self.matmul(x)
        x = self.dropout(x)
        x = torch.softmax(x, dim=1)
        return x

batch_size = 4
in_features = 8
out_features = 16
dropout_p = 0.5

def get_inputs():
    return [torch.rand(batch_size, in_features)]

def get_init_inputs():
    return [in_features, out_features, dropout_p]
""",
    ),
}


def survey_relpath(task: int) -> str:
    name = (SURVEY_TASK_FILES.get(task) or TASK_FILES[task])[0]
    return f"{LEVEL_DIR}/{name}"


def make_survey_repo(root: Path) -> tuple[str, str]:
    """A repository with kbrepo's tasks and the survey's; returns (path, its one commit)."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    git(root, "-c", "init.defaultBranch=main", "init", "-q")
    files: dict[str, str | None] = {"README.md": README, **evaluator_files()}
    for name, text in {**TASK_FILES, **SURVEY_TASK_FILES}.values():
        files[f"{LEVEL_DIR}/{name}"] = text
    return str(root), commit_files(root, files, "Add level-2 tasks for the survey")
