"""Build a small KernelBench-shaped git repository for tests.

The three task files re-implement KernelBench level-2 tasks 53, 81 and 95 with the same
forward ops and the same module-level constant names as the pinned originals, but small
shapes (batch 16, in 32, out 64) so that CPU tests run in milliseconds. `FUSED2_TASK_FILES`
does the same for the second fused study's tasks 4 and 65 (a 3x3 convolution of a batch of 2,
3 -> 8 channels, on 18 x 18 and 22 x 22 images; task 65's pool window stays 4), added with
`make_kernelbench_repo(root, tasks=(..., 4, 65))`. Commits use a fixed author, committer and
date, so the same content always gives the same commit ids.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

BATCH, IN_FEATURES, OUT_FEATURES = 16, 32, 64

TASK_FILES = {
    53: (
        "53_Gemm_Scaling_Hardtanh_GELU.py",
        f'''import torch
import torch.nn as nn

class Model(nn.Module):
    """
    Model that performs a GEMM, scaling, hardtanh, and GELU activation.
    """
    def __init__(self, in_features, out_features, scaling_factor, hardtanh_min, hardtanh_max):
        super(Model, self).__init__()
        self.gemm = nn.Linear(in_features, out_features)
        self.scaling_factor = scaling_factor
        self.hardtanh = nn.Hardtanh(min_val=hardtanh_min, max_val=hardtanh_max)
        self.gelu = nn.GELU()

    def forward(self, x):
        x = self.gemm(x)
        x = x * self.scaling_factor
        x = self.hardtanh(x)
        x = self.gelu(x)
        return x

batch_size = {BATCH}
in_features = {IN_FEATURES}
out_features = {OUT_FEATURES}
scaling_factor = 0.5
hardtanh_min = -2
hardtanh_max = 2

def get_inputs():
    return [torch.rand(batch_size, in_features)]

def get_init_inputs():
    return [in_features, out_features, scaling_factor, hardtanh_min, hardtanh_max]
''',
    ),
    81: (
        "81_Gemm_Swish_Divide_Clamp_Tanh_Clamp.py",
        f'''import torch
import torch.nn as nn

class Model(nn.Module):
    """
    Simple model that performs a gemm, swish, divide, clamp, tanh, and clamp operations.
    """
    def __init__(self, in_features, out_features, bias=True):
        super(Model, self).__init__()
        self.gemm = nn.Linear(in_features, out_features, bias=bias)

    def forward(self, x):
        x = self.gemm(x)
        x = x * torch.sigmoid(x)  # Swish activation
        x = x / 2.0
        x = torch.clamp(x, min=-1.0, max=1.0)  # Clamp between -1 and 1
        x = torch.tanh(x)  # Tanh activation
        x = torch.clamp(x, min=-1.0, max=1.0)  # Clamp between -1 and 1
        return x

batch_size = {BATCH}
in_features = {IN_FEATURES}
out_features = {OUT_FEATURES}

def get_inputs():
    return [torch.rand(batch_size, in_features)]

def get_init_inputs():
    return [in_features, out_features]
''',
    ),
    95: (
        "95_Matmul_Add_Swish_Tanh_GELU_Hardtanh.py",
        f'''import torch
import torch.nn as nn

class Model(nn.Module):
    """
    Simple model that performs a matrix multiplication, adds a value, applies Swish, Tanh,
    GELU, and Hardtanh activation functions.
    """
    def __init__(self, in_features, out_features, add_value_shape):
        super(Model, self).__init__()
        self.matmul = nn.Linear(in_features, out_features)
        self.add_value = nn.Parameter(torch.randn(add_value_shape))

    def forward(self, x):
        x = self.matmul(x)
        x = x + self.add_value
        x = torch.sigmoid(x) * x # Swish
        x = torch.tanh(x)
        x = torch.nn.functional.gelu(x) # GELU
        x = torch.nn.functional.hardtanh(x, min_val=-1, max_val=1) # Hardtanh
        return x

batch_size = {BATCH}
in_features = {IN_FEATURES}
out_features = {OUT_FEATURES}
add_value_shape = (out_features,)

def get_inputs():
    return [torch.rand(batch_size, in_features)]

def get_init_inputs():
    return [in_features, out_features, add_value_shape]
''',
    ),
}

CONV_BATCH, CONV_IN, CONV_OUT = 2, 3, 8

FUSED2_TASK_FILES = {
    4: (
        "4_Conv2d_Mish_Mish.py",
        f'''import torch
import torch.nn as nn

class Model(nn.Module):
    """
    Simple model that performs a convolution, applies Mish, and another Mish.
    """
    def __init__(self, in_channels, out_channels, kernel_size):
        super(Model, self).__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)

    def forward(self, x):
        x = self.conv(x)
        x = torch.nn.functional.mish(x)
        x = torch.nn.functional.mish(x)
        return x

batch_size   = {CONV_BATCH}
in_channels  = {CONV_IN}
out_channels = {CONV_OUT}
height = width = 18
kernel_size = 3

def get_inputs():
    return [torch.rand(batch_size, in_channels, height, width)]

def get_init_inputs():
    return [in_channels, out_channels, kernel_size]
''',
    ),
    65: (
        "65_Conv2d_AvgPool_Sigmoid_Sum.py",
        f'''import torch
import torch.nn as nn

class Model(nn.Module):
    """
    This model performs a convolution, average pooling, applies sigmoid, and sums the result.
    """
    def __init__(self, in_channels, out_channels, kernel_size, pool_kernel_size):
        super(Model, self).__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)
        self.avg_pool = nn.AvgPool2d(pool_kernel_size)

    def forward(self, x):
        x = self.conv(x)
        x = self.avg_pool(x)
        x = torch.sigmoid(x)
        x = torch.sum(x, dim=[1,2,3]) # Sum over all spatial dimensions
        return x

batch_size = {CONV_BATCH}
in_channels = {CONV_IN}
out_channels = {CONV_OUT}
height, width = 22, 22
kernel_size = 3
pool_kernel_size = 4

def get_inputs():
    return [torch.rand(batch_size, in_channels, height, width)]

def get_init_inputs():
    return [in_channels, out_channels, kernel_size, pool_kernel_size]
''',
    ),
}
FUSED2_TASKS = tuple(FUSED2_TASK_FILES)

# A KernelBench-shaped evaluator, written for the tests (not KernelBench's code): the functions,
# signatures and calls kbfuse.tasks.evaluator reads the official check from, in the pinned
# evaluator's shape, with the float32 tolerance a parameter (a pin with another tolerance).
# It runs on the CPU (eval_kernel_against_ref returns whether every trial passed), so tests
# can hold kbfuse's judges against the very source they read the contract from.
EVAL_PY = """import torch


def load_original_model_and_inputs(model_original_src, context):
    exec(model_original_src, context)
    return context["Model"], context["get_init_inputs"], context["get_inputs"]


def load_custom_model(model_custom_src, context):
    exec(model_custom_src, context)
    return context["ModelNew"]


def set_seed(seed: int):
    torch.manual_seed(seed)
    torch.cuda.manual_seed(seed)


def get_tolerance_for_precision(precision):
    PRECISION_TOLERANCES = {
        torch.float32: __TOL__,
        torch.float16: 1e-2,
        torch.bfloat16: 1e-2,
    }
    return PRECISION_TOLERANCES[precision]


def eval_kernel_against_ref(
    original_model_src, custom_model_src, seed_num: int = __SEED__, num_correct_trials: int = 1,
    timing_method: str = "cuda_event", precision=torch.float32,
):
    context = {}
    Model, get_init_inputs, get_inputs = load_original_model_and_inputs(original_model_src, context)
    set_seed(seed_num)
    init_inputs = get_init_inputs()
    with torch.no_grad():
        set_seed(seed_num)
        original_model = Model(*init_inputs)
    ModelNew = load_custom_model(custom_model_src, context)
    with torch.no_grad():
        set_seed(seed_num)
        custom_model = ModelNew(*init_inputs)
    return run_and_check_correctness(
        original_model, custom_model, get_inputs, num_correct_trials, seed_num, precision
    )


def run_and_check_correctness(
    original_model_instance, new_model_instance, get_inputs_fn, num_correct_trials, seed,
    precision,
):
    torch.manual_seed(seed)
    correctness_trial_seeds = [
        torch.randint(0, 2**32 - 1, (1,)).item() for _ in range(num_correct_trials)
    ]
    with torch.no_grad():
        for trial in range(num_correct_trials):
            trial_seed = correctness_trial_seeds[trial]
            set_seed(trial_seed)
            inputs = get_inputs_fn()
            set_seed(trial_seed)
            model = original_model_instance.to(dtype=precision)
            set_seed(trial_seed)
            model_new = new_model_instance.to(dtype=precision)
            output = model(*inputs)
            output_new = model_new(*inputs)
            tolerance = get_tolerance_for_precision(precision)
            if not torch.allclose(output, output_new, atol=tolerance, rtol=tolerance):
                return False
    return True
"""
TIMING_PY = """import torch


def clear_l2_cache(device="cuda"):
    dummy = torch.empty((32, 1024, 1024), dtype=torch.int64, device=device)
    dummy.fill_(42)


def time_execution_with_cuda_event(kernel_fn, args, num_warmup=3, num_trials=10, device=None):
    times = []
    for _ in range(num_trials):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        clear_l2_cache(device=device)
        start.record()
        kernel_fn(*args)
        end.record()
        torch.cuda.synchronize(device=device)
        times.append(start.elapsed_time(end))
    return times
"""
SCRIPT_PY = """class EvalConfig:
    def __init__(self):
        self.num_correct_trials = 5
        self.num_perf_trials = 100
"""


def evaluator_files(tolerance: str = "1e-4", seed: int = 42) -> dict[str, str]:
    """The test evaluator's files, relative to the repository root."""
    return {
        "src/kernelbench/eval.py": EVAL_PY.replace("__TOL__", tolerance).replace(
            "__SEED__", str(seed)
        ),
        "src/kernelbench/timing.py": TIMING_PY,
        "scripts/eval_from_generations.py": SCRIPT_PY,
    }


LEVEL_DIR = "KernelBench/level2"
README = "# KernelBench (test fixture)\n\nSmall re-implementations of level-2 tasks 53, 81, 95.\n"

_FIXED_IDENTITY = {
    "GIT_AUTHOR_NAME": "kbfuse tests",
    "GIT_AUTHOR_EMAIL": "tests@kbfuse.invalid",
    "GIT_AUTHOR_DATE": "2024-01-01T00:00:00+0000",
    "GIT_COMMITTER_NAME": "kbfuse tests",
    "GIT_COMMITTER_EMAIL": "tests@kbfuse.invalid",
    "GIT_COMMITTER_DATE": "2024-01-01T00:00:00+0000",
    "GIT_TERMINAL_PROMPT": "0",
}


def git(repo: Path, *args: str) -> str:
    """Run git in `repo` with a fixed identity and date; returns stdout, stripped."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(_FIXED_IDENTITY)
    proc = subprocess.run(
        ["git", "-c", "commit.gpgsign=false", "-c", "core.autocrlf=false", *args],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return proc.stdout.strip()


def commit_files(repo: Path, files: dict[str, str | None], message: str) -> str:
    """Write (or delete, for None) files relative to `repo`, commit them, return the commit id."""
    for rel, text in files.items():
        path = repo / rel
        if text is None:
            git(repo, "rm", "-q", "--", rel)
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        git(repo, "add", "--", rel)
    git(repo, "commit", "-q", "-m", message)
    return git(repo, "rev-parse", "HEAD")


def task_file(task: int) -> tuple[str, str]:
    """(file name, text) of a fixture task, the first study's or the second's."""
    return TASK_FILES[task] if task in TASK_FILES else FUSED2_TASK_FILES[task]


def task_relpath(task: int) -> str:
    return f"{LEVEL_DIR}/{task_file(task)[0]}"


def make_kernelbench_repo(root: Path, tasks=(53, 81, 95)) -> tuple[str, str]:
    """Create a KernelBench-shaped repository at `root`; return (path, pinned commit).

    First commit (returned): README and the task files. Second commit (the branch tip):
    task 53's scaling_factor changed to 0.25 and the README extended, so tests can pin a
    "wrong" commit or compare two pins.
    """
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    git(root, "-c", "init.defaultBranch=main", "init", "-q")
    files: dict[str, str | None] = {"README.md": README, **evaluator_files()}
    files.update({task_relpath(task): task_file(task)[1] for task in tasks})
    pinned = commit_files(root, files, "Add level-2 tasks")
    second: dict[str, str | None] = {"README.md": README + "\nSecond commit.\n"}
    if 53 in tasks:
        second[task_relpath(53)] = TASK_FILES[53][1].replace(
            "scaling_factor = 0.5", "scaling_factor = 0.25"
        )
    commit_files(root, second, "Change task 53 scaling")
    return str(root), pinned
