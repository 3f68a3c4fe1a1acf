"""What a check is asked to do: the task a candidate claims, and the `check:` settings.

The task is named `LEVEL/TASK` ("2/53"), on the command line (`--task 2/53`) or, for a folder
of candidates, in the candidate file itself: a line `# kbfuse-task: 2/53` among its first
five lines (the Snakemake rule reads it; one task per file, no guessing from file names).
The folder is scanned at every Snakemake start (`scan_folder`), so within bounds: regular
files only (a FIFO or a link to /dev/zero is named, never opened), the head of each file
only, names that can name a job and its files.

Settings (config key `check:`, every key optional, defaults in DEFAULTS) are checked here,
each bad value named by key, before any child process starts.
"""

from __future__ import annotations

import copy
import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kbfuse import untrusted
from kbfuse.errors import KbfuseError
from kbfuse.timing.measure import int_at_least

TASK_LINE = re.compile(r"^#\s*kbfuse-task:\s*(\S+)\s*$")
TASK_LINE_SEARCH = 5
HEAD_BYTES = 64 << 10  # the task line is looked for in this much of the file's start
CANDIDATE_BYTES = 16 << 20  # a candidate file larger than this is refused
MAX_NAME = 100
CANDIDATE_NAME = re.compile(rf"[A-Za-z0-9][A-Za-z0-9_.-]{{0,{MAX_NAME - 1}}}")
MAX_CANDIDATES = 10_000
BASELINES = ("eager", "torchscript", "inductor")
LEVELS = (2,)
# kbfuse.tasks.inputs.DISTRIBUTIONS, restated so that reading the settings (at every Snakemake
# start) never imports torch; tests/test_check_units.py keeps the two equal.
DISTRIBUTIONS = ("uniform", "normal", "uniform_x100", "uniform_xneg100")
# kbfuse.survey.settings.NUMERICS's modes (TF32 off everywhere, or PyTorch's defaults set
# explicitly), restated for the same reason
NUMERICS = ("strict", "kernelbench-defaults")

# Upper bounds of the counts and limits (the config schema holds the same): a value past one
# is a mistake, and would make a check run for ever or ask for more than any machine has.
MAXIMA = {
    "time_limit_s": 86400,
    "memory_limit_mb": 1 << 20,
    "official_trials": 1000,
    "seeds": 1000,
    "timing.warmup": 1000,
    "timing.rounds": 10000,
    "timing.invocations_per_pair": 100000,
}
DEFAULTS: dict[str, Any] = {
    "folder": "tests/candidates",
    "in_manifest": False,
    "unsandboxed": False,
    "witness_cache": "results/check/witness-cache",
    "time_limit_s": 600.0,
    "memory_limit_mb": 32768,
    "gpu_memory_fraction": 0.5,
    "official_trials": None,  # None: the pinned evaluator's (kbfuse.tasks.evaluator)
    "seed": None,
    "seeds": [0, 1],
    "distributions": ["uniform", "normal", "uniform_x100", "uniform_xneg100"],
    "baselines": list(BASELINES),
    "numerics": None,  # None: PyTorch's defaults as found; else a mode of NUMERICS
    "timing": {
        "warmup": 3,
        "rounds": 20,
        "invocations_per_pair": 10,
        "order_seed": 913,
        "cold_l2": True,
        "graph": True,
        # None: every block runs `rounds`; a number: rounds sized from the measured spread
        # (kbfuse.candidates.timing)
        "spread": None,
    },
}


def parse_task(text: Any, where: str = "--task") -> tuple[int, int]:
    """(level, task) from "2/53"; KbfuseError naming `where` and the value otherwise."""
    match = re.fullmatch(r"(\d+)/(\d+)", str(text).strip()) if isinstance(text, str) else None
    if match is None:
        raise KbfuseError(f"{where} is {text!r}: write LEVEL/TASK, e.g. 2/53")
    level, task = int(match.group(1)), int(match.group(2))
    if level not in LEVELS:
        raise KbfuseError(f"{where} is {text!r}: level {level} is not checked (levels: {LEVELS})")
    if task < 1:
        raise KbfuseError(f"{where} is {text!r}: task numbers start at 1")
    return level, task


def task_of_file(path: str | Path) -> tuple[int, int]:
    """The `# kbfuse-task: L/T` line of a candidate file; KbfuseError when it has none, or when
    the file is not a regular file (a link to one is read; a FIFO, a device or a link to one
    is refused unopened) of at most CANDIDATE_BYTES."""
    st = untrusted.regular_file(path, follow=True)
    if st.st_size > CANDIDATE_BYTES:
        raise KbfuseError(f"{path} is {st.st_size} bytes, over {CANDIDATE_BYTES} for a candidate")
    head = untrusted.read_head(path, HEAD_BYTES, follow=True).decode("utf-8", errors="replace")
    for number, line in enumerate(head.splitlines()[:TASK_LINE_SEARCH], start=1):
        match = TASK_LINE.match(line.strip())
        if match:
            return parse_task(match.group(1), f"{path} line {number}")
    raise KbfuseError(
        f"{path} names no task: put a line '# kbfuse-task: 2/53' among its first "
        f"{TASK_LINE_SEARCH} lines"
    )


def candidate_name(path: Path) -> str:
    """The name of a candidate file (its stem), which names its job, its verdict and its
    logs; KbfuseError unless it is CANDIDATE_NAME (no wildcard or regex characters such as
    `[`, `+` or `{}`, and short enough for every file name made from it)."""
    if not CANDIDATE_NAME.fullmatch(path.stem):
        raise KbfuseError(
            f"candidate file {str(path)[:300]!r}: its name cannot name a job and its files: use "
            f"letters, digits, '_', '-' and '.', starting with a letter or digit, at most "
            f"{MAX_NAME} characters before .py"
        )
    return path.stem


def scan_folder(folder: str | Path) -> dict[str, tuple[int, int]]:
    """{candidate name: (level, task)} of every `*.py` of a check folder (see task_of_file
    and candidate_name), read within bounds: this runs at every Snakemake start."""
    found: dict[str, tuple[int, int]] = {}
    for count, path in enumerate(sorted(Path(folder).glob("*.py")), start=1):
        if count > MAX_CANDIDATES:
            raise KbfuseError(f"check folder {folder} holds more than {MAX_CANDIDATES} *.py files")
        found[candidate_name(path)] = task_of_file(path)
    return found


def _positive_number(value: Any, key: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise KbfuseError(f"{key} is {value!r}: it must be a finite number > 0")
    if value <= 0:
        raise KbfuseError(f"{key} is {value!r}: it must be a finite number > 0")
    return float(value)


def _at_most(value: float, key: str, what: str = "") -> None:
    """KbfuseError naming check.`key` when `value` (a count of `what`, when given) is over
    MAXIMA[key]."""
    if value > MAXIMA[key]:
        said = f"has {value} {what}" if what else f"is {value!r}"
        raise KbfuseError(f"check.{key} {said}: at most {MAXIMA[key]}")


def _merge(defaults: Mapping, given: Mapping, prefix: str) -> dict:
    unknown = sorted(set(given) - set(defaults))
    if unknown:
        raise KbfuseError(f"{prefix}.{unknown[0]} is not a setting; known: {sorted(defaults)}")
    merged = copy.deepcopy(dict(defaults))
    for key, value in given.items():
        if isinstance(defaults[key], dict):
            if not isinstance(value, Mapping):
                raise KbfuseError(f"{prefix}.{key} is {value!r}: it must be a mapping")
            merged[key] = _merge(defaults[key], value, f"{prefix}.{key}")
        else:
            merged[key] = value
    return merged


def check_settings(given: Mapping[str, Any] | None) -> dict:
    """The settings with defaults filled in; KbfuseError naming the first bad key and value."""
    if given is not None and not isinstance(given, Mapping):
        raise KbfuseError(f"check is {given!r}: it must be a mapping")
    s = _merge(DEFAULTS, given or {}, "check")
    if not isinstance(s["folder"], str) or not s["folder"] or set("{}") & set(s["folder"]):
        raise KbfuseError(f"check.folder is {s['folder']!r}: it must be a folder path (no braces)")
    if s["witness_cache"] is not None and not isinstance(s["witness_cache"], str):
        raise KbfuseError(f"check.witness_cache is {s['witness_cache']!r}: a folder or null")
    for key in ("in_manifest", "unsandboxed"):
        if not isinstance(s[key], bool):
            raise KbfuseError(f"check.{key} is {s[key]!r}: it must be true or false")
    _at_most(_positive_number(s["time_limit_s"], "check.time_limit_s"), "time_limit_s")
    _at_most(int_at_least(s["memory_limit_mb"], "check.memory_limit_mb", 64), "memory_limit_mb")
    fraction = _positive_number(s["gpu_memory_fraction"], "check.gpu_memory_fraction")
    if fraction > 1:
        raise KbfuseError(f"check.gpu_memory_fraction is {fraction!r}: it must be <= 1")
    if s["official_trials"] is not None:
        _at_most(int_at_least(s["official_trials"], "check.official_trials"), "official_trials")
    if s["seed"] is not None:
        int_at_least(s["seed"], "check.seed", 0)
    seeds = s["seeds"]
    if not isinstance(seeds, list) or not seeds:
        raise KbfuseError(f"check.seeds is {seeds!r}: it must be a non-empty list")
    _at_most(len(seeds), "seeds", "entries")
    for seed in seeds:
        int_at_least(seed, "check.seeds[]", 0)
    if not isinstance(s["distributions"], list) or not s["distributions"]:
        raise KbfuseError(f"check.distributions is {s['distributions']!r}: a non-empty list")
    for name in s["distributions"]:
        if name not in DISTRIBUTIONS:
            raise KbfuseError(
                f"check.distributions: unknown input distribution {name!r}; "
                f"known: {', '.join(DISTRIBUTIONS)}"
            )
    baselines = s["baselines"]
    if not isinstance(baselines, list) or "eager" not in baselines:
        raise KbfuseError(f"check.baselines is {baselines!r}: a list that includes eager")
    for name in baselines:
        if name not in BASELINES:
            raise KbfuseError(f"check.baselines names {name!r}; known: {list(BASELINES)}")
    if s["numerics"] is not None and s["numerics"] not in NUMERICS:
        raise KbfuseError(
            f"check.numerics is {s['numerics']!r}; known: {', '.join(NUMERICS)}, or null"
        )
    t = s["timing"]
    for key in ("warmup", "rounds", "invocations_per_pair"):
        _at_most(int_at_least(t[key], f"check.timing.{key}"), f"timing.{key}")
    int_at_least(t["order_seed"], "check.timing.order_seed", 0)
    for key in ("cold_l2", "graph"):
        if not isinstance(t[key], bool):
            raise KbfuseError(f"check.timing.{key} is {t[key]!r}: it must be true or false")
    spread = t["spread"]
    if spread is not None and (
        isinstance(spread, bool) or not isinstance(spread, (int, float)) or not 0 < spread < 1
    ):
        raise KbfuseError(
            f"check.timing.spread is {spread!r}: a fraction between 0 and 1 (the largest "
            "interquartile range over median that ends a block early), or null"
        )
    return s
