"""Several verified bundles side by side (other GPUs, drivers, toolchains, configs).

Each bundle is verified first (a bundle that fails is refused), its summary tables are built
from its own results and its own config (quoted in its manifest), and the tables are joined
on their keys. Only keys present in every bundle are compared; the `differences` table lists
what is not shared: config keys, the KernelBench pin and fingerprint fields that differ, and
rows that exist in some bundles only. Value columns are named `<column>[<bundle label>]`;
a bundle's label is its machine (GPU, driver, NVRTC, from its fingerprint) unless given. Each
row's `changed` names the value columns that are not the same in every bundle: in the
`toolchain` and `exhaustive` tables, variant by variant, what another toolchain changed.

Bundles are untrusted: each is read by `kbfuse.results.bundle` (bounded, names checked, manifest and
config against their schemas) and its records by `kbfuse.results.records`, so nothing a bundle says
can make the comparison read or write outside the bundle and the given work directory.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from kbfuse.errors import KbfuseError, matching
from kbfuse.results.bundle import open_bundle
from kbfuse.results.manifest import environment_of
from kbfuse.results.summary import build_tables, write_table
from kbfuse.results.tables import flatten
from kbfuse.survey.summary import COMPARED, survey_rows_of

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
    # the numerical contract across toolchains (a CUDA 12 bundle beside a CUDA 13 one)
    "toolchain": (
        ("compiler_contract",),
        ["variant", "route"],
        ["toolchain", "artifact_sha256", "ptx_ftz_count", "sass_ftz_count", "effective_ftz"],
    ),
    "exhaustive": (("exhaustive",), ["task", "variant"], ["differ", "bit_identical"]),
    # the survey's main tables (kbfuse.survey.summary), when a bundle holds a survey
    "survey": (("survey",), ["numerics", "task"], COMPARED),
}
COMPARISON_TABLES = [*SIDE_BY_SIDE, "differences"]


@dataclass
class BundleView:
    label: str
    path: Path
    manifest: dict
    tables: dict[str, pd.DataFrame]


LABEL_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9 ._+()/,:-]{0,79}$")


def check_label(label: str) -> str:
    """An explicit label: 1-80 characters, letters, digits, space and ._+()/,:- (it becomes
    a column name in the tables, inside [...])."""
    return matching(
        label,
        LABEL_PATTERN,
        f"label {label!r} is not usable: 1-80 characters from letters, digits, "
        "space and ._+()/,:- (starting with a letter or digit)",
    )


def _clean(value: Any) -> str:
    text = "" if value is None else str(value)
    text = "".join(c if c.isalnum() or c in " ._+()-" else "?" for c in text).strip()
    return text[:40] or "?"


def machine_label(manifest: dict) -> str:
    """The machine a bundle's results come from, from its fingerprint: GPU, driver, NVRTC."""
    env = environment_of(manifest)
    fp = manifest.get("fingerprint") or {}
    nvrtc = fp.get("nvrtc") if isinstance(fp.get("nvrtc"), dict) else {}
    toolchain = nvrtc.get("full_version") or env.get("nvrtc")
    return (
        f"{_clean(env.get('gpu'))}, driver {_clean(env.get('driver'))}, NVRTC {_clean(toolchain)}"
    )


def unique_labels(labels: Sequence[str]) -> list[str]:
    """Labels made unique by numbering repeats: `x`, `x #2`, ..."""
    out: list[str] = []
    for label in labels:
        candidate, n = label, 2
        while candidate in out:
            candidate, n = f"{label} #{n}", n + 1
        out.append(candidate)
    return out


def load_bundle(
    path: str | os.PathLike, label: str | None = None, workdir: str | os.PathLike | None = None
) -> BundleView:
    """Verify one bundle and build its summary tables; a failed verification is refused.

    Without a label the bundle is labelled by its machine (`machine_label`); the results are
    extracted under workdir and removed once the tables are built.
    """
    with open_bundle(path, workdir) as (report, results, manifest):
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
        tables["survey"] = survey_rows_of(results)
    label = machine_label(manifest) if label is None else label
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
    merged = merged.reset_index(drop=True)
    merged["changed"] = [
        _changed(row, values, [label for label, _ in frames]) for _, row in merged.iterrows()
    ]
    return merged, differences


def _changed(row: pd.Series, values: list[str], labels: list[str]) -> str:
    """The value columns whose values are not the same in every bundle, for one shared key."""

    def same(column: str) -> bool:
        cells = [row[f"{column}[{label}]"] for label in labels]
        return all(_cell(c) == _cell(cells[0]) for c in cells)

    return ", ".join(column for column in values if not same(column))


def _cell(value: Any) -> Any:
    return None if pd.isna(value) else value


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


def compare_bundles(
    paths: Sequence[str | os.PathLike],
    labels: Sequence[str] | None = None,
    workdir: str | os.PathLike | None = None,
) -> dict[str, pd.DataFrame]:
    """Side-by-side tables (SIDE_BY_SIDE) and `differences`.

    Columns are labelled by `labels` (one per bundle, checked by `check_label`) or else by
    each bundle's machine; repeated labels are numbered. Bundles are extracted, one at a
    time, under workdir (the system's temporary directory when None).
    """
    if len(paths) < 2:
        raise KbfuseError(f"compare needs at least two bundles, got {len(paths)}")
    if labels is not None:
        if len(labels) != len(paths):
            raise KbfuseError(f"{len(labels)} label(s) given for {len(paths)} bundles")
        labels = [check_label(label) for label in labels]
        if len(set(labels)) != len(labels):
            raise KbfuseError(f"labels {list(labels)} repeat one another")
    views = [load_bundle(p, labels[i] if labels else None, workdir) for i, p in enumerate(paths)]
    for view, label in zip(views, unique_labels([v.label for v in views]), strict=True):
        view.label = label
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
