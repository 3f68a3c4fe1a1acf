"""The tail roofline: every implementation's CUDA-graph tail time against the copy floor.

A thin view over the summary's `timing_tail` table (`kbfuse.results.tables.timing_table`), built
from the timing job's output of each task alone (results/timing/{task}.json) plus the
measured copy bandwidth, so it can be read as soon as one timing job has finished, without
the rest of the study. For each implementation (eager, TorchScript, Inductor, every timed
kernel variant) one row: the CUDA-graph tail median, the tail's bytes moved, the copy floor
(bytes / measured device-to-device copy bandwidth, the summary's `floor_ms`), the % of that
floor the implementation reaches (the summary's `pct_of_floor`: floor / median * 100) and
its ratio to Inductor's tail median (median / Inductor median: below 1, faster).

Variants are named with their kernel (`kernels/<kernel>.cu`): from the timing file when it
records one (`provenance.kernels`, variant -> kernel), else from
results/compile/{variant}/meta.json when that metadata is for the artifact that was timed,
else none. Variants of the target kernels (`fast`) are checked against the issue's targets:
tail median <= 1.00 x Inductor's and >= 85 % of the copy floor.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from kbfuse import layout
from kbfuse.errors import KbfuseError
from kbfuse.io import read_json

SCHEMA_VERSION = 1
KIND = "tail_roofline"
SCOPE, METHOD = "tail", "graph"
TARGET_KERNELS = ("fast",)
MAX_RATIO_VS_INDUCTOR = 1.00
MIN_PCT_OF_FLOOR = 85.0
FINGERPRINT = layout.RECORDS["env"].path


def timing_path(results: str | Path, task: int) -> Path:
    return Path(layout.record("timing", results, task=int(task)))


def timing_tasks(results: str | Path) -> list[int]:
    """The tasks that have a timing file under `results`, in numeric order."""
    folder = Path(layout.record("timing", results, task=0)).parent
    return sorted(int(p.stem) for p in folder.glob("*.json") if p.stem.isdigit())


def _read(path: Path, kind: str, hint: str) -> dict:
    """The summary's own reader (JSON object, kind, schema version), with a hint when the
    file is missing."""
    from kbfuse.results.study import read_result

    if not path.is_file():
        raise KbfuseError(f"{path} is missing ({hint})")
    return read_result(path, kind)


def read_timing(results: str | Path, task: int) -> dict:
    path = timing_path(results, task)
    timing = _read(path, "timing", f"run: snakemake results/timing/{task}.json")
    if timing.get("task") != int(task):
        raise KbfuseError(f"{path}: field task is {timing.get('task')!r}, not {task}")
    return timing


def read_fingerprint(results: str | Path) -> tuple[dict, Path]:
    """(the environment fingerprint, its file): it holds the measured copy bandwidth."""
    path = Path(results) / FINGERPRINT
    hint = "the copy floor needs the measured bandwidth: snakemake results/env/fingerprint.json"
    return _read(path, "env", hint), path


def kernel_of(results: str | Path, timing: Mapping, variant: str) -> tuple[str | None, str]:
    """(kernel name or None, where it came from) for one timed variant."""
    recorded = (timing.get("provenance") or {}).get("kernels")
    if isinstance(recorded, Mapping) and isinstance(recorded.get(variant), str):
        return recorded[variant], "timing"
    path = Path(layout.record("compile", results, variant=variant))
    if not path.is_file():
        return None, f"no kernel recorded and no {path}"
    try:
        meta = read_json(path)
    except ValueError:
        return None, f"{path} is not valid JSON"
    timed = ((timing.get("provenance") or {}).get("artifacts") or {}).get(variant)
    if timed is not None and meta.get("artifact_sha256") != timed:
        return None, f"{path} describes another artifact than the one timed"
    kernel = meta.get("kernel")
    return (kernel, "compile meta") if isinstance(kernel, str) else (None, f"{path}: no kernel")


def _targets(ratio: float, pct: float) -> dict:
    meets_inductor = ratio <= MAX_RATIO_VS_INDUCTOR
    meets_floor = pct >= MIN_PCT_OF_FLOOR
    return {
        "meets_inductor": meets_inductor,
        "meets_floor": meets_floor,
        "targets_met": meets_inductor and meets_floor,
    }


def task_rows(
    results: str | Path, task: int, target_kernels: Iterable[str] = TARGET_KERNELS
) -> tuple[list[dict], dict]:
    """(rows, task record) of one task: the summary's tail/graph rows plus kernel, ratio to
    Inductor and, for target kernels, the targets."""
    from kbfuse.results import study, tables  # pandas only where tables are built

    target_kernels = tuple(target_kernels)
    timing = read_timing(results, task)
    fingerprint, bw_path = read_fingerprint(results)
    res = study.StudyResults(
        config={},
        root=Path(results),
        pin={},
        fingerprint=fingerprint,
        contract={},
        timing={int(task): timing},
        paths={("env",): bw_path},
    )
    try:
        table = tables.timing_table(res, SCOPE)
    except (KeyError, TypeError, AttributeError) as exc:
        raise KbfuseError(
            f"{timing_path(results, task)} does not follow docs/contracts.md "
            f"({type(exc).__name__}: {exc})"
        ) from exc
    table = table[table["method"] == METHOD]
    if table.empty:
        raise KbfuseError(f"{timing_path(results, task)} has no {SCOPE}/{METHOD} measurements")
    medians = dict(zip(table["impl"], table["median_ms"], strict=True))
    inductor_ms = medians.get("inductor")
    rows = []
    for rec in table.to_dict("records"):
        impl, median_ms = rec["impl"], float(rec["median_ms"])
        kernel, kernel_source = (None, None)
        if rec["kind"] == "variant":
            kernel, kernel_source = kernel_of(results, timing, impl)
        ratio = median_ms / inductor_ms if inductor_ms else None
        pct = float(rec["pct_of_floor"])
        row = {
            "task": int(task),
            "impl": impl,
            "kind": rec["kind"],
            "kernel": kernel,
            "kernel_source": kernel_source,
            "rounds": int(rec["rounds"]),
            "median_us": median_ms * 1e3,
            "q1_us": float(rec["q1_ms"]) * 1e3,
            "q3_us": float(rec["q3_ms"]) * 1e3,
            "bytes_moved": int(rec["bytes_moved"]),
            "floor_us": float(rec["floor_ms"]) * 1e3,
            "pct_of_floor": pct,
            "ratio_vs_inductor": ratio,
            "target_kernel": kernel in target_kernels,
            "meets_inductor": None,
            "meets_floor": None,
            "targets_met": None,
        }
        if row["target_kernel"] and ratio is not None:
            row.update(_targets(ratio, pct))
        rows.append(row)
    first = rows[0]
    record = {
        "task": int(task),
        "timing": str(timing_path(results, task)),
        "bytes_moved": first["bytes_moved"],
        "floor_us": first["floor_us"],
        "inductor_median_us": inductor_ms * 1e3 if inductor_ms else None,
        "copy_bandwidth_gbps": tables.copy_floor_gbps(res),
        "copy_bandwidth_source": str(bw_path),
        "skipped": sorted(timing.get("skipped") or {}),
    }
    return rows, record


def roofline(
    results: str | Path = "results",
    tasks: Iterable[int] | None = None,
    target_kernels: Iterable[str] = TARGET_KERNELS,
) -> dict:
    """The tail roofline of every task (default: each results/timing/{task}.json found)."""
    target_kernels = tuple(target_kernels)
    tasks = timing_tasks(results) if tasks is None else [int(t) for t in tasks]
    if not tasks:
        raise KbfuseError(
            f"no timing files under {Path(results) / 'timing'}: run the timing jobs first "
            "(snakemake results/timing/53.json ...)"
        )
    rows: list[dict] = []
    records = []
    for task in tasks:
        task_rows_, record = task_rows(results, task, target_kernels)
        rows += task_rows_
        records.append(record)
    return {
        "kind": KIND,
        "schema_version": SCHEMA_VERSION,
        "results": str(results),
        "scope": f"{SCOPE}/{METHOD}",
        "targets": {
            "kernels": list(target_kernels),
            "max_ratio_vs_inductor": MAX_RATIO_VS_INDUCTOR,
            "min_pct_of_floor": MIN_PCT_OF_FLOOR,
        },
        "tasks": records,
        "rows": rows,
    }


# ---------------------------------------------------------------- rendering


def _mib(n: int) -> str:
    mib = n / 2**20
    return f"{mib:.0f} MiB" if mib == int(mib) else f"{mib:.2f} MiB"


def _target_cell(row: Mapping[str, Any]) -> str:
    if not row["target_kernel"]:
        return ""
    if row["targets_met"] is None:
        return "n/a (no Inductor time)"
    if row["targets_met"]:
        return "met"
    misses = []
    if not row["meets_inductor"]:
        misses.append(f"{row['ratio_vs_inductor']:.3f} x Inductor > {MAX_RATIO_VS_INDUCTOR:.2f}")
    if not row["meets_floor"]:
        misses.append(f"{row['pct_of_floor']:.1f} % of floor < {MIN_PCT_OF_FLOOR:.0f} %")
    return "not met: " + "; ".join(misses)


def _fmt(value: float | None, spec: str) -> str:
    return "—" if value is None or math.isnan(value) else format(value, spec)


def report_markdown(report: Mapping[str, Any]) -> str:
    """The roofline as a Markdown table with a header line per task's floor."""
    targets = report["targets"]
    lines = [
        f"Tail roofline ({report['scope']}: CUDA-graph replay medians) from {report['results']}",
        "",
    ]
    for rec in report["tasks"]:
        lines.append(
            f"- task {rec['task']}: {rec['bytes_moved']:,} bytes ({_mib(rec['bytes_moved'])}) "
            f"at {rec['copy_bandwidth_gbps']:.0f} GB/s ({rec['copy_bandwidth_source']}): "
            f"floor {rec['floor_us']:.1f} µs"
            + (f"; skipped variants: {', '.join(rec['skipped'])}" if rec["skipped"] else "")
        )
    lines += [
        "",
        "| task | implementation | kernel | tail median (µs) | bytes moved | floor (µs) "
        "| % of floor | x Inductor | targets |",
        "|---:|:---|:---|---:|---:|---:|---:|---:|:---|",
    ]
    for row in report["rows"]:
        kernel = row["kernel"] or ("" if row["kind"] == "variant" else "—")
        lines.append(
            f"| {row['task']} | {row['impl']} | {kernel} | {row['median_us']:.1f} "
            f"| {row['bytes_moved']:,} | {row['floor_us']:.1f} | {row['pct_of_floor']:.1f} "
            f"| {_fmt(row['ratio_vs_inductor'], '.3f')} | {_target_cell(row)} |"
        )
    kernels = ", ".join(targets["kernels"])
    checked = [row for row in report["rows"] if row["target_kernel"]]
    lines += [
        "",
        f"Targets for kernel(s) {kernels}: tail median <= "
        f"{targets['max_ratio_vs_inductor']:.2f} x Inductor's and >= "
        f"{targets['min_pct_of_floor']:.0f} % of the copy floor. "
        + (
            f"Met by {sum(bool(r['targets_met']) for r in checked)} of {len(checked)} "
            "task x variant rows."
            if checked
            else "No variant of these kernels in the timing files."
        ),
    ]
    return "\n".join(lines) + "\n"
