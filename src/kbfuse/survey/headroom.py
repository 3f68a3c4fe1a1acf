"""What a fused kernel can still win on a task: the outside time broken down, the memory floor,
the headroom, and the short "where to fuse" ranking of the survey's summary.

The main table's outside time (`outside_ms` = best compiled median - its library kernels'
time, kbfuse.survey.summary) is split, from the best compiled baseline's profile of one
forward, into the targets it is made of (ms):

- `generated_ms` (Inductor's Triton kernels), `pointwise_ms` and `reduction_ms` (ATen's
  elementwise kernels; its reductions, normalisations, pooling), `copy_other_ms` (copies,
  memsets, fills, and kernels no pattern classifies: kbfuse.survey.classify);
- `idle_ms`: the GPU idle between kernels inside the profiled forward (the record's
  `timeline`, kbfuse.survey.profile). Records made before the timeline existed leave it blank
  and `notes` says it was not measured. The profile launches the forward directly, the timing
  replays a CUDA graph where it can: the parts are the profiled forward's, so they need not sum
  to `outside_ms` exactly.

The memory floor (kbfuse.survey.floor: `floor_bytes`, read from the pinned task's shapes) at
the copy bandwidth measured on the same GPU (the env fingerprint's `copy_bandwidth.gbps`,
bytes read plus written per second) gives `floor_ms`, the least time any replacement of the
outside work takes. Then:

- `headroom_ms` = `outside_ms` - `floor_ms` (and its spread from the outside quartiles,
  `headroom_q1_ms`, `headroom_q3_ms`): what a fused kernel could still win;
- `fused_ms` = `library_ms` + `floor_ms`: the best fused time to expect;
- `ceiling_realistic` = best compiled / `fused_ms`: the speedup over the best compiled
  baseline a kernel at the floor would give; `ceiling_upper_bound` = best compiled /
  `library_ms` (the survey's earlier "fusion ceiling": the outside work taking no time at all)
  stays beside it.

A value that cannot be computed (no floor for the task, no fingerprint, a fingerprint of
another GPU) stays blank and `notes` says why. `where_rows` ranks the tasks of one mode by
headroom (largest first) and keeps the top `TOP`, each with `rank_safe` recomputed in that
order (its headroom spread overlaps neither neighbour's).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from kbfuse.errors import KbfuseError
from kbfuse.survey import classify

TOP = 15
# column -> the kernel categories it sums
BREAKDOWN = {
    "generated_ms": (classify.GENERATED,),
    "pointwise_ms": (classify.POINTWISE,),
    "reduction_ms": (classify.REDUCTION,),
    "copy_other_ms": (classify.COPY, classify.UNCLASSIFIED),
}
FLOOR_COLUMNS = (
    "floor_bytes", "floor_ms", "headroom_ms", "headroom_q1_ms", "headroom_q3_ms", "fused_ms",
    "ceiling_realistic", "ceiling_upper_bound",
)  # fmt: skip
WHERE_COLUMNS = [
    "rank", "task", "name", "best_compiled", "best_ms", "library_ms", "outside_ms", "floor_ms",
    "headroom_ms", "headroom_q1_ms", "headroom_q3_ms", "ceiling_realistic",
    "ceiling_upper_bound", "rank_safe", "blind_spot",
]  # fmt: skip


def read_copy_bandwidth(fingerprint: str | Path | None) -> dict | None:
    """{gbps, device_name} from an env fingerprint record (results/env/fingerprint.json), or
    None without one."""
    if fingerprint is None:
        return None
    from kbfuse.results.records import read_record

    env = read_record(fingerprint, "env")
    gbps = (env.get("copy_bandwidth") or {}).get("gbps")
    if isinstance(gbps, bool) or not isinstance(gbps, int | float) or not gbps > 0:
        raise KbfuseError(f"{fingerprint}: field copy_bandwidth.gbps is {gbps!r}, not a bandwidth")
    return {"gbps": float(gbps), "device_name": (env.get("gpu") or {}).get("name")}


def breakdown(entry: Mapping | None, notes: list[str]) -> dict[str, float | None]:
    """The outside time's parts (ms) from one baseline's profile (kernels and timeline)."""
    kernels = (entry or {}).get("kernels")
    if kernels is None:
        return dict.fromkeys([*BREAKDOWN, "idle_ms"])
    us = classify.time_by_category(kernels)
    row = {col: sum(us[c] for c in cats) / 1000.0 for col, cats in BREAKDOWN.items()}
    timeline = entry.get("timeline")
    if timeline is None:
        notes.append("idle between kernels not measured (no timeline in the record)")
    row["idle_ms"] = timeline["idle_us"] / 1000.0 if timeline else None
    return row


def _div(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _floor_ms(rec: Mapping, floor: Mapping | None, copy: Mapping | None, notes: list[str]):
    if floor is None:
        return None
    if copy is None:
        notes.append("no floor_ms: no copy bandwidth (no env fingerprint)")
        return None
    device = (rec.get("environment") or {}).get("device_name")
    if device != copy["device_name"]:
        notes.append(f"no floor_ms: copy bandwidth measured on {copy['device_name']!r}, "
                     f"the record ran on {device!r}")  # fmt: skip
        return None
    return floor["floor_bytes"] / (copy["gbps"] * 1e9) * 1e3


def floor_fields(
    rec: Mapping,
    outside: Mapping,
    library_ms: float | None,
    best_ms: float | None,
    floor: tuple[Mapping | None, str | None] | None,
    copy: Mapping | None,
    notes: list[str],
) -> dict[str, Any]:
    """The floor and headroom columns of one row; `outside`: the row's outside fields,
    `floor`: (kbfuse.survey.floor's dict, why there is none) for the record's task."""
    found, problem = floor if floor is not None else (None, "no floor: no pinned checkout")
    if problem:
        notes.append(problem)
    floor_ms = _floor_ms(rec, found, copy, notes)

    def minus(key: str) -> float | None:
        value = outside.get(key)
        return value - floor_ms if value is not None and floor_ms is not None else None

    fused = library_ms + floor_ms if library_ms is not None and floor_ms is not None else None
    return {
        "floor_bytes": found["floor_bytes"] if found else None,
        "floor_ms": floor_ms,
        "headroom_ms": minus("outside_ms"),
        "headroom_q1_ms": minus("outside_q1_ms"),
        "headroom_q3_ms": minus("outside_q3_ms"),
        "fused_ms": fused,
        "ceiling_realistic": _div(best_ms, fused),
        "ceiling_upper_bound": _div(best_ms, library_ms),
    }


def _overlap(a: Mapping, b: Mapping) -> bool:
    return a["headroom_q1_ms"] <= b["headroom_q3_ms"] and b["headroom_q1_ms"] <= a["headroom_q3_ms"]


def task_name(file: str) -> str:
    """A task file's name without its number and suffix (`65_Conv2d_AvgPool.py`:
    `Conv2d_AvgPool`)."""
    return file.removesuffix(".py").split("_", 1)[-1]


def where_rows(rows: Sequence[Mapping], top: int = TOP) -> list[dict]:
    """The `top` rows of one mode's main table with the most headroom, largest first, each
    with its rank and `rank_safe` in this order (over every task with a headroom). A task whose
    outside time is under its floor (headroom 0 or less: nothing left to win, or a profile
    whose library time exceeds the timed forward) is not ranked."""
    known = sorted(
        (r for r in rows if r.get("headroom_ms") is not None and r["headroom_ms"] > 0),
        key=lambda r: (-r["headroom_ms"], r["task"]),
    )
    ranked = []
    for i, row in enumerate(known):
        neighbours = known[max(i - 1, 0) : i] + known[i + 1 : i + 2]
        ranked.append(
            {
                **{c: row.get(c) for c in WHERE_COLUMNS},
                "rank": i + 1,
                "name": task_name(row["file"]),
                "rank_safe": not any(_overlap(row, n) for n in neighbours),
            }
        )
    return ranked[:top]
