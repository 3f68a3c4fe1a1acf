"""The survey's figures, drawn from its tables (matplotlib, Agg, PNG), per numerics mode.

- `where_to_fuse_<mode>.png`: the where-to-fuse table (kbfuse.survey.headroom) as one
  horizontal bar per task, the headroom in ms (best compiled - library - memory floor), the
  whiskers its q1-q3 spread, the realistic ceiling written at the bar's end; ranks whose
  spread overlaps a neighbour's (not rank-safe) hatched;
- `time_split_<mode>.png`: for the first `SPLIT_TASKS` tasks of the main table (most time
  outside library kernels first; every task's figures are in `categories`), two stacked
  horizontal bars, eager and the best compiled baseline, split into library / generated /
  framework (pointwise and reduction) / other (copies and unclassified) kernel time;
- `speedup_vs_outside_<mode>.png`: speedup of the best compiled baseline over eager (log
  scale) against the share of its time outside library kernels; tasks where a trivial
  candidate passes the official check (blind spots) are drawn as red crosses.

A figure without data says so in its middle instead of failing: the tables say why. Every
figure fits a screen (at most about 1000 px high at the 120 dpi they are written with).
PNG files are written atomically and carry no timestamp or matplotlib version.
"""

from __future__ import annotations

import math
from pathlib import Path

from kbfuse.results.plots import figure
from kbfuse.survey.classify import COPY, GENERATED, LIBRARY, POINTWISE, REDUCTION, UNCLASSIFIED

# bar segment -> (categories summed, colour)
SEGMENTS = {
    "library": ((LIBRARY,), "tab:gray"),
    "generated": ((GENERATED,), "tab:blue"),
    "framework": ((POINTWISE, REDUCTION), "tab:orange"),
    "other": ((COPY, UNCLASSIFIED), "tab:purple"),
}
ROLES = ("eager", "best compiled")
SPLIT_TASKS = 20


def _empty(ax, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes)
    ax.set_xticks([])
    ax.set_yticks([])


def _segments(row) -> dict[str, float]:
    return {
        seg: float(sum(row[f"{c}_ms"] for c in members)) for seg, (members, _) in SEGMENTS.items()
    }


def plot_time_split(main, categories, mode: str, path: str | Path) -> None:
    """Kernel time per category as shares of each bar (total ms written at its end), eager
    and best compiled, one pair of bars per task."""
    cats = categories[categories["numerics"] == mode] if len(categories) else categories
    order = [t for t in main["task"] if len(cats) and t in set(cats["task"])] if len(main) else []
    shown = order[:SPLIT_TASKS]
    with figure(path, figsize=(8.0, 0.3 * len(shown) + 1.8)) as (fig, ax):
        if not order:
            _empty(ax, f"no kernel profile in mode {mode}")
        for i, task in enumerate(shown):
            for j, role in enumerate(ROLES):
                rows = cats[(cats["task"] == task) & (cats["role"] == role)]
                if rows.empty:
                    continue
                parts = _segments(rows.iloc[0])
                total, left, y = sum(parts.values()), 0.0, i + 0.4 * j - 0.2
                for segment, width in parts.items():
                    share = 100 * width / total if total else 0.0
                    ax.barh(
                        y,
                        share,
                        0.38,
                        left=left,
                        color=SEGMENTS[segment][1],
                        label=segment if i == 0 and j == 0 else None,
                        hatch="//" if j else None,
                        edgecolor="white",
                        linewidth=0.3,
                    )
                    left += share
                ax.annotate(
                    f"{total:.3g} ms",
                    (100, y),
                    xytext=(3, 0),
                    fontsize=6,
                    textcoords="offset points",
                    va="center",
                )
        if order:
            ax.set_yticks(range(len(shown)), [f"{t}" for t in shown], fontsize=7)
            ax.set_xlim(0, 112)
            ax.invert_yaxis()
            ax.set_xlabel(
                "share of kernel time per forward (%); upper bar eager, hatched best compiled"
            )
            ax.set_ylabel("task (most time outside library kernels first)")
            ax.legend(fontsize=7, ncols=4, loc="lower center", bbox_to_anchor=(0.5, 1.0))
        first = f", the first {len(shown)} of {len(order)} tasks" if len(order) > len(shown) else ""
        ax.set_title(f"where the time goes ({mode}{first})", fontsize=10, pad=22)


def plot_speedup_vs_outside(main, mode: str, path: str | Path) -> None:
    """Best compiled speedup over eager against the outside-library share, blind spots marked."""
    from matplotlib.ticker import FuncFormatter

    rows = main.dropna(subset=["outside_pct", "eager_ms", "best_ms"]) if len(main) else main
    with figure(path, figsize=(6.5, 4.5)) as (fig, ax):
        if rows.empty:
            _empty(ax, f"no task with both a time and a kernel profile in mode {mode}")
        else:
            speedup = rows["eager_ms"].astype(float) / rows["best_ms"].astype(float)
            blind = rows["blind_spot"].astype(bool).to_numpy()
            x = rows["outside_pct"].astype(float).to_numpy()
            y = speedup.to_numpy()
            ax.scatter(x[~blind], y[~blind], s=18, color="tab:blue", label="check discriminates")
            ax.scatter(
                x[blind],
                y[blind],
                s=40,
                color="tab:red",
                marker="x",
                label="blind spot: a trivial candidate passes",
            )
            for task, xi, yi in zip(rows["task"], x, y, strict=True):
                ax.annotate(
                    str(task), (xi, yi), fontsize=6, xytext=(2, 2), textcoords="offset points"
                )
            ax.set_yscale("log")
            times = FuncFormatter(lambda v, _: f"{v:.3g}x")
            ax.yaxis.set_major_formatter(times)
            ax.yaxis.set_minor_formatter(times)
            ax.tick_params(axis="y", which="both", labelsize=7)
            ax.axhline(1.0, color="black", linewidth=0.6, linestyle="--")
            ax.set_xlabel("time outside library kernels in the best compiled baseline (%)")
            ax.set_ylabel("speedup of best compiled over eager")
            ax.legend(fontsize=7)
        ax.set_title(f"compiled speedup vs time outside library kernels ({mode})", fontsize=10)


def _label(task, name: str, width: int = 44) -> str:
    """`task name`, the name cut to `width` characters (an ellipsis says where)."""
    return f"{task} {name if len(name) <= width else name[: width - 1] + '…'}"


def _headroom_bars(ax, rows) -> None:
    """One bar per row (largest on top): headroom, q1-q3 whiskers, realistic ceiling at its end."""
    y = list(range(len(rows)))
    value = rows["headroom_ms"].astype(float).to_numpy()
    low = (value - rows["headroom_q1_ms"].astype(float).to_numpy()).clip(0)
    high = (rows["headroom_q3_ms"].astype(float).to_numpy() - value).clip(0)
    hatches = ["" if safe else "//" for safe in rows["rank_safe"].astype(bool)]
    ax.barh(y, value, 0.7, color="tab:blue", hatch=hatches, edgecolor="white", xerr=[low, high],
            error_kw={"elinewidth": 0.8, "capsize": 2})  # fmt: skip
    ax.set_yticks(y, [_label(r.task, r.name) for r in rows.itertuples()], fontsize=7)
    ax.invert_yaxis()
    for yi, end, ceiling in zip(y, value + high, rows["ceiling_realistic"], strict=True):
        text = f"{float(ceiling):.2f}x" if math.isfinite(float(ceiling)) else ""
        ax.annotate(text, (max(end, 0.0), yi), xytext=(3, 0), textcoords="offset points",
                    fontsize=6, va="center")  # fmt: skip
    ax.set_xlim(min(0.0, float((value - low).min())) * 1.1, float((value + high).max()) * 1.18)
    ax.axvline(0.0, color="black", linewidth=0.6)


def plot_where_to_fuse(where, mode: str, path: str | Path) -> None:
    """The headroom of the where-to-fuse table's tasks in ms, q1-q3 whiskers, largest on top."""
    rows = where.dropna(subset=["headroom_ms"]) if len(where) else where
    with figure(path, figsize=(7.5, 0.32 * len(rows) + 1.6)) as (fig, ax):
        if rows.empty:
            _empty(ax, f"no headroom in mode {mode}: no floor or no copy bandwidth (notes say)")
            ax.set_title(f"where to fuse ({mode})", fontsize=10)
            return
        _headroom_bars(ax, rows)
        ax.set_xlabel(
            "headroom (ms): best compiled - library kernels - memory floor; whiskers q1-q3;\n"
            "at the bar's end the realistic ceiling, best compiled / (library + floor);"
            " hatched: not rank-safe",
            fontsize=7,
        )
        ax.set_title(
            f"where to fuse ({mode}): the {len(rows)} tasks with most headroom", fontsize=10
        )


def write_plots(main, categories, mode: str, outdir: str | Path, where=None) -> list[Path]:
    """The figures of one mode under outdir (where to fuse, the time split, speedup against
    outside share); the paths written."""
    import pandas as pd

    fuse = Path(outdir) / f"where_to_fuse_{mode}.png"
    split = Path(outdir) / f"time_split_{mode}.png"
    scatter = Path(outdir) / f"speedup_vs_outside_{mode}.png"
    plot_where_to_fuse(pd.DataFrame() if where is None else where, mode, fuse)
    plot_time_split(main, categories, mode, split)
    plot_speedup_vs_outside(main, mode, scatter)
    return [fuse, split, scatter]
