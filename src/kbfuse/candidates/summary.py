"""The table and plot over a folder of verdicts (results/check/*.json).

`verdict_row` flattens one verdict: candidate, task, verdict, failed checks, findings, the
official cases passed, bit-identical cases, the largest error in ULPs, the contract (routes,
what the flags imply, FTZ measured), and per timing method the speedup over eager and over
the best compiled baseline (median and quartiles of the per-round paired ratios; > 1: the
candidate is faster). `write_summary` writes table.csv, table.md and speedup.png (events
timing, or wall on a CPU run: bars are medians, whiskers quartiles, failing candidates
hatched).
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterable
from pathlib import Path

import pandas as pd

from kbfuse.candidates.verdict import validate
from kbfuse.io import write_bytes, write_text

METHODS = ("events", "graph", "cold_l2", "wall")


def _ratio(entry: dict | None, key: str) -> tuple[float | None, float | None, float | None]:
    ratios = (entry or {}).get(key)
    if not ratios:
        return None, None, None
    return ratios["median"], ratios["q1"], ratios["q3"]


def verdict_row(record: dict) -> dict:
    cases = record["correctness"]["cases"]
    official = [c for name, c in cases.items() if name.startswith("official_")]
    compared = [c for c in cases.values() if c.get("problem") is None]
    contract = record["contract"]
    row = {
        "candidate": record["candidate"]["file"],
        "task": f"{record['task']['level']}/{record['task']['task']}",
        "verdict": record["verdict"],
        "failed_checks": " ".join(record["failed_checks"]),
        "findings": " ".join(record["findings"]),
        "official_passed": f"{sum(c['official_pass'] for c in official)}/{len(official)}",
        "bit_identical_cases": f"{sum(bool(c.get('bit_identical')) for c in compared)}"
        f"/{len(cases)}",
        "max_ulps": max((c["max_ulps"] for c in compared), default=None),
        "routes": " ".join(contract["routes"]),
        "flags_fast_math": contract["implies"]["use_fast_math"],
        "flags_ftz": contract["implies"]["ftz"],
        "ftz_measured": contract["effective_ftz"],
    }
    for method in METHODS:
        entry = (record["speedup"] or {}).get(method)
        if entry is None:
            continue
        for key, label in (("over_eager", "eager"), ("over_best_compiled", "best")):
            median, q1, q3 = _ratio(entry, key)
            row[f"{method}_vs_{label}"] = median
            row[f"{method}_vs_{label}_q1"] = q1
            row[f"{method}_vs_{label}_q3"] = q3
        row[f"{method}_best_compiled"] = entry["best_compiled"]
    return row


def read_verdicts(paths: Iterable[str | Path]) -> list[dict]:
    records = []
    for path in sorted(map(Path, paths)):
        record = json.loads(path.read_text())
        validate(record, str(path))
        records.append(record)
    return records


def table(records: list[dict]) -> pd.DataFrame:
    return pd.DataFrame([verdict_row(r) for r in records])


def plot(frame: pd.DataFrame, path: str | Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    method = "events" if "events_vs_eager" in frame else "wall"
    fig, ax = plt.subplots(figsize=(max(6, 0.9 * len(frame) + 2), 4))
    width = 0.38
    for offset, label in ((-width / 2, "eager"), (width / 2, "best")):
        column = f"{method}_vs_{label}"
        if column not in frame:
            continue
        values = frame[column].astype(float)
        low = (values - frame[f"{column}_q1"].astype(float)).clip(lower=0)
        high = (frame[f"{column}_q3"].astype(float) - values).clip(lower=0)
        bars = ax.bar(
            [i + offset for i in range(len(frame))],
            values.fillna(0),
            width,
            yerr=[low.fillna(0), high.fillna(0)],
            label=f"over {'eager' if label == 'eager' else 'best compiled baseline'}",
        )
        for bar, verdict in zip(bars, frame["verdict"], strict=True):
            if verdict != "pass":
                bar.set_hatch("//")
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(range(len(frame)))
    ax.set_xticklabels(frame["candidate"], rotation=30, ha="right")
    ax.set_ylabel(f"speedup ({method}, per-round ratio)")
    ax.set_title("kbfuse check: candidates (hatched: verdict fail)")
    ax.legend()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight", metadata={"Software": None})
    plt.close(fig)
    write_bytes(path, buf.getvalue())


def write_summary(paths: Iterable[str | Path], out: str | Path) -> list[Path]:
    """table.csv, table.md and speedup.png under `out`, from the verdict files."""
    out = Path(out)
    frame = table(read_verdicts(paths))
    written = [out / "table.csv", out / "table.md", out / "speedup.png"]
    write_text(written[0], frame.to_csv(index=False))
    write_text(written[1], frame.to_markdown(index=False, floatfmt=".4g", missingval="") + "\n")
    plot(frame, written[2])
    return written
