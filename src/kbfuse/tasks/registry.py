"""Which KernelBench tasks the study knows, and what each has: plain facts, free of torch.

Two registries, kept apart:

- the KernelBench tasks: any task of `LEVEL`, found in the pinned checkout by its number and
  loaded, with its inputs and shapes, by `kbfuse.tasks.kernelbench` (`load_task`, `TaskSpec`,
  `build_model`); nothing here restricts which task that is;
- the fused tails: the tasks that have a tail kernel in kernels/*.cu (`TAIL_TASKS`; kernel
  `tail<task>`, and for a tail that reduces also `stage<task>`, the kernel writing its
  element-wise stage; implemented by `kbfuse.tasks.tails.TAILS`), and the task whose tail
  witnesses flush-to-zero in its bits (`WITNESS_TASK` at `WITNESS_INPUTS`; the verify stage and
  the witness81 control run it).

Two studies use them: the first (config `tasks`, kernels/naive.cu and kernels/fast.cu), on the
tasks of `STUDY_TASKS`, and the second fused study (config `fused2.tasks`, kernels/fused2_*.cu),
on `FUSED2_TASKS`. A kernel source defines the kernels of the tasks its variants run
(kbfuse.workflow.config checks that before any job).

The PyTorch baselines every fused kernel is checked and timed against are named here too
(`BASELINES`, built by `kbfuse.tasks.baselines`), with those whose build benchmarks kernels on
the GPU (`AUTOTUNED_BASELINES`: the jobs that build them hold the GPU alone).

Every other module derives these facts from here (kernel names, the tasks the config may
name, which records a study writes), so that the Snakefile, which imports this at parse time,
and the GPU stages agree.
"""

from __future__ import annotations

LEVEL = 2
STUDY_TASKS = (53, 81, 95)
FUSED2_TASKS = (4, 65)
TAIL_TASKS = (*STUDY_TASKS, *FUSED2_TASKS)
# Task 81's swish(x)/2 at -88 and -87.5 is subnormal in float32: FTZ decides its bits.
WITNESS_TASK = 81
WITNESS_INPUTS = (-88.0, -87.5)
BASELINES = ("eager", "torchscript", "inductor", "inductor-max-autotune-no-cudagraphs")
AUTOTUNED_BASELINES = ("inductor-max-autotune-no-cudagraphs",)
# Every kernel source also defines witness_mul(x, out, n, s): out = x * s (kbfuse.checks.verify).
WITNESS_KERNEL = "witness_mul"
# The tasks whose tail reduces (an element-wise stage, then a reduction): their sources also
# define stage<task>.
STAGED_TASKS = (65,)


def baselines_gpu_lock(names) -> str:
    """How a job that builds and checks the baselines `names` holds the GPU lock
    (kbfuse.workflow.gpulock): alone when one of them autotunes on the GPU, else shared."""
    return "alone" if any(name in AUTOTUNED_BASELINES for name in names) else "shared"


def kernel_name(task: int) -> str:
    """The `extern "C"` name of a task's fused tail kernel in kernels/*.cu."""
    return f"tail{int(task)}"


def stage_kernel_name(task: int) -> str:
    """The `extern "C"` name of the kernel writing a reducing tail's element-wise stage."""
    return f"stage{int(task)}"


def kernel_names(tasks) -> tuple[str, ...]:
    """Every kernel a source serving `tasks` must define: each task's tail kernel, the stage
    kernels of the tasks that reduce, and the FTZ witness."""
    names = []
    for task in tasks:
        names.append(kernel_name(task))
        if int(task) in STAGED_TASKS:
            names.append(stage_kernel_name(task))
    return (*names, WITNESS_KERNEL)


KERNEL_NAMES = kernel_names(STUDY_TASKS)
