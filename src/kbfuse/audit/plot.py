"""The claimed-vs-measured scatter plot: one panel per compared claim, one point per kernel.

Log-log: x the claimed speedup, y the measured median (whiskers: quartiles); the diagonal is
"measured = claimed", the grey lines speedup 1. Passing kernels are circles (triangles where a
trivial output passes too), kernels that fail a check are crosses. Points carry no labels
(a corpus has a hundred); the table names them. One row of panels, 5 inches high.
"""

from __future__ import annotations

import io
from pathlib import Path

import pandas as pd

from kbfuse.audit.claims import PASSES_BLIND
from kbfuse.io import write_bytes

STYLES = (  # (label, marker, colour, which rows)
    (
        "passes",
        "o",
        "tab:blue",
        lambda f: (f["verdict"] == "pass") & (f["outcome"] != PASSES_BLIND),
    ),
    (
        "passes, trivial output passes too",
        "^",
        "tab:orange",
        lambda f: f["outcome"] == PASSES_BLIND,
    ),
    ("fails a check", "x", "tab:red", lambda f: f["verdict"] == "fail"),
)
PANEL_INCHES = 5.0
TICKS = (0.01, 0.03, 0.1, 0.3, 1, 3, 10, 30, 100, 300, 1000, 3000)


def compared_claims(claims: list[dict]) -> list[dict]:
    return [c for c in claims if c["against"] is not None]


def _panel(ax, frame: pd.DataFrame, claim: dict) -> None:
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter

    name = claim["name"]
    x, y = f"claim_{name}", f"measured_{name}"
    shown = frame[frame[x].notna() & frame[y].notna()] if x in frame and y in frame else frame[:0]
    for label, marker, colour, rows in STYLES:
        part = shown[rows(shown)] if len(shown) else shown
        if not len(part):
            continue
        median = part[y].astype(float)
        low = (median - part[f"{y}_q1"].astype(float)).clip(lower=0)
        high = (part[f"{y}_q3"].astype(float) - median).clip(lower=0)
        ax.errorbar(
            part[x].astype(float),
            median,
            yerr=[low, high],
            fmt=marker,
            color=colour,
            markersize=6,
            elinewidth=0.8,
            alpha=0.8,
            label=f"{label} ({len(part)})",
        )
    values = pd.concat([shown[x], shown[y]]).astype(float) if len(shown) else pd.Series([1.0])
    # at least 0.25 to 4, so that the labelled ticks (TICKS, no minor labels) never crowd
    low, high = min(values.min() / 1.5, 0.25), max(values.max() * 1.5, 4.0)
    ax.plot(
        [low, high], [low, high], "--", color="black", linewidth=0.8, label="measured = claimed"
    )
    ax.axhline(1.0, color="grey", linewidth=0.6)
    ax.axvline(1.0, color="grey", linewidth=0.6)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ticks = [t for t in TICKS if low <= t <= high]
    for axis in (ax.xaxis, ax.yaxis):
        axis.set_major_locator(FixedLocator(ticks))
        axis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
        axis.set_minor_formatter(NullFormatter())
    ax.set_xlim(low, high)
    ax.set_ylim(low, high)
    ax.set_xlabel(f"claimed speedup ({claim['key']})")
    ax.set_ylabel(f"measured speedup over {claim['against']} (median, quartiles)")
    ax.set_title(f"{name}: {len(shown)} kernels with both figures")
    ax.legend(fontsize="small", loc="upper left")
    ax.set_aspect("equal")


def plot(frame: pd.DataFrame, claims: list[dict], path: str | Path, title: str) -> None:
    """The scatter plot of every compared claim (a note where there is none) at `path`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    compared = compared_claims(claims)
    panels = max(1, len(compared))
    fig, axes = plt.subplots(
        1, panels, figsize=(PANEL_INCHES * panels + 0.5, PANEL_INCHES), layout="constrained"
    )
    axes = list(axes) if panels > 1 else [axes]
    for ax, claim in zip(axes, compared, strict=False):
        _panel(ax, frame, claim)
    if not compared:
        axes[0].text(0.5, 0.5, "the corpus carries no compared claim", ha="center", va="center")
        axes[0].set_axis_off()
    fig.suptitle(title)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight", metadata={"Software": None})
    plt.close(fig)
    write_bytes(path, buf.getvalue())
