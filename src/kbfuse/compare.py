"""Several verified bundles side by side (other GPUs, drivers, toolchains, configs).

Each bundle is verified first (a bundle that fails is refused), its summary tables are built
from its own results and its own config (quoted in its manifest), and the tables are joined
on their keys. Only keys present in every bundle are compared; the `differences` table lists
what is not shared: config keys, the KernelBench pin and fingerprint fields that differ, and
rows that exist in some bundles only. Value columns are named `<column>[<bundle label>]`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from kbfuse.bundle import open_bundle
from kbfuse.errors import KbfuseError
from kbfuse.summary import build_tables, flatten, write_table

ABSENT = "(absent)"

# comparison table -> (summary tables it joins, key columns, value columns)
SIDE_BY_SIDE: dict[str, tuple[tuple[str, ...], list[str], list[str]]] = {
    "ftz": (("compiler_contract",), ["variant", "route"], ["expected_ftz", "effective_ftz"]),
    "bit_identity": (
        ("correctness", "baseline_bit_identity"),
        ["task", "implementation"],
        ["bit_identical_cases", "cases", "elements_bit_equal", "elements"],
    ),
    "tail_time": (("timing_tail",), ["task", "impl", "method"], ["median_ms", "pct_of_floor"]),
    "full_time": (("timing_full",), ["task", "impl", "method"], ["median_ms"]),
}
COMPARISON_TABLES = [*SIDE_BY_SIDE, "differences"]


@dataclass
class BundleView:
    label: str
    path: Path
    manifest: dict
    tables: dict[str, pd.DataFrame]


def bundle_labels(paths: Sequence[str | os.PathLike]) -> list[str]:
    """Short unique labels: the file name without .tar.gz, numbered when repeated."""
    labels: list[str] = []
    for p in paths:
        name = Path(p).name
        for suffix in (".tar.gz", ".tgz"):
            if name.endswith(suffix):
                name = name[: -len(suffix)]
                break
        label, n = name, 2
        while label in labels:
            label, n = f"{name}-{n}", n + 1
        labels.append(label)
    return labels


def load_bundle(path: str | os.PathLike, label: str) -> BundleView:
    """Verify one bundle and build its summary tables; a failed verification is refused."""
    with open_bundle(path) as (report, results, manifest):
        if not report["ok"]:
            problems = (
                [c["path"] for c in report["changed"]]
                + report["missing"]
                + report["extra"]
                + report["duplicates"]
                + report["manifest_problems"]
            )
            raise KbfuseError(f"bundle {path} failed verification: {', '.join(problems)}")
        tables = build_tables(results, manifest["config"])
    return BundleView(label=label, path=Path(path), manifest=manifest, tables=tables)


def _rows_of(view: BundleView, sources: tuple[str, ...], keys: list[str], values: list[str]):
    parts = []
    for source in sources:
        df = view.tables[source]
        if source == "correctness":
            df = df.rename(columns={"variant": "implementation"})
        elif source == "baseline_bit_identity":
            df = df.rename(columns={"baseline": "implementation"})
        parts.append(df[keys + values])
    if len(parts) == 1:
        return parts[0]
    joined = pd.concat(parts, ignore_index=True)  # per task: variants, then baselines
    return joined.sort_values("task", kind="stable", ignore_index=True)


def _key_text(keys: list[str], row: tuple) -> str:
    return ", ".join(f"{k}={v}" for k, v in zip(keys, row, strict=True))


def side_by_side(
    views: Sequence[BundleView], name: str
) -> tuple[pd.DataFrame, list[dict[str, Any]]]:
    """One comparison table on shared keys, and difference rows for keys not shared."""
    sources, keys, values = SIDE_BY_SIDE[name]
    frames = [(v.label, _rows_of(v, sources, keys, values)) for v in views]
    merged = None
    for label, df in frames:
        part = df.rename(columns={c: f"{c}[{label}]" for c in values})
        merged = part if merged is None else merged.merge(part, on=keys, how="inner")
    key_sets = {label: list(df[keys].itertuples(index=False, name=None)) for label, df in frames}
    all_keys = list(dict.fromkeys(k for ks in key_sets.values() for k in ks))
    differences = []
    for key in all_keys:
        present = {label: key in set(ks) for label, ks in key_sets.items()}
        if not all(present.values()):
            differences.append(
                {
                    "section": f"rows:{name}",
                    "key": _key_text(keys, key),
                    **{label: "present" if ok else ABSENT for label, ok in present.items()},
                }
            )
    return merged.reset_index(drop=True), differences


def _leaves(node: Any) -> dict[str, str]:
    flat = flatten(node) if isinstance(node, dict) else {"": node}
    return {k: json.dumps(v, sort_keys=True) for k, v in flat.items()}


def differences_table(views: Sequence[BundleView], row_differences: list[dict]) -> pd.DataFrame:
    """Config keys, pin and fingerprint fields whose values differ, then unshared rows."""
    rows = []
    for section, field in (
        ("config", "config"),
        ("kernelbench_pin", "kernelbench_pin"),
        ("fingerprint", "fingerprint"),
    ):
        per_bundle = {v.label: _leaves(v.manifest.get(field) or {}) for v in views}
        keys = sorted({k for leaves in per_bundle.values() for k in leaves})
        for key in keys:
            if section == "fingerprint" and key in ("kind", "schema_version"):
                continue
            values = {label: leaves.get(key, ABSENT) for label, leaves in per_bundle.items()}
            if len(set(values.values())) > 1:
                rows.append({"section": section, "key": key, **values})
    rows += row_differences
    return pd.DataFrame(rows, columns=["section", "key", *[v.label for v in views]])


def compare_bundles(paths: Sequence[str | os.PathLike]) -> dict[str, pd.DataFrame]:
    """Side-by-side tables (ftz, bit_identity, tail_time, full_time) and `differences`."""
    if len(paths) < 2:
        raise KbfuseError(f"compare needs at least two bundles, got {len(paths)}")
    views = [load_bundle(p, label) for p, label in zip(paths, bundle_labels(paths), strict=True)]
    tables: dict[str, pd.DataFrame] = {}
    row_differences: list[dict] = []
    for name in SIDE_BY_SIDE:
        tables[name], diffs = side_by_side(views, name)
        row_differences += diffs
    tables["differences"] = differences_table(views, row_differences)
    return tables


def write_comparison(tables: dict[str, pd.DataFrame], outdir: str | os.PathLike) -> list[Path]:
    """Each comparison table as `<name>.csv` and `<name>.md` under outdir."""
    written: list[Path] = []
    for name, df in tables.items():
        written += write_table(df, outdir, name)
    return written
