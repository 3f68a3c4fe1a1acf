"""What the survey predicted for a fused tail, beside what the second study measured.

The survey (kbfuse.survey, its committed summary tables) measured, per task and numerics mode,
the strongest compiled baseline and how its time splits: library kernels (cuBLAS/cuDNN) and
everything outside them. A perfect fused tail leaves the library time and adds only the bytes
the tail must move at the measured copy bandwidth (its *memory floor*), so the survey's
prediction of the fused program's end-to-end time is

    predicted_ms = library_ms (survey, best compiled, the study's numerics mode)
                   + floor_ms (the tail's bytes / this run's copy bandwidth)

and of its speedup, the survey's best compiled time over that. Beside it, from this run's
timing record (CUDA-graph replay, whole program): each variant's median, the strongest compiled
baseline that passed correctness and was timed here (the fastest median among the timed
baselines other than eager, whichever are configured), their ratio, and the tail alone
against its copy floor (floor / tail median). The issue's targets are read off those columns:
at least 1.3x over the strongest compiled baseline, a pointwise tail at 85 % of its floor or
more; a row says which it meets.

The survey summary folder is the config's `survey_summary` (the committed H200 reference's by
default); its `survey_<mode>.csv` is read with the standard library, each number checked. The
rows a study uses are copied into its results (`write_survey_rows`: the record
`prediction/survey_rows.json`, with the sha256 of each table read), so that its summary, its
manifest and its bundle hold what the prediction was made from.
"""

from __future__ import annotations

import csv
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kbfuse.errors import KbfuseError
from kbfuse.io import sha256_file, write_json

SURVEY_COLUMNS = ("task", "best_compiled", "best_ms", "library_ms", "outside_ms")
METHOD = "graph"
TARGET_SPEEDUP = 1.3
TARGET_PCT_OF_FLOOR = 85.0


def survey_table(folder: str | Path, mode: str) -> Path:
    """The survey summary table of numerics mode `mode` in `folder`."""
    return Path(folder) / f"survey_{mode}.csv"


def read_survey_rows(folder: str | Path, mode: str) -> dict[int, dict | None]:
    """task -> {best_compiled, best_ms, library_ms, outside_ms} of the survey's table of
    `mode`, None for a task with no best compiled baseline (every compiled baseline fails the
    official check, or none was timed: its cells are blank); KbfuseError naming the file and
    the problem."""
    path = survey_table(folder, mode)
    if not path.is_file():
        raise KbfuseError(
            f"survey summary {path} is missing (config key survey_summary names the survey's "
            "summary folder, e.g. results/reference/h200/survey/survey/summary)"
        )
    with open(path, newline="", encoding="utf-8") as fh:
        reader = csv.DictReader(fh)
        missing = [c for c in SURVEY_COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise KbfuseError(f"survey summary {path} lacks column(s) {missing}")
        rows = {}
        for line, row in enumerate(reader, start=2):
            try:
                task = int(row["task"])
                if not row["best_compiled"]:
                    rows[task] = None
                    continue
                rows[task] = {
                    "best_compiled": row["best_compiled"],
                    **{key: _positive(row[key]) for key in ("best_ms", "library_ms")},
                    "outside_ms": float(row["outside_ms"]),
                }
            except (TypeError, ValueError) as exc:
                raise KbfuseError(f"survey summary {path} line {line}: {exc}") from None
    return rows


def survey_rows(config: Mapping[str, Any]) -> dict[int, dict]:
    """The survey's row of each of a study's tasks, in the numerics mode the study runs it in
    (strict where it names none), with that mode as `numerics`; KbfuseError naming a task
    the survey has no row for."""
    from kbfuse.workflow.studies import numerics_for

    folder = config["survey_summary"]
    found = {}
    for task in config["tasks"]:
        mode = numerics_for(config, task) or "strict"
        rows = read_survey_rows(folder, mode)
        if int(task) not in rows:
            raise KbfuseError(f"survey summary {survey_table(folder, mode)} has no row for {task}")
        if rows[int(task)] is None:
            raise KbfuseError(
                f"survey summary {survey_table(folder, mode)}: task {task} has no best compiled "
                "baseline (none passes the official check), so no prediction"
            )
        found[int(task)] = {**rows[int(task)], "numerics": mode}
    return found


def write_survey_rows(config: Mapping[str, Any], out: str | os.PathLike) -> dict:
    """Write the `survey_rows` record of a study: its tasks' survey rows and the tables
    (file, sha256) they were read from."""
    rows = survey_rows(config)
    modes = dict.fromkeys(row["numerics"] for row in rows.values())
    tables = {}
    for mode in modes:
        path = survey_table(config["survey_summary"], mode)
        tables[mode] = {"file": path.name, "sha256": sha256_file(path)}
    record = {
        "kind": "survey_rows",
        "schema_version": 1,
        "tables": tables,
        "rows": {str(task): row for task, row in rows.items()},
    }
    write_json(out, record)
    return record


def _positive(text: str) -> float:
    value = float(text)
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{text!r} is not a positive time")
    return value


def strongest_compiled(measurements: Mapping[str, Mapping], baselines: list[str]) -> str | None:
    """The baseline other than eager with the smallest median among `baselines` (the timed
    baselines, whichever are configured); None when none of them was timed."""
    compiled = [name for name in baselines if name != "eager" and name in measurements]
    if not compiled:
        return None
    return min(compiled, key=lambda name: (measurements[name]["median_ms"], name))


def prediction_rows(
    task: int,
    mode: str,
    survey_row: Mapping[str, Any],
    timing: Mapping[str, Any],
    variants: list[str],
    gbps: float,
) -> list[dict]:
    """One row per timed variant of `task` (see the module docstring)."""
    floor_ms = int(timing["tail_bytes"]) / (gbps * 1e9) * 1e3
    predicted_ms = survey_row["library_ms"] + floor_ms
    full = timing["measurements"][f"full/{METHOD}"]
    tail = timing["measurements"][f"tail/{METHOD}"]
    baselines = [name for name in timing["timed"] if name not in variants]
    best = strongest_compiled(full, baselines)
    rows = []
    for variant in [v for v in variants if v in full]:
        median = float(full[variant]["median_ms"])
        best_ms = float(full[best]["median_ms"]) if best else math.nan
        paired = (timing.get("ratios", {}).get(f"full/{METHOD}", {}).get(variant) or {}).get(
            f"vs_{best}"
        )
        speedup = best_ms / median
        pct = 100.0 * floor_ms / float(tail[variant]["median_ms"])
        rows.append(
            {
                "task": task,
                "numerics": mode,
                "variant": variant,
                "survey_best_compiled": survey_row["best_compiled"],
                "survey_best_ms": survey_row["best_ms"],
                "survey_library_ms": survey_row["library_ms"],
                "survey_outside_ms": survey_row["outside_ms"],
                "floor_ms": floor_ms,
                "predicted_ms": predicted_ms,
                "predicted_speedup": survey_row["best_ms"] / predicted_ms,
                "fused_ms": median,
                "best_compiled": best,
                "best_compiled_ms": best_ms,
                "speedup_vs_best_compiled": speedup,
                "paired_speedup_vs_best_compiled": float(paired["median"]) if paired else math.nan,
                "fused_over_predicted": median / predicted_ms,
                "tail_ms": float(tail[variant]["median_ms"]),
                "tail_pct_of_floor": pct,
                "meets_speedup_target": bool(speedup >= TARGET_SPEEDUP),
                "meets_floor_target": bool(pct >= TARGET_PCT_OF_FLOOR),
            }
        )
    return rows
