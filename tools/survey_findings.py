"""The figures README's survey section quotes ("Where to fuse", "What the H200 reference survey
found"), from a survey's tables.

    python tools/survey_findings.py results/reference/h200/survey/survey/summary

Reads where_to_fuse_<mode>.csv, survey_{strict,kernelbench-defaults}.csv, tf32.csv and
failures.csv (written by `snakemake survey`), and the compile times of the task records beside
the summary (`../<mode>/tasks/*.json`), and prints each figure with what it is, so every
number in that README section (and the strict-mode figures of docs/survey.md, "KernelBench's
anchor") can be regenerated from the committed reference. A summary made before the
where-to-fuse table existed says so in that section instead.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

import pandas as pd

MODES = {"strict": "strict FP32", "kernelbench-defaults": "KernelBench's defaults (TF32 on)"}
AUTOTUNE = "inductor-max-autotune-no-cudagraphs"


def _name(row) -> str:
    return row.file.removesuffix(".py").split("_", 1)[1]


WHERE_SHOWN = 5


def where_to_fuse_figures(where: pd.DataFrame, title: str, top: int = WHERE_SHOWN) -> list[str]:
    """One mode's where-to-fuse table in two lines: its first `top` ranks, then how far down
    the ranking is rank-safe and how many tasks have a headroom over 1 ms."""
    if where.empty:
        return [f"{title}: no task has a headroom (no floor or no copy bandwidth: see notes)"]
    ranks = ", ".join(
        f"{r.task} {r.name} {r.headroom_ms:.2f} ms ({r.headroom_q1_ms:.2f}-{r.headroom_q3_ms:.2f}"
        f"{'' if r.rank_safe else ', not rank-safe'}; realistic ceiling "
        f"{r.ceiling_realistic:.2f}x, upper bound {r.ceiling_upper_bound:.2f}x)"
        for r in where.head(top).itertuples()
    )
    unsafe = where.loc[~where["rank_safe"].astype(bool), "rank"]
    safe_to = int(unsafe.min()) - 1 if len(unsafe) else int(where["rank"].max())
    return [
        f"{title}, the most headroom: {ranks}",
        f"{title}: the ranking is rank-safe down to rank {safe_to}; "
        f"{int((where['headroom_ms'] > 1.0).sum())} of its {len(where)} tasks have over 1 ms",
    ]


def where_to_fuse(summary: Path) -> list[str]:
    """The "Where to fuse" lines of every mode, or what the summary lacks."""
    lines = []
    for mode, title in MODES.items():
        path = summary / f"where_to_fuse_{mode}.csv"
        if path.is_file():
            lines += where_to_fuse_figures(pd.read_csv(path), title)
        else:
            lines.append(
                f"{title}: no where_to_fuse_{mode}.csv in this summary (made before the "
                "headroom columns): rebuild it with `snakemake survey_summary`"
            )
    return lines


def _ceiling(row) -> float:
    """The upper-bound ceiling (`fusion_ceiling` in summaries made before it was renamed)."""
    value = getattr(row, "ceiling_upper_bound", None)
    return row.fusion_ceiling if value is None else value


def idle_figure(timed: pd.DataFrame) -> str:
    """The GPU's idle time between kernels inside the best compiled forward."""
    if "idle_ms" not in timed or timed["idle_ms"].isna().all():
        return "idle between kernels: not measured (records made before the profile timeline)"
    idle = timed.dropna(subset=["idle_ms"])
    most = idle.loc[idle["idle_ms"].idxmax()]
    return (
        f"idle between kernels ({len(idle)} tasks): median {idle['idle_ms'].median():.3f} ms, "
        f"max {most.idle_ms:.3f} ms (task {most.task}), over 0.1 ms on "
        f"{int((idle['idle_ms'] > 0.1).sum())}"
    )


def mode_figures(table: pd.DataFrame, top: int) -> list[str]:
    timed = table.dropna(subset=["outside_pct"])
    best = timed["best_compiled"].value_counts().to_dict()
    ranked = timed.sort_values("outside_ms", ascending=False).head(top)
    anchored = table.dropna(subset=["anchor_eager_ms"])
    disagree = anchored["anchor_disagrees"].fillna("").astype(str).str.len() > 0
    lines = [
        f"tasks with a timed best compiled baseline: {len(timed)} ({best})",
        f"outside library kernels, median: {timed['outside_pct'].median():.1f} %",
        f"tasks over half outside: {int((timed['outside_pct'] > 50).sum())}",
        "most time outside: "
        + ", ".join(
            f"{r.task} ({_name(r)}, {r.outside_ms:.1f} ms, {r.outside_pct:.0f} %, "
            f"ceiling {_ceiling(r):.1f}x)"
            for r in ranked.itertuples()
        ),
        idle_figure(timed),
        f"KernelBench's H100 anchor agrees on {int((~disagree).sum())} of {len(anchored)} tasks"
        f" (eager over anchor, median {anchored['eager_over_anchor'].median():.2f})",
        "blind spots: "
        + ", ".join(str(t) for t in sorted(table.loc[table["blind_spot"].astype(bool), "task"])),
        "not deterministic: "
        + ", ".join(
            str(t) for t in sorted(table.loc[table["nondeterministic"].astype(bool), "task"])
        ),
    ]
    return lines


def tf32_figures(tf32: pd.DataFrame) -> list[str]:
    lines = []
    for column, what in (
        ("eager_strict_over_defaults", "eager"),
        ("best_strict_over_defaults", "best compiled"),
    ):
        ratio = tf32[column].dropna()
        worst = tf32.loc[ratio.idxmax()]
        lines.append(
            f"{what}, strict over defaults: median {ratio.median():.2f}, "
            f"max {ratio.max():.1f}x (task {worst.task})"
        )
    return lines


def tf32_by_main_op(tf32: pd.DataFrame, threshold: float = 1.5) -> list[str]:
    """Eager's strict over defaults ratio per kind of main op (convolutions, GEMMs): what
    docs/survey.md says about comparing strict figures with KernelBench's anchor."""
    kinds = tf32["main_op"].where(
        tf32["main_op"] == "aten.convolution", "GEMM (aten.addmm, aten.mm)"
    )
    lines = []
    for kind, group in tf32.groupby(kinds, sort=False):
        ratio = group["eager_strict_over_defaults"].dropna()
        if ratio.empty:
            continue
        worst = group.loc[ratio.idxmax()]
        q1, q3 = ratio.quantile([0.25, 0.75])
        lines.append(
            f"eager, strict over defaults, {kind}: {len(ratio)} tasks, median {ratio.median():.2f}"
            f" (quartiles {q1:.2f}-{q3:.2f}), range {ratio.min():.2f}-{ratio.max():.2f}"
            f" (max: task {worst.task}), {int((ratio < threshold).sum())} of {len(ratio)}"
            f" below {threshold}x"
        )
    return lines


def baselines_follow_the_mode(strict: pd.DataFrame, defaults: pd.DataFrame) -> list[str]:
    """Each baseline's strict over defaults time on the convolution tasks: TorchScript must
    move like eager (a trace made in one mode kept that mode's cuDNN switch)."""
    both = strict.merge(defaults, on="task", suffixes=("_strict", "_defaults"))
    convs = both[both["main_op_strict"] == "aten.convolution"]
    lines = []
    for name in ("eager", "torchscript", "inductor", AUTOTUNE):
        if f"{name}_ms_strict" not in convs:
            continue
        ratio = (convs[f"{name}_ms_strict"] / convs[f"{name}_ms_defaults"]).dropna()
        lines.append(
            f"{name} on {len(ratio)} convolution tasks, strict over defaults: median "
            f"{ratio.median():.2f}, max {ratio.max():.2f} (task "
            f"{convs.loc[ratio.idxmax(), 'task']}), {int((ratio > 1.5).sum())} above 1.5x"
        )
    return lines


def autotune_figures(table: pd.DataFrame, title: str) -> list[str]:
    """Inductor's default over its max-autotune, on the tasks where both pass the official
    check and are timed: how much the strongest baseline gains over the default."""
    if f"{AUTOTUNE}_ms" not in table:
        return [f"{title}: max-autotune was not among the baselines"]
    passed = table["inductor_official"].eq(True) & table[f"{AUTOTUNE}_official"].eq(True)
    both = table[passed].dropna(subset=["inductor_ms", f"{AUTOTUNE}_ms"])
    ratio = both["inductor_ms"] / both[f"{AUTOTUNE}_ms"]
    best = both.loc[ratio.idxmax()]
    return [
        f"{title}: Inductor over max-autotune on {len(ratio)} tasks where both pass: median "
        f"{ratio.median():.2f}, max {ratio.max():.2f} (task {best.task}, "
        f"{best.inductor_ms:.2f} -> {best[f'{AUTOTUNE}_ms']:.2f} ms), "
        f"{int((ratio > 1.05).sum())} over 1.05, {int((ratio < 1 / 1.05).sum())} under 1/1.05"
    ]


def record_baselines(tasks: Path) -> list[dict]:
    """The `baselines` block of every task record beside the summary (`<mode>/tasks/*.json`
    under `tasks`), read once for the figures below."""
    return [
        json.loads(path.read_text())["baselines"] for path in sorted(tasks.glob("*/tasks/*.json"))
    ]


def autotune_build_figures(records: list[dict]) -> list[str]:
    """The compile seconds of Inductor and its max-autotune, from the records' `baselines`
    (`record_baselines`): Inductor's build (`build_s`), max-autotune's warm-up build
    (`warm_build_s`: its build alone reuses the warm-up's kernels)."""
    seconds: dict[str, list[float]] = {"inductor": [], AUTOTUNE: []}
    field = {"inductor": "build_s", AUTOTUNE: "warm_build_s"}
    for baselines in records:
        for name, values in seconds.items():
            build = (baselines.get(name) or {}).get(field[name])
            if build is not None:
                values.append(build)
    return [
        f"{name} compile ({field[name]}, both modes): {len(values)} builds, median "
        f"{pd.Series(values).median():.1f} s, max {max(values):.1f} s"
        for name, values in seconds.items()
        if values
    ]


def autotune_choice_figures(records: list[dict]) -> list[str]:
    """Which convolution backends max-autotune chose from (the record's `conv_backends`;
    records made before the setting existed had Inductor's own, ATEN,TRITON) and which of
    Inductor's Triton templates (`triton_tem_*` kernels) it chose, by the records (their
    `baselines`: `record_baselines`) whose profile holds each."""
    backends: Counter = Counter()
    templates: Counter = Counter()
    for baselines in records:
        entry = baselines.get(AUTOTUNE)
        if not entry or entry.get("status") != "ok":
            continue
        backends[entry.get("conv_backends", "ATEN,TRITON")] += 1
        names = {k["name"] for k in entry.get("kernels") or []}
        templates.update(name for name in names if name.startswith("triton_tem_"))
    if not backends:
        return []
    convolution = sum(n for name, n in templates.items() if "convolution" in name)
    chosen = ", ".join(f"{name} in {n}" for name, n in sorted(templates.items())) or "none"
    return [
        "max-autotune's convolution backends: "
        + ", ".join(f"{b} in {n} records" for b, n in sorted(backends.items())),
        f"its Triton templates chosen (triton_tem_* kernels, records): {chosen}; "
        f"convolution templates: {convolution}",
    ]


def failure_figures(failures: pd.DataFrame) -> list[str]:
    """Failed baselines by mode, baseline and stage, then each one."""
    counts = failures.groupby(["numerics", "baseline", "stage"]).size()
    lines = [f"{len(failures)} failed baselines"]
    lines += [f"{n} x {mode} {name}: {stage}" for (mode, name, stage), n in counts.items()]
    lines += [
        f"task {r.task} {r.numerics} {r.baseline}: {r.stage} ({r.message})"
        for r in failures.itertuples()
    ]
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("summary", type=Path, help="a survey's summary folder")
    parser.add_argument("--top", type=int, default=7, help="tasks listed by time outside")
    args = parser.parse_args(argv)
    for mode in MODES:
        path = args.summary / f"survey_{mode}.csv"
        if not path.is_file():
            print(f"survey_findings: {path} is missing", file=sys.stderr)
            return 1
    print("## Where to fuse")
    print("\n".join(f"- {line}" for line in where_to_fuse(args.summary)))
    for mode, title in MODES.items():
        path = args.summary / f"survey_{mode}.csv"
        print(f"## {title}")
        print("\n".join(f"- {line}" for line in mode_figures(pd.read_csv(path), args.top)))
    print("## TF32")
    tf32 = pd.read_csv(args.summary / "tf32.csv")
    print("\n".join(f"- {line}" for line in tf32_figures(tf32) + tf32_by_main_op(tf32)))
    strict, defaults = (pd.read_csv(args.summary / f"survey_{m}.csv") for m in MODES)
    print("\n".join(f"- {line}" for line in baselines_follow_the_mode(strict, defaults)))
    print("## Max-autotune")
    lines = [
        line
        for mode, title in MODES.items()
        for line in autotune_figures(pd.read_csv(args.summary / f"survey_{mode}.csv"), title)
    ]
    records = record_baselines(args.summary.parent)
    lines += autotune_build_figures(records) + autotune_choice_figures(records)
    print("\n".join(f"- {line}" for line in lines))
    failures = pd.read_csv(args.summary / "failures.csv")
    print("## Failures")
    print("\n".join(f"- {line}" for line in failure_figures(failures)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
