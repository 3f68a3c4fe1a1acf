"""The summary's tables, one builder each: `<name>_table(res) -> pandas.DataFrame`.

Every table of `kbfuse.layout.TABLES` has its builder here, found by its name. Rows come only
from what the result files record (a `kbfuse.results.study.StudyResults`, provenance-checked):
a table holds exactly the tasks, variants, cases and measurements found in its inputs, in the
study's order (config order, the timed list), exact counts as integers.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from typing import Any

import pandas as pd

from kbfuse.errors import KbfuseError
from kbfuse.io import as_float
from kbfuse.results.study import BASELINE_IMPLS, StudyResults, record_field
from kbfuse.timing.measure import position_effect


def _names(text: str) -> list[str]:
    """Column names written as one whitespace-separated string."""
    return text.split()


def _num(value: Any) -> float:
    return math.nan if value is None else as_float(value)


def _max(values: Iterable[Any]) -> float:
    finite = [v for v in (_num(x) for x in values) if not math.isnan(v)]
    return max(finite) if finite else math.nan


# Exact integer columns (nullable Int64, so a missing count never turns into a float).
_INT_COLUMNS = frozenset(
    _names("""task cases official_passes historical_passes equal_nan_passes bit_identical_cases
    elements elements_bit_equal bit_equal rounds on_rounds off_rounds bytes_moved ptx_ftz_count
    sass_ftz_count sass_ftz_internal batch in_features out_features nonfinite_reference
    nonfinite_candidate nonfinite_mismatch weight_sets unwritten first_n others_n
    replays_per_pair balanced_rounds ptx_ftz twin_ptx_ftz sass_ftz twin_sass_ftz
    exhaustive_differ twin_exhaustive_differ cases_checked stage_elements stage_bit_equal
    height width tail_no_worse_cases tail_cases task_no_worse_cases task_cases""")
)
_TOTAL_COLUMNS = _names("""cases official_passes bit_identical_cases elements elements_bit_equal
    max_abs_diff max_ratio_official max_ratio_historical historical_passes
    equal_nan_passes""")
_CASE_COLUMNS = _names("""name group elements bit_equal official_pass historical_pass equal_nan_pass
    max_abs_diff max_ratio_official max_ratio_historical nonfinite_reference
    nonfinite_candidate nonfinite_mismatch""")


def _ordered(mapping: Mapping[str, Any], order: Iterable[str]) -> list[tuple[str, Any]]:
    """Items in the study's order (config, timed list); keys it does not name follow, sorted.

    Result JSON is written with sorted keys, so file order is alphabetical, not the study's.
    """
    order = [k for k in order if k in mapping]
    return [(k, mapping[k]) for k in order] + sorted(
        (k, v) for k, v in mapping.items() if k not in order
    )


def _frame(rows: list[dict], columns: list[str]) -> pd.DataFrame:
    df = pd.DataFrame(rows, columns=columns)
    for col in columns:
        if col in _INT_COLUMNS:
            df[col] = df[col].astype("Int64")
    return df


def _case_totals(cases: list[dict]) -> dict[str, Any]:
    """Integer counts summed over the case records themselves, largest errors maximised."""
    return {
        "cases": len(cases),
        "official_passes": sum(bool(c["official_pass"]) for c in cases),
        "historical_passes": sum(bool(c["historical_pass"]) for c in cases),
        "equal_nan_passes": sum(bool(c["equal_nan_pass"]) for c in cases),
        "bit_identical_cases": sum(int(c["bit_equal"]) == int(c["elements"]) for c in cases),
        "elements": sum(int(c["elements"]) for c in cases),
        "elements_bit_equal": sum(int(c["bit_equal"]) for c in cases),
        "max_abs_diff": _max(c["max_abs_diff"] for c in cases),
        "max_ratio_official": _max(c["max_ratio_official"] for c in cases),
        "max_ratio_historical": _max(c["max_ratio_historical"] for c in cases),
    }


def _case_row(case: dict) -> dict:
    return {c: _num(case[c]) if c.startswith("max_") else case[c] for c in _CASE_COLUMNS}


def correctness_table(res: StudyResults) -> pd.DataFrame:
    rows = [
        {
            "task": task,
            "variant": v,
            **_case_totals(corr["cases"]),
            "weight_sets": len(set(corr.get("weights_sha256", {}).values())),
            "passed": bool(corr["passed"]),
            "failing_checks": ", ".join(corr["failing_checks"]),
        }
        for (task, v), corr in res.correctness.items()
    ]
    cols = ["task", "variant", *_TOTAL_COLUMNS, "weight_sets", "passed", "failing_checks"]
    return _frame(rows, cols)


def correctness_cases_table(res: StudyResults) -> pd.DataFrame:
    rows = []
    for task in res.tasks:
        records = [(v, res.correctness[(task, v)]) for v in res.variants]
        records += _ordered(res.baselines[task]["implementations"], res.config["baselines"])
        for impl, rec in records:
            rows += [{"task": task, "implementation": impl, **_case_row(c)} for c in rec["cases"]]
    return _frame(rows, ["task", "implementation", *_CASE_COLUMNS])


def baseline_bit_identity_table(res: StudyResults) -> pd.DataFrame:
    rows = [
        {
            "task": task,
            "baseline": impl,
            "reference": "eager",
            **_case_totals(rec["cases"]),
            "passed": bool(rec["passed"]),
            "failing_checks": ", ".join(rec["failing_checks"]),
        }
        for task, base in res.baselines.items()
        for impl, rec in _ordered(base["implementations"], res.config["baselines"])
    ]
    cols = ["task", "baseline", "reference", *_TOTAL_COLUMNS, "passed", "failing_checks"]
    return _frame(rows, cols)


def render_setting(record: Any) -> str:
    """A CUDA cache record (or any flat mapping) as `key=value; ...`, keys sorted."""
    if not isinstance(record, Mapping):
        return "" if record is None else str(record)
    return "; ".join(f"{k}={record[k]}" for k in sorted(record))


_CONTRACT_COLUMNS = _names("""variant route kernel launch requested_options actual_options
    implicit_options compiler toolchain arch artifact_kind ptx_ftz_count sass_ftz_count
    sass_ftz_internal requested_ftz expected_ftz effective_ftz mismatch finding artifact_sha256
    cuda_cache_compile cuda_cache_verify""")


def render_launch(record: Any) -> str:
    """A compile record's launch plan in one line: the default, then per-kernel exceptions."""
    if not isinstance(record, Mapping):
        return ""

    def one(launch: Mapping) -> str:
        text = f"{launch['mode']} x{launch['threads']}"
        if launch.get("blocks_per_sm"):
            text += f" {launch['blocks_per_sm']}/SM"
        return text

    parts = [one(record["default"])]
    parts += [f"{name}: {one(launch)}" for name, launch in record.get("per_kernel", {}).items()]
    return "; ".join(parts)


def compiler_contract_table(res: StudyResults) -> pd.DataFrame:
    rows = []
    for v in res.variants:
        meta, ver = res.compile_meta[v], res.verify[v]
        compiler = meta["compiler"]
        finding = ver.get("finding")
        if not finding and ver["mismatch"]:
            finding = f"expected ftz={ver['expected_ftz']} but effective ftz={ver['effective_ftz']}"
        rows.append(
            {
                "variant": v,
                "route": meta["route"],
                "kernel": meta["kernel"],
                "launch": render_launch(meta.get("launch")),
                "requested_options": " ".join(meta["requested_options"]),
                "actual_options": " ".join(meta["actual_options"]),
                "implicit_options": " ".join(meta["implicit_options"]),
                "compiler": f"{compiler['name']} {compiler['version']}",
                "toolchain": toolchain(compiler),
                "arch": meta["arch"],
                "artifact_kind": meta["artifact_kind"],
                "ptx_ftz_count": meta["ptx_ftz_count"],
                "sass_ftz_count": meta["sass_ftz_count"],
                "sass_ftz_internal": meta.get("sass_ftz_in_internal_helpers"),
                "requested_ftz": ver["requested_ftz"],
                "expected_ftz": ver["expected_ftz"],
                "effective_ftz": ver["effective_ftz"],
                "mismatch": bool(ver["mismatch"]),
                "finding": finding or "",
                "artifact_sha256": meta["artifact_sha256"][:12],
                "cuda_cache_compile": render_setting(meta.get("cuda_cache")),
                "cuda_cache_verify": render_setting(ver.get("cuda_cache")),
            }
        )
    return _frame(rows, _CONTRACT_COLUMNS)


_MEASURE_COLUMNS = _names("""impl method rounds median_ms q1_ms q3_ms eager_over_impl
    eager_over_impl_q1 eager_over_impl_q3 best_compiled best_compiled_over_impl
    best_compiled_over_impl_q1 best_compiled_over_impl_q3""")
_FLOOR_COLUMNS = ["bytes_moved", "floor_ms", "pct_of_floor"]


def _ratio_fields(prefix: str, ratio: Mapping | None) -> dict[str, float]:
    if ratio is None:
        return {}
    return {
        prefix: _num(ratio["median"]),
        f"{prefix}_q1": _num(ratio["q1"]),
        f"{prefix}_q3": _num(ratio["q3"]),
    }


def _measurement_rows(
    measurements: Mapping, ratios: Mapping, scope: str, order: Iterable[str]
) -> list[dict]:
    """Rows for every `scope/method` key and implementation recorded; ratios for variants.

    Ratios are per-round baseline_ms / impl_ms (> 1: the implementation is faster).
    """
    rows = []
    for key, per_impl in measurements.items():
        key_scope, _, method = key.partition("/")
        if key_scope != scope:
            continue
        for impl, m in _ordered(per_impl, order):
            row = {
                "impl": impl,
                "method": method,
                "rounds": len(m["samples_ms"]),
                "median_ms": _num(m["median_ms"]),
                "q1_ms": _num(m["q1_ms"]),
                "q3_ms": _num(m["q3_ms"]),
            }
            ratio = ratios.get(key, {}).get(impl)
            if ratio is not None:
                best = ratio.get("vs_best_compiled")  # absent when no compiled baseline ran
                row.update(_ratio_fields("eager_over_impl", ratio.get("vs_eager")))
                row.update(_ratio_fields("best_compiled_over_impl", best))
                row["best_compiled"] = best["baseline"] if best else None
            rows.append(row)
    return rows


def copy_floor_gbps(res: StudyResults) -> float:
    path = res.paths[("env",)]
    gbps = _num(record_field(res.fingerprint, "copy_bandwidth.gbps", path))
    if not gbps > 0:
        raise KbfuseError(f"{path}: field copy_bandwidth.gbps is {gbps!r}, not a bandwidth")
    return gbps


def _floor_fields(tail_bytes: Any, gbps: float, median_ms: float) -> dict[str, Any]:
    """The copy-bandwidth floor: time to move the tail's bytes at the measured copy rate."""
    floor_ms = int(tail_bytes) / (gbps * 1e9) * 1e3
    return {
        "bytes_moved": int(tail_bytes),
        "floor_ms": floor_ms,
        "pct_of_floor": 100.0 * floor_ms / median_ms if median_ms > 0 else math.nan,
    }


def _kind(impl: str) -> str:
    return "baseline" if impl in BASELINE_IMPLS else "variant"


def timing_table(res: StudyResults, scope: str) -> pd.DataFrame:
    """scope "full" or "tail"; tails also get bytes moved and % of the copy-bandwidth floor."""
    rows = []
    gbps = copy_floor_gbps(res) if scope == "tail" else math.nan
    for task, tim in res.timing.items():
        for m in _measurement_rows(tim["measurements"], tim["ratios"], scope, tim["timed"]):
            row = {"task": task, "kind": _kind(m["impl"]), **m}
            if scope == "tail":
                row.update(_floor_fields(tim["tail_bytes"], gbps, m["median_ms"]))
            rows.append(row)
    cols = ["task", "kind", *_MEASURE_COLUMNS] + (_FLOOR_COLUMNS if scope == "tail" else [])
    return _frame(rows, cols)


LINEAR_SHAPE_COLUMNS = ("batch", "in_features", "out_features")


def _small_shape_columns(res: StudyResults) -> list[str]:
    """The small shapes' size columns: the linear study's (batch, in_features, out_features),
    then any other size a record names (a convolution's height and width), in record order."""
    columns = list(LINEAR_SHAPE_COLUMNS)
    for ctl in res.controls.values():
        for key in ctl["small_shape"]["shape"]:
            if key != "seed" and key not in columns:
                columns.append(key)
    return columns


def small_shapes_table(res: StudyResults) -> pd.DataFrame:
    rows = []
    gbps = copy_floor_gbps(res)
    for task, ctl in res.controls.items():
        small = ctl["small_shape"]
        shape = small["shape"]
        scopes = dict.fromkeys(k.partition("/")[0] for k in small["measurements"])
        for scope in scopes:
            order = small.get("timed", res.config["baselines"] + res.variants)
            for m in _measurement_rows(small["measurements"], small["ratios"], scope, order):
                row = {"task": task, **shape, "scope": scope, "kind": _kind(m["impl"]), **m}
                if scope == "tail" and "tail_bytes" in small:
                    row.update(_floor_fields(small["tail_bytes"], gbps, m["median_ms"]))
                rows.append(row)
    cols = ["task", *_small_shape_columns(res), "scope", "kind", *_MEASURE_COLUMNS]
    return _frame(rows, cols + _FLOOR_COLUMNS)


def ftz_cost_table(res: StudyResults) -> pd.DataFrame:
    rows = []
    for task, ctl in res.controls.items():
        for route, pair in ctl["ftz_cost"].items():
            effective = pair.get("effective_ftz", {})
            row = {
                "task": task,
                "route": route,
                "ftz_on": pair["ftz_on"],
                "ftz_off": pair["ftz_off"],
                "effective_ftz_on": effective.get("on"),
                "effective_ftz_off": effective.get("off"),
            }
            for side in ("on", "off"):
                m = pair[side]
                row[f"{side}_rounds"] = len(m["samples_ms"])
                for stat in ("median_ms", "q1_ms", "q3_ms"):
                    row[f"{side}_{stat}"] = _num(m[stat])
            ratio = pair["ratio_on_over_off"]
            row.update(_ratio_fields("on_over_off", ratio))
            row["on_over_off_balanced"] = _num(ratio.get("balanced"))
            row["balanced_rounds"] = ratio.get("balanced_rounds")
            row["replays_per_pair"] = pair.get("replays_per_pair")
            rows.append(row)
    cols = _names("""task route ftz_on ftz_off effective_ftz_on effective_ftz_off replays_per_pair
        on_rounds on_median_ms on_q1_ms on_q3_ms off_rounds off_median_ms off_q1_ms off_q3_ms
        on_over_off on_over_off_q1 on_over_off_q3 on_over_off_balanced balanced_rounds""")
    return _frame(rows, cols)


def tiny_values_table(res: StudyResults) -> pd.DataFrame:
    rows = [
        {"task": task, "variant": v, **_case_row(case)}
        for task, ctl in res.controls.items()
        for v, rec in _ordered(ctl["tiny_values"], res.variants)
        for case in rec["cases"]
    ]
    return _frame(rows, ["task", "variant", *_CASE_COLUMNS])


def exhaustive_table(res: StudyResults) -> pd.DataFrame:
    """Every float32 input through each variant's tail: how many outputs differ from eager."""
    rows = []
    for task, ctl in res.controls.items():
        for v, rec in _ordered(ctl.get("exhaustive", {}), res.variants):
            rows.append(
                {
                    "task": task,
                    "variant": v,
                    "kernel": res.compile_meta[v]["kernel"],
                    "inputs": int(rec["inputs"]),
                    "differ": int(rec["differ"]),
                    "nan_payload_only": int(rec["nan_payload_only"]),
                    "unwritten": int(rec["unwritten"]) if "unwritten" in rec else None,
                    "bit_identical": bool(rec["bit_identical"]),
                    "first_difference": _first_difference(rec["examples"]),
                }
            )
    cols = _names("task variant kernel inputs differ nan_payload_only unwritten bit_identical")
    return _frame(rows, [*cols, "first_difference"])


def _first_difference(examples: list[dict]) -> str:
    if not examples:
        return ""
    first = examples[0]
    return f"input {first['input']}: eager {first['eager']}, kernel {first['kernel']}"


TAIL_CONTROLS = "tail controls"


def control_bit_equality_table(res: StudyResults) -> pd.DataFrame:
    """Bit-equal element counts per task x variant x control set.

    Control sets: each tiny-value case by name, and all `tail_control` correctness cases of
    the task together (named TAIL_CONTROLS).
    """
    rows = []
    for task in res.tasks:
        tiny = res.controls[task]["tiny_values"]
        for v in res.variants:
            sets = [(c["name"], [c]) for c in tiny.get(v, {}).get("cases", [])]
            tail = [c for c in res.correctness[(task, v)]["cases"] if c["group"] == "tail_control"]
            if tail:
                sets.append((TAIL_CONTROLS, tail))
            for name, cases in sets:
                elements = sum(int(c["elements"]) for c in cases)
                equal = sum(int(c["bit_equal"]) for c in cases)
                rows.append(
                    {
                        "task": task,
                        "variant": v,
                        "control_set": name,
                        "cases": len(cases),
                        "elements": elements,
                        "elements_bit_equal": equal,
                        "bit_equal_fraction": equal / elements if elements else math.nan,
                    }
                )
    cols = _names("""task variant control_set cases elements elements_bit_equal
        bit_equal_fraction""")
    return _frame(rows, cols)


def witness81_table(res: StudyResults) -> pd.DataFrame:
    """Every variant's output at the witness inputs beside eager's, value and bits."""
    cols = _names("""variant effective_ftz input output output_bits reference reference_bits
        bit_equal""")
    w = res.witness81
    if w is None:
        return pd.DataFrame([], columns=cols)
    path = res.paths[("witness81",)]
    reference = {_num(r["input"]): r for r in w["reference"]}
    rows = []
    for v, records in _ordered(w["variants"], res.variants):
        for r in records:
            ref = reference.get(_num(r["input"]))
            if ref is None:
                raise KbfuseError(f"{path}: variants.{v} input {r['input']!r} has no reference")
            rows.append(
                {
                    "variant": v,
                    "effective_ftz": res.verify[v]["effective_ftz"] if v in res.verify else None,
                    "input": _num(r["input"]),
                    "output": _num(r["output"]),
                    "output_bits": r["output_bits"],
                    "reference": _num(ref["output"]),
                    "reference_bits": ref["output_bits"],
                    "bit_equal": bool(r["bit_equal"]),
                }
            )
    return pd.DataFrame(rows, columns=cols)


def toolchain(compiler: Mapping) -> str:
    """The compiler's name and full version (e.g. "nvrtc 12.9.86"), its major.minor otherwise."""
    return f"{compiler['name']} {compiler.get('full_version') or compiler['version']}"


def toolchain_twins(res: StudyResults) -> list[tuple[str, str]]:
    """(variant, twin) pairs: the same route, kernel source and options compiled by another
    compiler version; the variant is the one on the default toolchain (no `nvrtc` named)."""

    def key(v: str) -> tuple:
        meta = res.compile_meta[v]
        return (meta["route"], meta["source_sha256"], tuple(meta["requested_options"]))

    pinned = [v for v in res.variants if res.config["variants"][v].get("nvrtc") is not None]
    default = [v for v in res.variants if v not in pinned]
    return [
        (v, twin)
        for twin in pinned
        for v in default
        if key(v) == key(twin)
        and res.compile_meta[v]["compiler"]["version"]
        != res.compile_meta[twin]["compiler"]["version"]
    ]


def _variant_evidence(res: StudyResults, v: str) -> dict[str, Any]:
    """What the toolchains table shows of one variant: its FTZ counts and effect, and its
    bits on every float32 input (exhaustive, all tasks) and at the task-81 witness."""
    meta = res.compile_meta[v]
    exhaustive = [
        ctl["exhaustive"][v] for ctl in res.controls.values() if v in ctl.get("exhaustive", {})
    ]
    witness = (res.witness81 or {}).get("variants", {}).get(v)
    return {
        "toolchain": toolchain(meta["compiler"]),
        "ptx_ftz": meta["ptx_ftz_count"],
        "sass_ftz": meta["sass_ftz_count"],
        "effective_ftz": res.verify[v]["effective_ftz"],
        "exhaustive_differ": sum(int(e["differ"]) for e in exhaustive) if exhaustive else None,
        "exhaustive_identical": all(bool(e["bit_identical"]) for e in exhaustive)
        if exhaustive
        else None,
        "witness81_bit_equal": all(bool(r["bit_equal"]) for r in witness) if witness else None,
    }


def toolchains_table(res: StudyResults) -> pd.DataFrame:
    """Each variant beside its twin on another toolchain: artifact, FTZ in PTX and SASS,
    effective FTZ on the device, every float32 input, the task-81 witness."""
    fields = _names("""toolchain ptx_ftz sass_ftz effective_ftz exhaustive_differ
        exhaustive_identical witness81_bit_equal""")
    rows = []
    for v, twin in toolchain_twins(res):
        row = {
            "variant": v,
            "twin": twin,
            "route": res.compile_meta[v]["route"],
            "kernel": res.compile_meta[v]["kernel"],
            "options": " ".join(res.compile_meta[v]["requested_options"]),
            "artifact_equal": res.compile_meta[v]["artifact_sha256"]
            == res.compile_meta[twin]["artifact_sha256"],
        }
        for side, name in (("", v), ("twin_", twin)):
            row.update({f"{side}{k}": value for k, value in _variant_evidence(res, name).items()})
        rows.append(row)
    cols = ["variant", "twin", "route", "kernel", "options", "artifact_equal"]
    cols += [f"{side}{k}" for k in fields for side in ("", "twin_")]
    return _frame(rows, cols)


def margin_audit_table(res: StudyResults) -> pd.DataFrame:
    """One row per audited record (case or aggregate); `flips`: the predicates disagree."""
    rows = []
    for r in record_field(res.margin_audit, "cases", res.paths[("margin_audit",)]):
        margin = r.get("margin") or {}
        rows.append(
            {
                "file": r["file"],
                "path": r["path"],
                "record": r["record"],
                "name": r.get("name"),
                "group": r.get("group"),
                "max_ratio_official": _num(r["max_ratio_official"]),
                "max_ratio_historical": _num(r["max_ratio_historical"]),
                "official_within": bool(r["official_within"]),
                "historical_within": bool(r["historical_within"]),
                "flips": bool(r["flips"]),
                "flip": r.get("flip"),
                "margin_predicate": margin.get("predicate"),
                "margin_abs_log_ratio": _num(margin.get("abs_log_ratio")),
            }
        )
    cols = _names("""file path record name group max_ratio_official max_ratio_historical
        official_within historical_within flips flip margin_predicate
        margin_abs_log_ratio""")
    return pd.DataFrame(rows, columns=cols)


def direction_witness_table(res: StudyResults) -> pd.DataFrame:
    d = res.direction_witness
    path = res.paths[("direction_witness",)]
    cols = _names("""atol rtol a a_bits b b_bits allclose_a_b allclose_b_a abs_diff allowed_a_b
        allowed_b_a torch""")
    return pd.DataFrame([{c: record_field(d, c, path) for c in cols}], columns=cols)


def skipped_table(res: StudyResults) -> pd.DataFrame:
    """Implementations gated out of timing: in the timing stage, and again at the small shape
    (the controls' `small_shape.skipped` also repeats the main-shape gate)."""
    stages = [("timing", task, tim) for task, tim in res.timing.items()]
    stages += [("small_shape", task, ctl["small_shape"]) for task, ctl in res.controls.items()]
    rows = [
        {
            "task": task,
            "stage": stage,
            "implementation": name,
            "reason": rec["reason"],
            "failing_checks": ", ".join(rec.get("failing_checks") or []),
        }
        for stage, task, record in stages
        for name, rec in record.get("skipped", {}).items()
    ]
    return _frame(rows, ["task", "stage", "implementation", "reason", "failing_checks"])


def _position_blocks(res: StudyResults):
    """(task, block, {implementation: measurement}) of every timed block of the run."""
    for task, tim in res.timing.items():
        for key, per_impl in tim["measurements"].items():
            yield task, key, per_impl
    for task, ctl in res.controls.items():
        for key, per_impl in ctl["small_shape"].get("measurements", {}).items():
            yield task, f"small/{key}", per_impl
        for route, pair in ctl.get("ftz_cost", {}).items():
            yield (
                task,
                f"ftz_cost/{route}",
                {pair["ftz_on"]: pair["on"], pair["ftz_off"]: pair["off"]},
            )


def position_effect_table(res: StudyResults) -> pd.DataFrame:
    """Per timed block, what running first (or last) in a round does to a sample:
    `kbfuse.timing.measure.position_effect` over the block's implementations pooled, each
    sample relative to its round's and its implementation's level (1 = no effect), beside the
    smallest and largest ratio of any position, the block's own spread. Records without
    positions (made before they were recorded) give no row."""
    rows = []
    for task, block, per_impl in _position_blocks(res):
        if not per_impl or any("positions" not in m for m in per_impl.values()):
            continue
        effect = position_effect(
            {name: m["samples_ms"] for name, m in per_impl.items()},
            {name: m["positions"] for name, m in per_impl.items()},
        )
        if effect is None:
            continue
        rounds = len(next(iter(per_impl.values()))["samples_ms"])
        rows.append(
            {"task": task, "block": block, "implementations": len(per_impl), "rounds": rounds}
            | effect
        )
    cols = _names("""task block implementations rounds first_n others_n first_over_others
        last_over_others each_position_min each_position_max""")
    return _frame(rows, cols)


def flatten(node: Any, prefix: str = "") -> dict[str, Any]:
    """Nested mappings as dotted keys; lists and scalars are leaves."""
    if isinstance(node, Mapping):
        out: dict[str, Any] = {}
        for key in sorted(node, key=str):
            out.update(flatten(node[key], f"{prefix}.{key}" if prefix else str(key)))
        return out
    return {prefix: node}


CONTRACT_FIELDS = ("atol", "rtol", "tolerance_source", "argument_order", "seed", "trials")


def environment_table(res: StudyResults) -> pd.DataFrame:
    """The fingerprint, then the official contract the run was judged by (`official.*`)."""
    rows = [
        {"field": k, "value": json.dumps(v) if isinstance(v, list) else v}
        for k, v in flatten(res.fingerprint).items()
        if k not in ("kind", "schema_version")
    ]
    contract = {f"official.{k}": res.contract[k] for k in CONTRACT_FIELDS}
    rows += [
        {"field": k, "value": json.dumps(v) if isinstance(v, list) else v}
        for k, v in flatten(contract).items()
    ]
    return pd.DataFrame(rows, columns=["field", "value"])


_CONTRACT_TABLE_COLUMNS = _names("""task variant kernel contract holds correctness_holds
    cases_checked failing_cases exhaustive_differ stage_elements stage_bit_equal
    reduction_worst_ratio tail_no_worse_cases tail_cases task_no_worse_cases task_cases
    description""")


def contract_table(res: StudyResults) -> pd.DataFrame:
    """Per task x variant: the contract its tail names (kbfuse.checks.contract) and whether it
    holds: on every correctness case, and for a pointwise tail also on every float32 input (the
    controls' exhaustive count). A reducing tail's columns: its element-wise stages' bits, the
    largest kernel error over eager's against the deciding float64 reference (<= 1 on every
    case is the contract), and on how many cases the kernel is no worse than eager against
    the wider references (the tail, the whole task in float64), which are measured, not
    decisive."""
    from kbfuse.checks.contract import DECIDING_REFERENCE, no_worse_count, worst_margin

    rows = []
    for (task, v), corr in res.correctness.items():
        block = corr.get("contract")
        if block is None:
            continue
        exhaustive = res.controls.get(task, {}).get("exhaustive", {}).get(v)
        cases = block["cases"]
        stage = [c["stage"] for c in cases]
        holds = bool(block["passed"])
        if block["name"] == "bit-identical":
            holds = holds and exhaustive is not None and bool(exhaustive["bit_identical"])
        row = {
            "task": task,
            "variant": v,
            "kernel": res.compile_meta[v]["kernel"],
            "contract": block["name"],
            "holds": holds,
            "correctness_holds": bool(block["passed"]),
            "cases_checked": int(block["cases_checked"]),
            "failing_cases": ", ".join(block["failing"]),
            "exhaustive_differ": int(exhaustive["differ"]) if exhaustive else None,
            "stage_elements": sum(int(c["elements"]) for c in stage) if stage else None,
            "stage_bit_equal": sum(int(c["bit_equal"]) for c in stage) if stage else None,
            "reduction_worst_ratio": worst_margin(cases, DECIDING_REFERENCE),
            "description": block["description"],
        }
        for prefix, reference in (("tail", "float64_tail"), ("task", "float64_task")):
            no_worse, compared = no_worse_count(cases, reference)
            row[f"{prefix}_no_worse_cases"] = no_worse if compared else None
            row[f"{prefix}_cases"] = compared if compared else None
        rows.append(row)
    return _frame(rows, _CONTRACT_TABLE_COLUMNS)


_PREDICTION_COLUMNS = _names("""task numerics variant survey_best_compiled survey_best_ms
    survey_library_ms survey_outside_ms floor_ms predicted_ms predicted_speedup fused_ms
    best_compiled best_compiled_ms speedup_vs_best_compiled paired_speedup_vs_best_compiled
    fused_over_predicted tail_ms tail_pct_of_floor meets_speedup_target meets_floor_target""")


def prediction_table(res: StudyResults) -> pd.DataFrame:
    """Per task x timed variant: the survey's prediction (library time + memory floor) beside
    the measured whole-program time and the tail against its copy floor
    (kbfuse.results.prediction)."""
    from kbfuse.results.prediction import prediction_rows

    gbps = copy_floor_gbps(res)
    rows = []
    for task, tim in res.timing.items():
        survey = res.survey[task]
        rows += prediction_rows(task, survey["numerics"], survey, tim, res.variants, gbps)
    return _frame(rows, _PREDICTION_COLUMNS)


def timing_full_table(res: StudyResults) -> pd.DataFrame:
    return timing_table(res, "full")


def timing_tail_table(res: StudyResults) -> pd.DataFrame:
    return timing_table(res, "tail")
