"""Which level-N task files the pinned checkout holds, and one task loaded as KernelBench does.

`level_tasks` lists `KernelBench/level{N}/{number}_*.py` of a checkout; `write_task_list`
records the configured survey tasks (the workflow's checkpoint: `tasks: all` is resolved
here). A task is then pinned with `kbfuse.tasks.kernelbench.pin_task` (its file's sha256) and
imported with `kbfuse.tasks.kernelbench.load_task`, which re-hashes it.

The model and its inputs are built as KernelBench's evaluator builds them
(kbfuse.checks.official). Semantics `kernelbench` leaves the module in training mode (the
evaluator never calls `.eval()`, so BatchNorm and Dropout behave as in training); `eval` calls
`.eval()`.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from kbfuse.errors import KbfuseError
from kbfuse.io import read_json, sha256_file, write_json
from kbfuse.survey.settings import configured_tasks
from kbfuse.tasks.kernelbench import read_pin

_TASK_FILE = re.compile(r"(?P<task>[1-9][0-9]*)_[^/]*\.py")


def level_tasks(checkout: str | os.PathLike, level: int) -> dict[int, str]:
    """task number -> file name, for every task file of `level` in the checkout."""
    level_dir = Path(checkout) / "KernelBench" / f"level{level}"
    if not level_dir.is_dir():
        raise KbfuseError(f"checkout {checkout} has no folder KernelBench/level{level}")
    found: dict[int, str] = {}
    for path in sorted(level_dir.iterdir()):
        match = _TASK_FILE.fullmatch(path.name)
        if match and path.is_file():
            task = int(match["task"])
            if task in found:
                raise KbfuseError(
                    f"task {task}: KernelBench/level{level} holds two files for it: "
                    f"{found[task]}, {path.name}"
                )
            found[task] = path.name
    return found


def write_task_list(checkout, record, tasks, out, level: int | None = None) -> dict:
    """Resolve survey.tasks (`tasks`: "all" or a list) against level `level` of the checkout
    (by default the checkout record's) and write {commit, level, tasks: {n: file}}."""
    pin = read_pin(record)
    level = pin["level"] if level is None else level
    available = level_tasks(checkout, level)
    tasks = configured_tasks({"tasks": tasks}, available)
    listing = {
        "commit": pin["commit"],
        "level": level,
        "tasks": {str(t): available[t] for t in tasks},
    }
    write_json(out, listing)
    return listing


def task_file_sha256(checkout, level: int, task: int) -> str:
    """sha256 of task `task`'s file in the checkout, or "absent" (no checkout or no such file):
    the survey's pin rule takes it as a param, so editing one task file reruns that task."""
    level_dir = Path(checkout) / "KernelBench" / f"level{level}"
    matches = sorted(level_dir.glob(f"{task}_*.py")) if level_dir.is_dir() else []
    return sha256_file(matches[0]) if len(matches) == 1 else "absent"


def read_survey_pin(path) -> tuple[dict, int]:
    """A survey job's pin record (kbfuse.tasks.kernelbench.read_pin) and the one task it names."""
    pin = read_pin(path)
    if len(pin["tasks"]) != 1:
        raise KbfuseError(f"survey pin {path} must name exactly one task")
    return pin, int(next(iter(pin["tasks"])))


def read_task_list(path) -> list[int]:
    return sorted(int(t) for t in read_json(path)["tasks"])


def describe_inputs(inputs: list) -> list[dict]:
    """The record's `inputs`: shape and dtype of tensors, type and value of anything else."""
    import torch

    described = []
    for x in inputs:
        if isinstance(x, torch.Tensor):
            described.append({"shape": list(x.shape), "dtype": str(x.dtype).removeprefix("torch.")})
        elif isinstance(x, bool | int | float | str) or x is None:
            described.append({"type": type(x).__name__, "value": x})
        else:
            described.append({"type": type(x).__name__, "value": None})
    return described


def check_tasks_at_checkout(settings: dict, checkout, record, config: dict) -> None:
    """Refuse unknown survey.tasks (or a survey.level the checkout lacks) before any job when
    the checkout of the configured commit is already there (its record names that commit);
    otherwise leave it to write_task_list."""
    record = Path(record)
    if not record.is_file() or not Path(checkout).is_dir():
        return
    try:
        pinned = read_json(record)
    except ValueError:
        return
    if pinned.get("commit") != config["kernelbench"]["commit"]:
        return
    level = settings.get("level", 2)
    try:
        available = level_tasks(checkout, level)
    except KbfuseError as exc:
        raise KbfuseError(f"config key survey.level: {level}: {exc}") from None
    if settings["tasks"] != "all":
        configured_tasks(settings, available)
