"""Round levels of one timed block: what moved whole rounds together, read from a record.

A timed block interleaves every implementation once per round, so the median over the
implementations of one round's samples (its *level*) shows what the device or the host was
doing at that moment, apart from any one implementation. `two_bands` splits a block's rounds
at the largest step between consecutive levels (in sorted order) and shows, per
implementation, its median in each band: whether a slow phase slowed every implementation
alike (a clock that scales every kernel), raised all of them to one floor (a per-launch cost
outside the kernels), or spared some. The H200 reference's task-81 small-shape tail in CUDA
graphs is the case it was written for (docs/findings.md, "Position in the round").

Used by tools/round_bands.py only (no workflow rule runs it), so changing it reruns nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from kbfuse.errors import KbfuseError
from kbfuse.io import read_json


def read_block(results: str | Path, task: int, block: str) -> dict[str, dict]:
    """{implementation: measurement} of one timed block of a run, named as in the summary's
    `position_effect` table: "full/graph" (timing/{task}.json), "small/tail/graph" (the
    controls' small shape) or "ftz_cost/nvrtc-cubin" (an FTZ-cost pair)."""
    results = Path(results)
    if block.startswith(("small/", "ftz_cost/")):
        path = results / f"controls/{task}.json"
        record = read_json(path)
        if block.startswith("small/"):
            found = record["small_shape"].get("measurements", {}).get(block[len("small/") :])
        else:
            pair = record.get("ftz_cost", {}).get(block[len("ftz_cost/") :])
            found = pair and {pair["ftz_on"]: pair["on"], pair["ftz_off"]: pair["off"]}
    else:
        path = results / f"timing/{task}.json"
        found = read_json(path)["measurements"].get(block)
    if not found:
        raise KbfuseError(f"{path}: no timed block {block!r}")
    return found


def round_levels(samples: Mapping[str, list[float]]) -> np.ndarray:
    """Per round, the median over the implementations of that round's samples."""
    rows = [list(values) for values in samples.values()]
    if not rows or not rows[0] or len({len(row) for row in rows}) != 1:
        raise KbfuseError("round_levels: the implementations need one sample per round each")
    return np.median(np.array(rows, dtype=np.float64), axis=0)


def two_bands(block: Mapping[str, Mapping[str, Any]]) -> dict:
    """The block's rounds split in two bands at the largest ratio between consecutive round
    levels (sorted), and each implementation's median in each band (ms)."""
    samples = {name: list(m["samples_ms"]) for name, m in block.items()}
    levels = round_levels(samples)
    if levels.size < 2:
        raise KbfuseError("two_bands: a block of one round has no bands")
    ordered = np.sort(levels)
    steps = ordered[1:] / ordered[:-1]
    cut = int(np.argmax(steps))
    slow = levels > ordered[cut]
    per_impl = {}
    for name, values in samples.items():
        values = np.asarray(values)
        fast_ms, slow_ms = float(np.median(values[~slow])), float(np.median(values[slow]))
        per_impl[name] = {
            "fast_ms": fast_ms,
            "slow_ms": slow_ms,
            "slow_over_fast": slow_ms / fast_ms,
        }
    return {
        "levels_ms": [float(v) for v in levels],
        "slow_rounds": [int(i) + 1 for i in np.flatnonzero(slow)],
        "step": float(steps[cut]),
        "fast_level_ms": float(np.median(levels[~slow])),
        "slow_level_ms": float(np.median(levels[slow])),
        "implementations": per_impl,
        "rounds_in_order": rounds_in_order(block),
    }


def rounds_in_order(block: Mapping[str, Mapping[str, Any]]) -> list[list[tuple[str, float]]]:
    """Each round's (implementation, sample ms) in the order they ran, from the recorded
    positions; [] when the block has none."""
    if any("positions" not in m for m in block.values()):
        return []
    rounds = len(next(iter(block.values()))["samples_ms"])
    return [
        sorted(
            ((name, float(m["samples_ms"][r])) for name, m in block.items()),
            key=lambda item: block[item[0]]["positions"][r],
        )
        for r in range(rounds)
    ]


def spans(numbers: list[int]) -> str:
    """Sorted integers as runs: [3, 4, 5, 9] -> "3-5, 9"."""
    runs: list[list[int]] = []
    for n in numbers:
        if runs and n == runs[-1][-1] + 1:
            runs[-1].append(n)
        else:
            runs.append([n])
    return ", ".join(f"{r[0]}-{r[-1]}" if len(r) > 1 else str(r[0]) for r in runs)


def bands_markdown(task: int, block: str, bands: dict) -> str:
    """The report as Markdown: the bands, each implementation in both, every round in order."""
    us = 1000.0
    lines = [
        f"## Task {task}, {block}: rounds in two bands\n",
        f"Split at the largest step between round levels (x{bands['step']:.3f}): "
        f"level {bands['fast_level_ms'] * us:.2f} µs in the fast band, "
        f"{bands['slow_level_ms'] * us:.2f} µs in the slow band "
        f"(rounds {spans(bands['slow_rounds'])}).\n",
        "| implementation | fast band (µs) | slow band (µs) | slow / fast |",
        "|---|---:|---:|---:|",
    ]
    for name, row in bands["implementations"].items():
        lines.append(
            f"| {name} | {row['fast_ms'] * us:.2f} | {row['slow_ms'] * us:.2f} | "
            f"{row['slow_over_fast']:.3f} |"
        )
    if bands["rounds_in_order"]:
        lines += ["", "| round | level (µs) | band | samples in the order they ran (µs) |",
                  "|---:|---:|---|---|"]  # fmt: skip
        slow = set(bands["slow_rounds"])
        for index, order in enumerate(bands["rounds_in_order"], start=1):
            cells = " ".join(f"{name}:{ms * us:.2f}" for name, ms in order)
            band = "slow" if index in slow else "fast"
            level = bands["levels_ms"][index - 1] * us
            lines.append(f"| {index} | {level:.2f} | {band} | {cells} |")
    return "\n".join(lines) + "\n"
