"""The study's two figures, drawn from the summary tables (matplotlib, Agg, PNG).

- tail time per implementation against the copy-bandwidth floor (one figure per task,
  CUDA-graph replay): bars are medians, whiskers the quartiles, the dashed line the time
  the tail's bytes take at the measured device-to-device copy bandwidth;
- bit identity per variant x control set (tiny values and tail controls), one panel per
  task: green where every element is bit-equal to eager, red where any differs, each cell
  annotated with its exact integer counts.

PNG files are written atomically and carry no timestamp or matplotlib version.
"""

from __future__ import annotations

import contextlib
import io
import math
from collections.abc import Iterator
from pathlib import Path

import pandas as pd

from kbfuse.errors import KbfuseError
from kbfuse.io import write_bytes

GRAPH_METHOD = "graph"


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: str | Path) -> None:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=120, bbox_inches="tight", metadata={"Software": None})
    write_bytes(path, buf.getvalue())


@contextlib.contextmanager
def figure(path: str | Path, *args, **kwargs) -> Iterator[tuple]:
    """`plt.subplots(*args, **kwargs)` as (fig, axes): laid out and written to `path` when the
    block ends (PNG, the same bytes for the same figure), closed whatever happens."""
    plt = _pyplot()
    fig, axes = plt.subplots(*args, **kwargs)
    try:
        yield fig, axes
        fig.tight_layout()
        _save(fig, path)
    finally:
        plt.close(fig)


def _require_finite(rows: pd.DataFrame, columns: list[str], what: str) -> None:
    """Refuse, before anything is drawn, a value that cannot be plotted (NaN, inf, < 0)."""
    for col in columns:
        values = pd.to_numeric(rows[col], errors="coerce").to_numpy(dtype=float)
        bad = [i for i, v in enumerate(values) if not (math.isfinite(v) and v >= 0)]
        if bad:
            row = rows.iloc[bad[0]]
            raise KbfuseError(
                f"{what}: column {col} is {row[col]!r} for {row.get('impl', row.get('variant'))}"
                " (not a finite, non-negative number); nothing plotted"
            )


def plot_tail_times(timing_tail: pd.DataFrame, task: int, path: str | Path) -> None:
    """Median tail time (graph replay) per implementation for one task, with the floor."""
    rows = timing_tail[(timing_tail["task"] == task) & (timing_tail["method"] == GRAPH_METHOD)]
    if rows.empty:
        raise KbfuseError(f"timing_tail has no {GRAPH_METHOD!r} rows for task {task}")
    _require_finite(rows, ["median_ms", "q1_ms", "q3_ms", "floor_ms"], f"timing_tail task {task}")
    impls = list(rows["impl"])
    medians = rows["median_ms"].to_numpy(dtype=float) * 1e3
    lower = medians - rows["q1_ms"].to_numpy(dtype=float) * 1e3
    upper = rows["q3_ms"].to_numpy(dtype=float) * 1e3 - medians
    floors = set(rows["floor_ms"].round(12))
    colors = ["tab:gray" if kind == "baseline" else "tab:blue" for kind in rows["kind"]]

    with figure(path, figsize=(max(5.0, 0.9 * len(impls) + 2), 4.0)) as (fig, ax):
        ax.bar(range(len(impls)), medians, color=colors, yerr=[lower, upper], capsize=3)
        for floor in sorted(floors):
            ax.axhline(floor * 1e3, color="tab:red", linestyle="--", linewidth=1)
            ax.annotate(
                f"copy floor {floor * 1e3:.1f} us",
                xy=(0.005, floor * 1e3),
                xycoords=("axes fraction", "data"),
                ha="left",
                va="bottom",
                color="tab:red",
                fontsize=8,
            )
        for x, (median, pct) in enumerate(zip(medians, rows["pct_of_floor"], strict=True)):
            label = f"{pct:.0f}%" if not math.isnan(pct) else ""
            ax.annotate(
                label,
                (x, median),
                ha="center",
                va="bottom",
                fontsize=7,
                xytext=(0, 2),
                textcoords="offset points",
            )
        ax.set_xticks(range(len(impls)), impls, rotation=30, ha="right", fontsize=8)
        ax.set_ylabel("tail time, median (us)")
        ax.set_ylim(bottom=0)
        ax.set_title(f"task {task}: fused tail vs copy floor (CUDA graph replay)", fontsize=10)


def plot_control_bit_equality(table: pd.DataFrame, path: str | Path) -> None:
    """Variant x control set, one panel per task: green where every element is bit-equal to
    eager, red where any differs; each cell shows bit-equal / total elements."""
    tasks = list(dict.fromkeys(table["task"]))
    if not tasks:
        raise KbfuseError("control_bit_equality has no rows to plot")
    _require_finite(table, ["elements", "elements_bit_equal"], "control_bit_equality")
    from matplotlib.colors import ListedColormap

    variants = list(dict.fromkeys(table["variant"]))
    sets = list(dict.fromkeys(table["control_set"]))
    colors = ListedColormap(["#e8a29a", "#9fd49a"])  # differs, bit-identical

    with figure(
        path,
        len(tasks),
        1,
        figsize=(1.25 * len(sets) + 3.0, (0.42 * len(variants) + 0.9) * len(tasks) + 0.6),
        squeeze=False,
    ) as (fig, axes):
        for ax, task in zip(axes[:, 0], tasks, strict=True):
            grid = [[math.nan] * len(sets) for _ in variants]
            for row in table[table["task"] == task].itertuples():
                i, j = variants.index(row.variant), sets.index(row.control_set)
                grid[i][j] = float(row.elements_bit_equal == row.elements)
                ax.text(
                    j,
                    i,
                    f"{row.elements_bit_equal}/{row.elements}",
                    ha="center",
                    va="center",
                    fontsize=7,
                )
            ax.imshow(grid, vmin=0.0, vmax=1.0, cmap=colors, aspect="auto")
            ax.set_xticks(range(len(sets)), sets, rotation=20, ha="right", fontsize=8)
            ax.set_yticks(range(len(variants)), variants, fontsize=8)
            ax.set_title(f"task {task}", fontsize=9)
        fig.suptitle(
            "bit-equal elements per variant x control set (green: all bit-identical to eager)",
            fontsize=10,
        )
