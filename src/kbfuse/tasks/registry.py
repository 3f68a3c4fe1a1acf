"""Which KernelBench tasks the study knows, and what each has: plain facts, free of torch.

Two registries, kept apart:

- the KernelBench tasks: any task of `LEVEL`, found in the pinned checkout by its number and
  loaded, with its inputs and shapes, by `kbfuse.tasks.kernelbench` (`load_task`, `TaskSpec`,
  `build_model`); nothing here restricts which task that is;
- the fused tails: the tasks that have a tail kernel in kernels/*.cu (`TAIL_TASKS`; kernel
  `tail<task>`, implemented by `kbfuse.tasks.tails.TAILS`), and the task whose tail witnesses
  flush-to-zero in its bits (`WITNESS_TASK` at `WITNESS_INPUTS`; the verify stage and the
  witness81 control run it).

The PyTorch baselines every fused kernel is checked and timed against are named here too
(`BASELINES`, built by `kbfuse.tasks.baselines`), with those whose build benchmarks kernels on
the GPU (`AUTOTUNED_BASELINES`: the jobs that build them hold the GPU alone).

Every other module derives these facts from here (kernel names, the tasks the config may
name, which records a study writes), so that the Snakefile, which imports this at parse time,
and the GPU stages agree.
"""

from __future__ import annotations

LEVEL = 2
TAIL_TASKS = (53, 81, 95)
# Task 81's swish(x)/2 at -88 and -87.5 is subnormal in float32: FTZ decides its bits.
WITNESS_TASK = 81
WITNESS_INPUTS = (-88.0, -87.5)
BASELINES = ("eager", "torchscript", "inductor", "inductor-max-autotune-no-cudagraphs")
AUTOTUNED_BASELINES = ("inductor-max-autotune-no-cudagraphs",)
# Every kernel source also defines witness_mul(x, out, n, s): out = x * s (kbfuse.checks.verify).
WITNESS_KERNEL = "witness_mul"


def baselines_gpu_lock(names) -> str:
    """How a job that builds and checks the baselines `names` holds the GPU lock
    (kbfuse.workflow.gpulock): alone when one of them autotunes on the GPU, else shared."""
    return "alone" if any(name in AUTOTUNED_BASELINES for name in names) else "shared"


def kernel_name(task: int) -> str:
    """The `extern "C"` name of a task's fused tail kernel in kernels/*.cu."""
    return f"tail{int(task)}"


KERNEL_NAMES = (*map(kernel_name, TAIL_TASKS), WITNESS_KERNEL)
