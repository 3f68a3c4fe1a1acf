"""The `survey:` config block: defaults, the checks a schema cannot make, numerics modes.

The schema (workflow/schemas/config.schema.yaml) checks types and enums; `survey_settings`
fills the defaults (so a config without a `survey:` block still works) and
`unknown_task_problems` refuses task numbers that have no file at the pinned checkout, naming
the key `survey.tasks` and the value. `level` is the KernelBench level surveyed (2 by default;
its files are `KernelBench/level<N>/` of the pinned checkout, whatever `kernelbench.level`
says, which is the study's). Numerics modes say which TF32 switches are on:
`strict` turns TF32 off for matmul and cuDNN (the study's contract); `kernelbench-defaults`
leaves PyTorch's defaults (cuDNN TF32 on, matmul TF32 off), the conditions of KernelBench's
published timings.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from typing import Any

from kbfuse.errors import KbfuseError

SEMANTICS = ("kernelbench", "eval")
NUMERICS = {
    # mode: (matmul TF32, cuDNN TF32)
    "strict": (False, False),
    "kernelbench-defaults": (False, True),
}
BASELINES = ("eager", "torchscript", "inductor", "inductor-max-autotune-no-cudagraphs")
DEVICES = ("cuda", "cpu")
DEFAULTS: dict[str, Any] = {
    "level": 2,
    "tasks": "all",
    "semantics": "kernelbench",
    "numerics": ["strict", "kernelbench-defaults"],
    "baselines": ["eager", "torchscript", "inductor"],
    "device": "cuda",
    "seed": None,  # the pinned evaluator's (kbfuse.tasks.evaluator)
    "order_seed": 913,
    "warmup": 3,
    "rounds": 30,
    "invocations_per_pair": 10,
    "min_sample_ms": 1.0,
    "cold_l2": True,
    "profile": True,
    # Inductor's max_autotune_conv_backends for the max-autotune baseline (None: Inductor's own)
    "max_autotune_conv_backends": None,
    # leave out of the survey's placement the GPUs the cross-device check finds off the others
    # (kbfuse.survey.agreement); not a setting of the task jobs (changing it reruns none)
    "exclude_outlier_devices": False,
}


def survey_settings(config: Mapping[str, Any]) -> dict:
    """The survey block of `config` with every default filled in (a new dict)."""
    given = config.get("survey") or {}
    settings = copy.deepcopy(DEFAULTS)
    settings.update(copy.deepcopy(dict(given)))
    return settings


def configured_tasks(settings: Mapping[str, Any], available: Iterable[int]) -> list[int]:
    """The task numbers the survey runs: every available one for `all`, else the list given,
    each checked against `available` (KbfuseError naming survey.tasks and the unknown ones)."""
    available = sorted(set(available))
    if settings["tasks"] == "all":
        if not available:
            raise KbfuseError("config key survey.tasks: 'all' found no task file at the pin")
        return available
    problems = unknown_task_problems(settings["tasks"], available)
    if problems:
        raise KbfuseError("; ".join(problems))
    return sorted(settings["tasks"])


def unknown_task_problems(tasks: Iterable[int], available: Iterable[int]) -> list[str]:
    known = set(available)
    unknown = [t for t in tasks if t not in known]
    if not unknown:
        return []
    span = f"{min(known)}..{max(known)}" if known else "none"
    return [f"config key survey.tasks: {unknown} have no task file at the pin (tasks: {span})"]


def tf32_flags(mode: str) -> tuple[bool, bool]:
    """(matmul TF32, cuDNN TF32) of numerics mode `mode`."""
    try:
        return NUMERICS[mode]
    except KeyError:
        raise KbfuseError(
            f"survey numerics mode {mode!r} is unknown; known: {list(NUMERICS)}"
        ) from None


def set_numerics(mode: str) -> dict:
    """Put numerics mode `mode` in force and return the record's `numerics` block, read back
    from torch's switches (the legacy ones, as kbfuse.tasks.baselines.set_numerics does)."""
    import torch

    matmul, cudnn = tf32_flags(mode)
    torch.backends.cuda.matmul.allow_tf32 = matmul
    torch.backends.cudnn.allow_tf32 = cudnn
    torch.set_float32_matmul_precision("high" if matmul else "highest")
    return {
        "mode": mode,
        "matmul_tf32": bool(torch.backends.cuda.matmul.allow_tf32),
        "cudnn_tf32": bool(torch.backends.cudnn.allow_tf32),
    }
