"""The survey's tables: every per-task record of each numerics mode read, rows built, written.

Input: the `survey_task` records (docs/contracts.md, "Survey") of one or both numerics modes
of one KernelBench level, the pinned KernelBench checkout for the anchor timings
(`kbfuse.survey.anchor`) and each task's memory floor (`kbfuse.survey.floor`), and the env
fingerprint for the copy bandwidth. Output, under one directory, each table as CSV (every
digit) and Markdown:

- `survey_<mode>`: one row per task, sorted by the time spent outside library kernels in the
  best compiled baseline (largest first): the time of every baseline and whether it passes
  the official check (`<baseline>_official`), the best compiled one (the fastest compiled
  baseline that passes the official check: a faster one that fails it is no baseline) and
  its build seconds, its library kernel time (`kbfuse.survey.classify`), the time outside it
  (ms, %, and its q1-q3 spread) and its parts, the memory floor, the headroom and the
  realistic and upper-bound ceilings (`kbfuse.survey.headroom`), the main op's FLOP/s achieved
  by the library kernels against the GPU's peak (`kbfuse.survey.peaks`), `rank_safe` (this
  row's spread overlaps neither neighbour's), the blind-spot and nondeterminism flags, and
  KernelBench's anchor timings;
- `where_to_fuse_<mode>`: the 15 tasks with most headroom (`kbfuse.survey.headroom`);
- `failures`: every baseline that could not be built, checked, timed or profiled, and every
  one that fails the official check (stage `official check`: how many trials, the largest
  error, the pinned tolerance);
- `unclassified`: kernel names no pattern matches, with where they ran;
- `categories`: per task, the kernel time per category of eager and of the best compiled
  baseline (the plots' data);
- `tf32`: strict against kernelbench-defaults per task, when both modes were surveyed.

Times of one task use one method for every baseline, so that they can be ranked: CUDA-graph
replay when every timed baseline has it, else CUDA events, else (CPU) wall clock. The anchor
comparison uses the cold-L2 figure when there is one (KernelBench times with the cache
flushed). Nothing is guessed: a value that cannot be computed is blank and `notes` says why.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from kbfuse.errors import KbfuseError
from kbfuse.results import records
from kbfuse.survey import anchor as anchors
from kbfuse.survey import classify, headroom, peaks

KIND = "survey_task"
MODES = ("strict", "kernelbench-defaults")
BASELINE_ORDER = ("eager", "torchscript", "inductor", "inductor-max-autotune-no-cudagraphs")
METHOD_PREFERENCE = ("graph", "events", "wall")
COLD = "cold_l2"
BEST = "best compiled"

TABLES = {
    "failures": "every baseline that failed a stage or fails the official check: task, "
    "numerics, baseline, stage, error, message",
    "unclassified": "kernel names that no classifier pattern matches, and where they ran",
    "categories": "kernel time per category of eager and the best compiled baseline, per task",
}
TF32_TABLE = "tf32"
PLOTS = ("where_to_fuse", "time_split", "speedup_vs_outside")


# ---------------------------------------------------------------- layout (no pandas)


def main_table(mode: str) -> str:
    return f"survey_{mode}"


def where_table(mode: str) -> str:
    return f"where_to_fuse_{mode}"


def table_names(modes: Sequence[str]) -> list[str]:
    names = [t for m in modes for t in (main_table(m), where_table(m))] + list(TABLES)
    if all(m in modes for m in MODES):
        names.append(TF32_TABLE)
    return names


def summary_outputs(modes: Sequence[str]) -> list[str]:
    """File names (relative to the summary directory) that write_survey_summary writes."""
    names = [f"{t}.{ext}" for t in table_names(modes) for ext in ("csv", "md")]
    return names + [f"{plot}_{mode}.png" for mode in modes for plot in PLOTS]


def caption_name(output: str) -> str:
    """The caption file in workflow/report/ of one summary output (table or plot)."""
    stem = Path(output).name.split(".")[0]
    for mode in MODES:
        stem = stem.removesuffix(f"_{mode}")
    return f"{'survey_main' if stem == 'survey' else 'survey_' + stem}.rst"


def records_by_mode(paths: Iterable[str | Path], modes: Sequence[str]) -> dict[str, list[str]]:
    """The record files grouped by numerics mode, read from their paths
    (.../survey/{mode}/tasks/{task}.json, as the survey rules write them); every mode present,
    a path of no configured mode refused."""
    grouped: dict[str, list[str]] = {m: [] for m in modes}
    for path in map(str, paths):
        parts = Path(path).parts
        mode = parts[-3] if len(parts) >= 3 and parts[-2] == "tasks" else None
        if mode not in grouped:
            raise KbfuseError(
                f"survey record {path} is not under survey/<mode>/tasks/ of a "
                f"configured mode {list(modes)}"
            )
        grouped[mode].append(path)
    return grouped


# ---------------------------------------------------------------- reading


def read_task_record(path: str | Path) -> dict:
    """One record, parsed strictly; checked against its schema when the package has it, and
    for the fields this module reads in any case."""
    data = records.parse_json(records.read_limited(path), str(path))
    if not isinstance(data, Mapping) or data.get("kind") != KIND:
        raise KbfuseError(f"{path}: field kind is not {KIND!r}")
    if KIND in records.SCHEMA_KINDS:
        records.validate_record(data, KIND, str(path))
    for key, kind in (("task", int), ("file", str), ("baselines", Mapping), ("numerics", Mapping)):
        if not isinstance(data.get(key), kind) or isinstance(data.get(key), bool):
            raise KbfuseError(f"{path}: field {key} is {data.get(key)!r}")
    return dict(data)


def read_mode(paths: Iterable[str | Path], mode: str) -> list[dict]:
    """The records of one numerics mode, by task; a record of another mode or a repeated task
    is refused (it would silently replace or mix rows)."""
    found: dict[int, dict] = {}
    for path in paths:
        rec = read_task_record(path)
        if rec["numerics"].get("mode") != mode:
            raise KbfuseError(
                f"{path}: field numerics.mode is {rec['numerics'].get('mode')!r}, expected {mode!r}"
            )
        if rec["task"] in found:
            raise KbfuseError(f"{path}: task {rec['task']} appears twice in mode {mode}")
        found[rec["task"]] = rec
    return [found[t] for t in sorted(found)]


# ---------------------------------------------------------------- per task


def ok_baselines(rec: Mapping) -> dict[str, dict]:
    return {
        n: b for n, b in rec["baselines"].items() if b.get("status") == "ok" and b.get("timing")
    }


def task_method(rec: Mapping) -> str | None:
    """The first method of METHOD_PREFERENCE that every timed baseline of the task has."""
    timed = ok_baselines(rec)
    for method in METHOD_PREFERENCE:
        if timed and all(b["timing"].get(method) for b in timed.values()):
            return method
    return None


def stats_of(rec: Mapping, baseline: str, method: str | None) -> dict | None:
    b = ok_baselines(rec).get(baseline)
    return b["timing"].get(method) if b and method else None


def official_pass(entry: Mapping) -> bool | None:
    """Did a baseline pass the official check against eager (None: never checked)?"""
    correctness = entry.get("correctness")
    return None if not correctness else correctness.get("official_pass") is True


def best_compiled(rec: Mapping, method: str | None) -> str | None:
    """The compiled (non-eager) baseline with the lowest median in the task's method, among
    those that pass the official check."""
    timed = {
        n: stats_of(rec, n, method)
        for n, b in ok_baselines(rec).items()
        if n != "eager" and official_pass(b)
    }
    timed = {n: s for n, s in timed.items() if s}
    return min(timed, key=lambda n: timed[n]["median_ms"]) if timed else None


def kernel_ms(kernels: Iterable[Mapping] | None) -> dict[str, float] | None:
    if kernels is None:
        return None
    return {c: us / 1000.0 for c, us in classify.time_by_category(kernels).items()}


def main_op(rec: Mapping) -> tuple[str | None, int | None]:
    """The op with most FLOPs (the record's `main_op` when it names one) and its FLOPs."""
    flops = rec.get("flops") or {}
    by_op = flops.get("by_op") or {}
    if not by_op:
        return None, None
    op = flops.get("main_op") or max(by_op, key=lambda k: by_op[k])
    return op, int(by_op[op]) if op in by_op else None


def _median(stats: Mapping | None) -> float | None:
    return float(stats["median_ms"]) if stats else None


def _div(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def library_rate(rec: Mapping, library_ms: float | None, notes: list[str]) -> dict[str, Any]:
    """The main op's FLOP/s over the library kernels' time, against the device's peak."""
    op, flops = main_op(rec)
    env, num = rec.get("environment") or {}, rec["numerics"]
    peak = peaks.peak_for(env.get("device_name"))
    tf32 = peaks.uses_tf32(op, bool(num.get("matmul_tf32")), bool(num.get("cudnn_tf32")))
    tflops = _div(flops / 1e12 if flops else None, library_ms / 1e3 if library_ms else None)
    peak_tflops = None
    if peak is None:
        notes.append(f"no peak for device {env.get('device_name')!r}")
    else:
        peak_tflops = peak.tf32_tflops if tf32 else peak.fp32_tflops
    return {
        "main_op": op,
        "main_op_flops": flops,
        "library_tflops": tflops,
        "peak_kind": "tf32" if tf32 else "fp32",
        "peak_tflops": peak_tflops,
        "pct_of_peak": None if tflops is None or not peak_tflops else 100 * tflops / peak_tflops,
    }


def outside_fields(best: dict | None, library_ms: float | None, notes: list[str]) -> dict:
    """Time outside library kernels (best compiled time - library kernel time), its spread
    and share."""
    if best is None or library_ms is None:
        return dict.fromkeys(("outside_ms", "outside_q1_ms", "outside_q3_ms", "outside_pct"))
    median = best["median_ms"]
    if library_ms > median:
        notes.append("library kernels take longer in the profile than the timed forward")
    if library_ms == 0:
        notes.append("no library kernel: no ceiling")
    return {
        "outside_ms": median - library_ms,
        "outside_q1_ms": best["q1_ms"] - library_ms,
        "outside_q3_ms": best["q3_ms"] - library_ms,
        "outside_pct": 100 * (median - library_ms) / median,
    }


def anchor_fields(rec: Mapping, method: str | None, anchor: Mapping | None) -> dict:
    """KernelBench's anchor beside our eager and Inductor figures (cold L2 when measured)."""
    if anchor is None:
        return {**anchors.compare({"baselines": {}}, rec["file"], {}), "anchor_method": None}
    ours, used = {}, set()
    for baseline in anchors.FILES:
        cold = stats_of(rec, baseline, COLD)
        ours[baseline] = _median(cold or stats_of(rec, baseline, method))
        used.add(COLD if cold else method)
    row = anchors.compare(anchor, rec["file"], ours)
    row["anchor_method"] = "/".join(sorted(m for m in used if m))
    return row


def task_row(
    rec: Mapping,
    baselines: Sequence[str],
    anchor: Mapping | None,
    floor: tuple[Mapping | None, str | None] | None = None,
    copy: Mapping | None = None,
) -> dict[str, Any]:
    """One row of the main table (without rank_safe, which needs the neighbours); `floor`:
    the task's memory floor and why it has none (kbfuse.survey.floor.record_floor), `copy`:
    the copy bandwidth of the GPU (kbfuse.survey.headroom.read_copy_bandwidth)."""
    notes: list[str] = []
    method = task_method(rec)
    best = best_compiled(rec, method)
    best_stats = stats_of(rec, best, method) if best else None
    best_entry = rec["baselines"][best] if best else None
    cats = kernel_ms(best_entry.get("kernels")) if best else None
    library_ms = cats[classify.LIBRARY] if cats else None
    if best and cats is None:
        notes.append(f"no kernel profile of {best}")
    missing = [n for n, b in ok_baselines(rec).items() if (b["timing"].get("graph_missing"))]
    if missing:
        notes.append("no CUDA graph: " + ", ".join(missing))
    failed = [n for n, b in rec["baselines"].items() if b.get("status") != "ok"]
    if failed:
        notes.append("failed: " + ", ".join(failed))
    wrong = [n for n, b in rec["baselines"].items() if official_pass(b) is False]
    if wrong:
        notes.append("fails the official check: " + ", ".join(wrong))
    row: dict[str, Any] = {"task": rec["task"], "file": rec["file"]}
    row |= {f"{b}_ms": _median(stats_of(rec, b, method)) for b in baselines}
    row |= {
        f"{b}_official": official_pass(rec["baselines"].get(b) or {})
        for b in baselines
        if b != "eager"
    }
    row |= {
        "method": method,
        "best_compiled": best,
        "best_build_s": cold_build_s(best_entry) if best_entry else None,
        "best_ms": _median(best_stats),
        "best_q1_ms": best_stats["q1_ms"] if best_stats else None,
        "best_q3_ms": best_stats["q3_ms"] if best_stats else None,
        "library_ms": library_ms,
    }
    outside = outside_fields(best_stats, library_ms, notes)
    row |= outside
    row |= headroom.breakdown(best_entry, notes)
    row |= headroom.floor_fields(rec, outside, library_ms, row["best_ms"], floor, copy, notes)
    row["rank_safe"] = None  # set by rank_rows, which sees the neighbours
    row |= library_rate(rec, library_ms, notes)
    row |= {
        "blind_spot": bool(rec.get("blind_spot")),
        "nondeterministic": (rec.get("determinism") or {}).get("verdict") == "nondeterministic",
    }
    row |= anchor_fields(rec, method, anchor)
    row["notes"] = "; ".join(notes)
    return row


# ---------------------------------------------------------------- tables


def _nan_last_desc(value: float | None) -> tuple[int, float]:
    return (1, 0.0) if value is None or math.isnan(value) else (0, -value)


def _overlap(a: Mapping, b: Mapping) -> bool:
    return a["outside_q1_ms"] <= b["outside_q3_ms"] and b["outside_q1_ms"] <= a["outside_q3_ms"]


def rank_rows(rows: list[dict]) -> list[dict]:
    """Rows sorted by outside_ms (largest first, unknown last), each with `rank_safe`: its
    q1-q3 spread overlaps neither neighbour's (blank when its outside time is unknown)."""
    rows = sorted(rows, key=lambda r: (_nan_last_desc(r["outside_ms"]), r["task"]))
    known = [r for r in rows if r["outside_ms"] is not None]
    for i, row in enumerate(known):
        neighbours = known[max(i - 1, 0) : i] + known[i + 1 : i + 2]
        row["rank_safe"] = not any(_overlap(row, n) for n in neighbours)
    return rows


def baselines_of(recs: Iterable[Mapping]) -> list[str]:
    seen = {b for rec in recs for b in rec["baselines"]}
    return [b for b in BASELINE_ORDER if b in seen] + sorted(seen - set(BASELINE_ORDER))


def main_rows(
    recs: Sequence[Mapping],
    anchor: Mapping | None,
    floors: Mapping[int, tuple] | None = None,
    copy: Mapping | None = None,
) -> list[dict]:
    """The main table's rows of one mode; `floors`: task -> (floor, why none) (None: no
    checkout, so no floor), `copy`: the GPU's copy bandwidth (None: no fingerprint)."""
    baselines = baselines_of(recs)
    return rank_rows(
        [task_row(rec, baselines, anchor, (floors or {}).get(rec["task"]), copy) for rec in recs]
    )


def task_floors(checkout: str | Path, recs: Iterable[Mapping]) -> dict[int, tuple]:
    """task -> (floor, why none) for every task of the records (one floor per task, whatever
    the mode: the shapes do not depend on it)."""
    from kbfuse.survey import floor

    found: dict[int, tuple] = {}
    for rec in recs:
        if rec["task"] not in found:
            found[rec["task"]] = floor.record_floor(checkout, rec)
    return found


def recorded_floors(floor_files: Iterable[str | Path], recs: Iterable[Mapping]) -> dict:
    """task -> (floor, why none) for every task of the records, from the `survey_floor`
    records (kbfuse.survey.floor.floor_record), each used only for the records of its task's
    level, file (by sha256) and semantics."""
    from kbfuse.survey import floor

    by_task = {}
    for path in floor_files:
        found = records.read_record(path, floor.KIND)
        by_task[found["task"]] = found
    floors: dict[int, tuple] = {}
    for rec in recs:
        if rec["task"] not in floors:
            floors[rec["task"]] = _matched_floor(by_task.get(rec["task"]), rec)
    return floors


def _matched_floor(found: Mapping | None, rec: Mapping) -> tuple:
    semantics = rec.get("semantics", "kernelbench")
    if found is None:
        return None, "no floor: no floor record of the task"
    if (found["level"], found["sha256"]) != (rec.get("level", 2), rec["sha256"]):
        return None, f"no floor: the floor record is of another file than {rec['file']}"
    if found["semantics"] != semantics:
        why = f"the floor record's semantics is {found['semantics']}, the record's {semantics}"
        return None, f"no floor: {why}"
    return found["floor"], found["problem"]


OFFICIAL_FAILURE = "official check"


def official_failure(correctness: Mapping) -> dict:
    """A baseline's failed official check as a failures-table entry."""
    failed, trials = len(correctness.get("failed_trials") or []), correctness.get("trials")
    return {
        "stage": OFFICIAL_FAILURE,
        "error": "not close to eager",
        "message": (
            f"fails {failed} of {trials} official trials: max abs error "
            f"{correctness.get('max_abs')}, max rel {correctness.get('max_rel')} "
            f"(atol {correctness.get('atol')}, rtol {correctness.get('rtol')})"
        ),
    }


def failure_rows(by_mode: Mapping[str, Sequence[Mapping]]) -> list[dict]:
    """Every baseline that failed a stage, or that ran but fails the official check."""
    rows = []
    for mode, recs in by_mode.items():
        for rec in recs:
            for name, b in rec["baselines"].items():
                if b.get("status") != "ok":
                    failure = b.get("failure") or {}
                elif official_pass(b) is False:
                    failure = official_failure(b["correctness"])
                else:
                    continue
                rows.append(
                    {
                        "task": rec["task"],
                        "file": rec["file"],
                        "numerics": mode,
                        "baseline": name,
                        "stage": failure.get("stage"),
                        "error": failure.get("error"),
                        "message": failure.get("message"),
                    }
                )
    return rows


def unclassified_rows(by_mode: Mapping[str, Sequence[Mapping]]) -> list[dict]:
    """One row per unclassified kernel name: where it ran and its summed device time."""
    found: dict[str, dict] = {}
    for mode, recs in by_mode.items():
        for rec in recs:
            for name, b in rec["baselines"].items():
                for k in classify.unclassified(b.get("kernels") or []):
                    row = found.setdefault(
                        k["name"], {"kernel": k["name"], "where": [], "device_us": 0.0, "calls": 0}
                    )
                    row["where"].append(f"{mode}/{rec['task']}/{name}")
                    row["device_us"] += float(k["device_us"])
                    row["calls"] += int(k.get("calls") or 0)
    rows = sorted(found.values(), key=lambda r: -r["device_us"])
    return [{**r, "where": ", ".join(r["where"])} for r in rows]


def category_rows(by_mode: Mapping[str, Sequence[Mapping]]) -> list[dict]:
    """Per task and mode: kernel ms per category of eager and of the best compiled baseline."""
    rows = []
    for mode, recs in by_mode.items():
        for rec in recs:
            best = best_compiled(rec, task_method(rec))
            for role, name in (("eager", "eager"), (BEST, best)):
                b = rec["baselines"].get(name) if name else None
                cats = kernel_ms(b.get("kernels")) if b and b.get("status") == "ok" else None
                if cats is None:
                    continue
                rows.append(
                    {
                        "task": rec["task"],
                        "numerics": mode,
                        "role": role,
                        "baseline": name,
                        **{f"{c}_ms": v for c, v in cats.items()},
                    }
                )
    return rows


def tf32_rows(by_mode: Mapping[str, Sequence[Mapping]]) -> list[dict]:
    """Per task surveyed in both modes: eager and best compiled, strict over defaults."""
    strict = {r["task"]: r for r in by_mode.get(MODES[0], [])}
    defaults = {r["task"]: r for r in by_mode.get(MODES[1], [])}
    rows = []
    for task in sorted(set(strict) & set(defaults)):
        row: dict[str, Any] = {
            "task": task,
            "file": strict[task]["file"],
            "main_op": main_op(strict[task])[0],
        }
        for label, rec in (("strict", strict[task]), ("defaults", defaults[task])):
            method = task_method(rec)
            best = best_compiled(rec, method)
            row[f"eager_ms_{label}"] = _median(stats_of(rec, "eager", method))
            row[f"best_compiled_{label}"] = best
            row[f"best_ms_{label}"] = _median(stats_of(rec, best, method)) if best else None
        row["eager_strict_over_defaults"] = _div(row["eager_ms_strict"], row["eager_ms_defaults"])
        row["best_strict_over_defaults"] = _div(row["best_ms_strict"], row["best_ms_defaults"])
        rows.append(row)
    return rows


FAILURE_COLUMNS = ["task", "file", "numerics", "baseline", "stage", "error", "message"]
UNCLASSIFIED_COLUMNS = ["kernel", "where", "device_us", "calls"]
CATEGORY_COLUMNS = ["task", "numerics", "role", "baseline"] + [
    f"{c}_ms" for c in (*classify.CATEGORIES, classify.UNCLASSIFIED)
]


def _frame(rows: list[dict], columns: list[str] | None = None):
    """A DataFrame of the rows; `columns` names them when there may be none (empty tables
    keep their header)."""
    import pandas as pd

    return pd.DataFrame(rows, columns=columns)


def cold_build_s(entry: dict) -> float | None:
    """A baseline's compile from cold caches: max-autotune's warm-up build (beside other jobs,
    with its benchmarks) where it had one, since its build alone reuses the warm-up's kernels;
    else its build."""
    warm = entry.get("warm_build_s")
    return warm if warm is not None else entry.get("build_s")


def build_survey_tables(
    by_mode: Mapping[str, Sequence[Mapping]],
    anchor: Mapping | None,
    floors: Mapping[int, tuple] | None = None,
    copy: Mapping | None = None,
) -> dict[str, Any]:
    """table name -> DataFrame, in the order of table_names(modes)."""
    tables = {}
    for mode, recs in by_mode.items():
        rows = main_rows(recs, anchor, floors, copy)
        tables[main_table(mode)] = _frame(rows)
        tables[where_table(mode)] = _frame(headroom.where_rows(rows), headroom.WHERE_COLUMNS)
    tables["failures"] = _frame(failure_rows(by_mode), FAILURE_COLUMNS)
    tables["unclassified"] = _frame(unclassified_rows(by_mode), UNCLASSIFIED_COLUMNS)
    tables["categories"] = _frame(category_rows(by_mode), CATEGORY_COLUMNS)
    if all(m in by_mode for m in MODES):
        tables[TF32_TABLE] = _frame(tf32_rows(by_mode))
    return tables


COMPARED = ["best_compiled", "best_ms", "library_ms", "outside_ms", "outside_pct", "blind_spot"]


def survey_rows_of(results_dir: str | Path) -> Any:
    """The main table's rows of every mode found under results_dir/survey (a numerics column
    first; no anchor), for comparing two runs; no rows (but the columns) without a survey."""
    root = Path(results_dir)
    rows = []
    for mode in MODES:
        paths = sorted(records.inside(root, f"survey/{mode}/tasks").glob("*.json"))
        rows += [{"numerics": mode, **row} for row in main_rows(read_mode(paths, mode), None)]
    return _frame(rows, None if rows else ["numerics", "task", *COMPARED])


def survey_level(recs: Iterable[Mapping]) -> int:
    """The one KernelBench level of the records (2 when there are none); records of several
    levels are refused (their task numbers would clash)."""
    levels = sorted({int(rec.get("level", 2)) for rec in recs})
    if len(levels) > 1:
        raise KbfuseError(f"survey records of levels {levels} in one summary: one level each")
    return levels[0] if levels else 2


def write_survey_summary(
    record_files: Mapping[str, Sequence[str | Path]],
    checkout: str | Path | None,
    outdir: str | Path,
    hardware: str = anchors.DEFAULT_HARDWARE,
    fingerprint: str | Path | None = None,
    floor_files: Sequence[str | Path] | None = None,
) -> list[Path]:
    """Read every record (mode -> paths), build every table and plot, write them to outdir
    (all or nothing: nothing appears before every file is complete); return the paths. The
    pinned `checkout` gives the anchor and each task's memory floor (found here, unless
    `floor_files`, the tasks' `survey_floor` records, hold them), the env `fingerprint` the
    copy bandwidth the floor is divided by (either may be None: those cells stay blank)."""
    from kbfuse.results.summary import write_table
    from kbfuse.survey import plots

    unknown = [m for m in record_files if m not in MODES]
    if unknown:
        raise KbfuseError(f"survey numerics mode {unknown[0]!r} is not one of {list(MODES)}")
    by_mode = {m: read_mode(paths, m) for m, paths in record_files.items()}
    every = [rec for recs in by_mode.values() for rec in recs]
    files = sorted({rec["file"] for rec in every})
    level = survey_level(every)
    anchor = anchors.read_anchor(checkout, files, hardware, level) if checkout else None
    if floor_files is not None:
        floors = recorded_floors(floor_files, every)
    else:
        floors = task_floors(checkout, every) if checkout else None
    copy = headroom.read_copy_bandwidth(fingerprint)
    tables = build_survey_tables(by_mode, anchor, floors, copy)
    written: list[Path] = []
    with records.staged(outdir) as stage:
        for name, df in tables.items():
            written += write_table(df, stage, name)
        for mode in by_mode:
            written += plots.write_plots(
                tables[main_table(mode)], tables["categories"], mode, stage,
                tables[where_table(mode)],
            )  # fmt: skip
    return [Path(outdir) / p.name for p in written]
