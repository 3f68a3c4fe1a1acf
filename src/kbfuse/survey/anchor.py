"""KernelBench's own H100 baseline timings, read at the pin, to stand beside the survey.

KernelBench ships, per hardware, `results/timing/<hardware>/baseline_time_torch.json` (eager)
and `baseline_time_torch_compile_inductor_default.json` (Inductor, default mode), shaped
`{"level1": ..., "level2": {"<task file>": {"mean": ms, "std", "min", "max", "num_trials",
"hardware", "device"}}, "level3": ...}`. `read_anchor` reads them for the surveyed task files
of the surveyed level from the pinned checkout; a
missing file or task entry is reported as missing (the table cell stays blank), an entry that
is there but malformed is an error naming the file and key.

`compare` puts our figure beside theirs as a ratio (ours / theirs, H200 over H100) and flags it
when the ratio falls outside `BAND`. The two measure different things, so agreement is not
expected, only the same order of magnitude (CAPTION says why they differ).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from kbfuse.errors import KbfuseError
from kbfuse.results.records import parse_json, read_limited

FILES = {
    "eager": "baseline_time_torch.json",
    "inductor": "baseline_time_torch_compile_inductor_default.json",
}
DEFAULT_HARDWARE = "H100_Modal"
# ours / KernelBench's outside this band is flagged: an H200 has the H100's compute and 1.4x
# its memory bandwidth, so a ratio far outside [0.5, 1.5] is a different measurement, not a
# different GPU (the TF32 mode, a forward that changed, a failed baseline).
BAND = (0.5, 1.5)
CAPTION = (
    "KernelBench's anchor timings differ from ours by design: another GPU (H100 80GB HBM3, "
    "not H200), torch 2.5.0 with CUDA 12.4 (not ours), wall-clock time of each call after 3 "
    "warm-up calls over 100 trials (ours: CUDA events and CUDA-graph replay, interleaved "
    "rounds), and PyTorch's TF32 defaults (cuDNN TF32 on): compare them with the "
    "kernelbench-defaults mode; in strict mode convolution tasks run 2-4x slower. A ratio "
    f"outside [{BAND[0]}, {BAND[1]}] is flagged in anchor_disagrees."
)


def _entries(path: Path, files: Iterable[str], key: str) -> tuple[dict[str, dict], list[str]]:
    """The entries of one anchor file's level `key` ("level2") for `files`, and the files it
    lacks."""
    data = parse_json(read_limited(path), str(path))
    level = data.get(key) if isinstance(data, Mapping) else None
    if not isinstance(level, Mapping):
        raise KbfuseError(f"{path}: field {key} is missing or not an object")
    found, missing = {}, []
    for name in files:
        entry = level.get(name)
        if entry is None:
            missing.append(name)
            continue
        mean = entry.get("mean") if isinstance(entry, Mapping) else None
        if isinstance(mean, bool) or not isinstance(mean, int | float) or not mean > 0:
            raise KbfuseError(f"{path}: field {key}.{name}.mean is {mean!r}, not a time in ms")
        found[name] = {"mean_ms": float(mean), "hardware": entry.get("hardware")}
    return found, missing


def read_anchor(
    checkout: str | Path, files: Iterable[str], hardware: str = DEFAULT_HARDWARE, level: int = 2
) -> dict[str, Any]:
    """{hardware, baselines: {eager|inductor: {task file: {mean_ms, hardware}}}, missing:
    [what is not there, one line each]} for the task files given, of KernelBench level
    `level`."""
    files = list(files)
    root = Path(checkout) / "results" / "timing" / hardware
    anchor: dict[str, Any] = {"hardware": hardware, "baselines": {}, "missing": []}
    for baseline, name in FILES.items():
        path = root / name
        if not path.is_file():
            anchor["missing"].append(f"{hardware}/{name}: no such file at the pin")
            anchor["baselines"][baseline] = {}
            continue
        found, missing = _entries(path, files, f"level{level}")
        anchor["baselines"][baseline] = found
        anchor["missing"] += [f"{hardware}/{name}: no entry for {m}" for m in missing]
    return anchor


def ratio(ours_ms: float | None, theirs_ms: float | None) -> float | None:
    if ours_ms is None or theirs_ms is None or math.isnan(ours_ms):
        return None
    return ours_ms / theirs_ms


def compare(anchor: Mapping[str, Any], file: str, ours: Mapping[str, float | None]) -> dict:
    """The anchor columns of one task: KernelBench's ms per baseline, ours / theirs, and
    `anchor_disagrees` naming each baseline whose ratio is outside BAND (blank when none)."""
    row: dict[str, Any] = {}
    disagree = []
    for baseline in FILES:
        entry = anchor["baselines"].get(baseline, {}).get(file)
        theirs = entry["mean_ms"] if entry else None
        r = ratio(ours.get(baseline), theirs)
        row[f"anchor_{baseline}_ms"] = theirs
        row[f"{baseline}_over_anchor"] = r
        if r is not None and not BAND[0] <= r <= BAND[1]:
            disagree.append(f"{baseline} {r:.2f}x")
    row["anchor_disagrees"] = ", ".join(disagree)
    return row
