"""Summary tables and plots from result files that follow docs/contracts.md.

`write_study` writes a complete, internally consistent set of result files (the layout of
results/) for a config; test_bundle.py and test_compare.py reuse it. The numbers are made
up but every field is the one the contract names, so the tables are checked against them.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import json
import random
import re
import statistics
from pathlib import Path

import pandas as pd
import pytest
from contracts import contract_record

from kbfuse import layout
from kbfuse.checks import protocol
from kbfuse.checks.numerics import f32_bits_hex
from kbfuse.errors import KbfuseError
from kbfuse.io import read_json, sha256_bytes, write_bytes, write_json
from kbfuse.results import summary, tables

REPO = Path(__file__).resolve().parents[1]
COMMIT = "423217d9fda91e0c2d67e4a43bf62f96f6d104f1"
TASK_NAMES = {
    53: "53_Gemm_Scaling_Hardtanh_GELU.py",
    81: "81_Gemm_Swish_Divide_Clamp_Tanh_Clamp.py",
    95: "95_Matmul_Add_Swish_Tanh_GELU_Hardtanh.py",
}
TOLERANCE = {"atol": 1.0e-4, "rtol": 1.0e-4}  # the test evaluator's (tests/contracts.py)
KEYS = ("full/events", "full/graph", "tail/events", "tail/graph")
TINY_CASES = ("dense_-110_-60", "subnormals", "signed_zeros", "infinities", "nan")


def make_config(
    tasks=(53, 81),
    variants=("cupy-default", "nvrtc-cubin-noftz", "nvrtc-cubin-ftz", "nvrtc-ptx-noftz"),
    rounds=5,
) -> dict:
    specs = {
        "cupy-default": ("cupy-default", []),
        "nvrtc-cubin-noftz": ("nvrtc-cubin", ["--ftz=false"]),
        "nvrtc-cubin-ftz": ("nvrtc-cubin", ["--ftz=true"]),
        "nvrtc-ptx-noftz": ("nvrtc-ptx", ["--ftz=false"]),
        "nvrtc-ptx-ftz": ("nvrtc-ptx", ["--ftz=true"]),
    }
    return {
        "kernelbench": {"url": "/mirror/KernelBench", "commit": COMMIT, "level": 2},
        "tasks": list(tasks),
        "seeds": [0, 1],
        "distributions": ["uniform", "normal"],
        "arch": "sm_90",
        "variants": {
            v: {
                "route": specs[v][0],
                "kernel": "naive",
                "options": ["--std=c++11", "--fmad=false", *specs[v][1]],
            }
            for v in variants
        },
        "baselines": ["eager", "torchscript", "inductor"],
        "timing": {
            "warmup": 2,
            "rounds": rounds,
            "invocations_per_pair": 5,
            "order_seed": 913,
            "input_seed": 42,
        },
        "controls": {
            "small_shape": {"batch": 128, "in_features": 1024, "out_features": 1024},
            "tiny_values": {"low": -110.0, "high": -60.0, "dense_count": 1024},
            "ftz_cost": {"rounds": rounds, "replays_per_pair": 10},
            "witness81_inputs": [-88.0, -87.5],
        },
    }


def flushes(config: dict, variant: str) -> bool:
    spec = config["variants"][variant]
    return spec["route"] == "cupy-default" or "--ftz=true" in spec["options"]


# ---------------------------------------------------------------- record builders


def case(name, group, elements, bit_equal, ratio=0.25):
    """A case record; the historical ratio is a hair above the official one, as for a
    candidate slightly larger in magnitude than the reference."""
    official = 0.0 if bit_equal == elements else ratio
    historical = official * 1.0001
    return {
        "name": name,
        "group": group,
        "elements": elements,
        "bit_equal": bit_equal,
        "bit_equal_fraction": bit_equal / elements,
        "official_pass": official <= 1,
        "historical_pass": historical <= 1,
        "equal_nan_pass": True,
        "max_abs_diff": 0.0 if bit_equal == elements else 2e-4 * official,
        "max_ratio_official": official,
        "max_ratio_historical": historical,
        "nonfinite_reference": 0,
        "nonfinite_candidate": 0,
        "nonfinite_mismatch": 0,
    }


def correctness_cases(config, task, flush, failing=False, edge=False):
    """Seeds x distributions, the timing input, tail controls, graph replay.

    failing: graph replay exceeds the tolerance; edge: the first case passes the official
    predicate and fails the historical one (a margin-audit flip).
    """
    cases = []
    for seed in config["seeds"]:
        for dist in config["distributions"]:
            cases.append(case(f"{dist}_seed{seed}", "full_program", 4096, 4096 - 3 * seed, 0.1))
    if edge:
        cases[0] = case(cases[0]["name"], "full_program", 4096, 4090, 0.99995)
    cases.append(case("timing_input", "timing_input", 4096, 4096))
    cases.append(case("boundaries", "tail_control", 64, 64))
    cases.append(case("nonfinite", "tail_control", 16, 12 if flush else 16, 0.0))
    cases.append(case("graph_replay", "graph_replay", 4096, 4091 if failing else 4096, 3.5))
    return cases


def totals(cases):
    return {
        "cases": len(cases),
        "official_passes": sum(c["official_pass"] for c in cases),
        "bit_identical_cases": sum(c["bit_equal"] == c["elements"] for c in cases),
        "elements": sum(c["elements"] for c in cases),
        "elements_bit_equal": sum(c["bit_equal"] for c in cases),
        "max_abs_diff": max(c["max_abs_diff"] for c in cases),
        "max_ratio_official": max(c["max_ratio_official"] for c in cases),
        "max_ratio_historical": max(c["max_ratio_historical"] for c in cases),
        "equal_nan_passes": sum(c["equal_nan_pass"] for c in cases),
    }


def stats(samples):
    q1, median, q3 = statistics.quantiles(samples, n=4, method="inclusive")
    return {"samples_ms": samples, "median_ms": median, "q1_ms": q1, "q3_ms": q3}


def ratio_stats(base, var):
    per_round = [b / v for b, v in zip(base, var, strict=True)]
    q1, median, q3 = statistics.quantiles(per_round, n=4, method="inclusive")
    return {"median": median, "q1": q1, "q3": q3}


def measurements_and_ratios(impls, variants, rounds, rng, base_ms):
    measurements, ratios = {}, {}
    for key in KEYS:
        scale = base_ms * (1.0 if key.startswith("full") else 0.05)
        samples = {
            impl: [scale * (1 + 0.1 * i) * rng.uniform(0.98, 1.02) for _ in range(rounds)]
            for i, impl in enumerate(impls)
        }
        measurements[key] = {impl: stats(s) for impl, s in samples.items()}
        compiled = [b for b in ("torchscript", "inductor") if b in samples]
        best = min(compiled, key=lambda b: measurements[key][b]["median_ms"])
        ratios[key] = {}
        for v in variants:
            r = {
                f"vs_{b}": ratio_stats(samples[b], samples[v]) for b in samples if b not in variants
            }
            r["vs_best_compiled"] = {"baseline": best, **ratio_stats(samples[best], samples[v])}
            ratios[key][v] = r
    return measurements, ratios


CACHE = {
    "CUDA_CACHE_DISABLE": "1",
    "CUDA_CACHE_PATH": "private-empty",
    "CUPY_CACHE_DIR": "private-empty",
    "CUPY_CACHE_IN_MEMORY": "1",
    "isolated": True,
}
SUBNORMAL_81 = -2.6640246534862188e-37  # eager task 81 at -88 (the study's witness)


@functools.cache
def direction_witness_record() -> dict:
    return protocol.direction_witness(1e-4, 1e-4)


def fingerprint(gpu: str, driver: str) -> dict:
    return {
        "kind": "env",
        "schema_version": 1,
        "gpu": {
            "name": gpu,
            "sm_count": 132,
            "compute_capability": "9.0",
            "memory_bytes": 150_000_000_000,
        },
        "driver": {
            "cuda_driver_api": {"value": 13000, "cuda": "13.0"},
            "nvidia_smi": {"driver_version": driver, "name": gpu},
        },
        "cuda_runtime": {"value": 13000, "cuda": "13.0"},
        "torch": "2.11.0+cu130",
        "torch_cuda": "13.0",
        "cupy": "14.2.0",
        "nvrtc": {"version": "13.0", "full_version": "13.0.88", "library": "/lib/libnvrtc.so.13"},
        "triton": "3.6.0",
        "python": "3.12.3",
        "numpy": "2.2.6",
        "platform": "Linux-x86_64",
        "copy_bandwidth": {
            "bytes_moved": 2 << 30,
            "median_ms": 0.5,
            "gbps": 4294.967296,
            "method": "torch copy_ d2d, CUDA events",
        },
        "notes": {},
        "cuda_cache": CACHE,
    }


def exhaustive_record(config: dict, v: str) -> dict:
    """Flushing variants differ on 1000 inputs (-0.0 for a tiny negative), others on none."""
    differ = 1000 if flushes(config, v) else 0
    examples = [{"input": "0xc2b00000", "eager": "0x82b54ddb", "kernel": "0x80000000"}]
    return {
        "inputs": 1 << 32,
        "differ": differ,
        "nan_payload_only": 0,
        "examples": examples if differ else [],
        "bit_identical": differ == 0,
    }


def compile_meta(config: dict, v: str, blob: bytes) -> dict:
    spec = config["variants"][v]
    implicit = ["-ftz=true"] if spec["route"] == "cupy-default" else []
    ftz, ptx = flushes(config, v), spec["route"] == "nvrtc-ptx"
    return {
        "kind": "compile",
        "schema_version": 1,
        "variant": v,
        "route": spec["route"],
        "kernel": "naive",
        "source": "kernels/naive.cu",
        "source_sha256": "ab" * 32,
        "launch": {
            "default": {"mode": "per-element", "threads": 256},
            "per_kernel": {
                "tail53": {
                    "mode": "grid-stride",
                    "threads": 128,
                    "blocks_per_sm": 4,
                    "items_per_thread": 8,
                }
            },
        },
        "requested_options": spec["options"],
        "implicit_options": implicit,
        "actual_options": spec["options"] + implicit,
        "arch": config["arch"],
        "artifact_kind": "ptx" if ptx else "cubin",
        "artifact_sha256": sha256_bytes(blob),
        "artifact_bytes": len(blob),
        "compiler": {"name": "nvrtc", "version": "13.0", "full_version": "13.0.88", "library": ""},
        "ptx_ftz_count": 12 if ftz else 0,
        "sass_ftz_count": None if ptx else (9 if ftz else 2),
        "sass_ftz_in_internal_helpers": None if ptx else 2,
        "sass_ftz_note": "PTX route: no SASS" if ptx else "counted with nvdisasm",
        "requested_ftz": requested_ftz(spec),
        "expected_ftz": ftz,
        "notes": [],
        "cuda_cache": CACHE,
    }


def requested_ftz(spec: dict) -> bool | None:
    named = [o for o in spec["options"] if o.startswith("--ftz=")]
    return named[-1] == "--ftz=true" if named else None


def verify_record(config: dict, v: str, artifact: str) -> dict:
    spec, ftz = config["variants"][v], flushes(config, v)
    out = -0.0 if ftz else SUBNORMAL_81
    return {
        "kind": "verify",
        "schema_version": 1,
        "variant": v,
        "route": spec["route"],
        "kernel": "naive",
        "artifact_sha256": artifact,
        "requested_ftz": requested_ftz(spec),
        "expected_ftz": ftz,
        "effective_ftz": ftz,
        "witness": {
            "input": 1e-10,
            "scale": 1e-30,
            "output": 0.0 if ftz else 1.0005e-40,
            "output_bits": "0x00000000" if ftz else "0x000116c2",
            "subnormal_kept": not ftz,
        },
        "task81": [
            {
                "input": x,
                "output": out,
                "output_bits": f32_bits_hex(out),
                "reference": SUBNORMAL_81,
                "reference_bits": f32_bits_hex(SUBNORMAL_81),
                "bit_equal": not ftz,
            }
            for x in (-88.0, -87.5)
        ],
        "task81_note": None,
        "mismatch": False,
        "requested_mismatch": False,
        "finding": "cupy-default: options do not request FTZ, but CuPy's implicit -ftz=true"
        if spec["route"] == "cupy-default"
        else None,
        "cuda_cache": CACHE,
    }


def write_study(root: Path, config: dict, *, gpu="NVIDIA H200", driver="580.95.05") -> None:
    """A complete result tree for `config` under root, following docs/contracts.md."""
    rng = random.Random(7)
    variants, tasks = list(config["variants"]), list(config["tasks"])
    task_sha = {t: sha256_bytes(f"task {t}".encode()) for t in tasks}
    commit = config["kernelbench"]["commit"]
    pin = {
        "kind": "kernelbench_pin",
        "schema_version": 1,
        "url": config["kernelbench"]["url"],
        "commit": commit,
        "head": commit,
        "level": 2,
        "tasks": {
            str(t): {
                "path": f"KernelBench/level2/{TASK_NAMES[t]}",
                "name": TASK_NAMES[t][:-3],
                "sha256": task_sha[t],
            }
            for t in tasks
        },
    }
    write_json(root / "kernelbench/pin.json", pin)
    write_json(root / "kernelbench/contract.json", contract_record(commit))
    write_json(root / "env/fingerprint.json", fingerprint(gpu, driver))
    artifacts = {}
    for v in variants:
        blob = f"artifact of {v} for {config['arch']}".encode()
        artifacts[v] = sha256_bytes(blob)
        write_bytes(root / f"compile/{v}/tails.bin", blob)
        write_json(root / f"compile/{v}/meta.json", compile_meta(config, v, blob))
        write_json(root / f"verify/{v}.json", verify_record(config, v, artifacts[v]))
    for t in tasks:
        provenance = {"pin_commit": commit, "task_sha256": task_sha[t]}
        passing = write_correctness(root, config, t, artifacts, provenance)
        impls = list(config["baselines"]) + passing
        skipped = {
            v: {"reason": "correctness failed", "failing_checks": ["graph_replay"]}
            for v in variants
            if v not in passing
        }
        rounds = config["timing"]["rounds"]
        measurements, ratios = measurements_and_ratios(impls, passing, rounds, rng, 1.0 + t / 100)
        write_json(
            root / f"timing/{t}.json",
            {
                "kind": "timing",
                "schema_version": 1,
                "task": t,
                "provenance": {**provenance, "artifacts": {v: artifacts[v] for v in passing}},
                "protocol": config["timing"],
                "shape": {"batch": 1024, "in_features": 8192, "out_features": 8192},
                "timed": impls,
                "skipped": skipped,
                "measurements": measurements,
                "ratios": ratios,
                "tail_bytes": 2 * 1024 * 8192 * 4,
                "cuda_cache": CACHE,
            },
        )
        small_m, small_r = measurements_and_ratios(impls, passing, rounds, rng, 0.02)
        write_json(
            root / f"controls/{t}.json",
            {
                "kind": "controls",
                "schema_version": 1,
                "task": t,
                "provenance": {**provenance, "artifacts": dict(artifacts)},
                "protocol": config["timing"],
                "tolerance": TOLERANCE,
                "small_shape": {
                    "shape": config["controls"]["small_shape"],
                    "measurements": small_m,
                    "ratios": small_r,
                    "tail_bytes": 2 * 128 * 1024 * 4,
                    "timed": impls,
                    "skipped": skipped,
                },
                "tiny_values": {
                    v: {
                        "cases": [
                            case(n, "tiny_values", 1024, 700 if flushes(config, v) else 1024, 0.0)
                            for n in TINY_CASES
                        ]
                    }
                    for v in variants
                },
                "ftz_cost": ftz_cost(config, passing, rng),
                "exhaustive": {v: exhaustive_record(config, v) for v in variants},
                "cuda_cache": CACHE,
            },
        )
    if 81 in tasks:
        write_witness81(
            root, config, artifacts, {"pin_commit": commit, "task_sha256": task_sha[81]}
        )
    write_json(root / "protocol/direction_witness.json", direction_witness_record())
    with contextlib.chdir(root.parent):  # the rule passes paths relative to the workdir
        audited = [
            str(p.relative_to(root.parent))
            for p in sorted(root.glob("correctness/*/*.json"))
            + sorted(root.glob("controls/*.json"))
        ]
        protocol.write_margin_audit(audited, root / "protocol/margin_audit.json", TOLERANCE)


def write_correctness(root, config, t, artifacts, provenance) -> list[str]:
    """Correctness of every variant and of the baselines; return the variants that pass."""
    passing = []
    for v in config["variants"]:
        failing = t == 53 and v == "cupy-default"
        edge = t == 81 and v == "nvrtc-ptx-noftz"
        cases = correctness_cases(config, t, flushes(config, v), failing, edge)
        if not failing:
            passing.append(v)
        write_json(
            root / f"correctness/{t}/{v}.json",
            {
                "kind": "correctness",
                "schema_version": 1,
                "task": t,
                "implementation": v,
                "provenance": {
                    "variant": v,
                    "kernel": "naive",
                    "route": config["variants"][v]["route"],
                    "artifact_sha256": artifacts[v],
                    **provenance,
                },
                "tolerance": TOLERANCE,
                "cases": cases,
                "summary": totals(cases),
                "passed": not failing,
                "failing_checks": [c["name"] for c in cases if not c["official_pass"]],
                "cuda_cache": CACHE,
            },
        )
    implementations = {}
    for b in config["baselines"]:
        if b != "eager":
            cases = correctness_cases(config, t, False)
            implementations[b] = {
                "cases": cases,
                "summary": totals(cases),
                "passed": True,
                "failing_checks": [],
            }
    write_json(
        root / f"correctness/{t}/baselines.json",
        {
            "kind": "correctness_baselines",
            "schema_version": 1,
            "task": t,
            "provenance": provenance,
            "tolerance": TOLERANCE,
            "implementations": implementations,
            "cuda_cache": CACHE,
        },
    )
    return passing


def ftz_cost(config: dict, passing: list[str], rng) -> dict:
    on, off = "nvrtc-cubin-ftz", "nvrtc-cubin-noftz"
    if on not in passing or off not in passing:
        return {}
    rounds = config["controls"]["ftz_cost"]["rounds"]
    on_s = [0.05 * rng.uniform(0.98, 1.02) for _ in range(rounds)]
    off_s = [0.05 * rng.uniform(0.98, 1.02) for _ in range(rounds)]
    return {
        "nvrtc-cubin": {
            "ftz_on": on,
            "ftz_off": off,
            "on": stats(on_s),
            "off": stats(off_s),
            "ratio_on_over_off": ratio_stats(on_s, off_s),
            "effective_ftz": {"on": True, "off": False},
        }
    }


def write_witness81(root, config, artifacts, provenance) -> None:
    inputs = config["controls"]["witness81_inputs"]
    ref_bits = f32_bits_hex(SUBNORMAL_81)
    rows = {}
    for v in config["variants"]:
        out = -0.0 if flushes(config, v) else SUBNORMAL_81
        rows[v] = [
            {
                "input": x,
                "output": out,
                "output_bits": f32_bits_hex(out),
                "bit_equal": f32_bits_hex(out) == ref_bits,
            }
            for x in inputs
        ]
    write_json(
        root / "controls/witness81.json",
        {
            "kind": "witness81",
            "schema_version": 1,
            "provenance": {**provenance, "artifacts": dict(artifacts)},
            "inputs": inputs,
            "reference": [
                {"input": x, "output": SUBNORMAL_81, "output_bits": ref_bits} for x in inputs
            ],
            "variants": rows,
            "cuda_cache": CACHE,
        },
    )


@pytest.fixture
def study(tmp_path):
    config = make_config()
    root = tmp_path / "results"
    write_study(root, config)
    return root, config


# ---------------------------------------------------------------- tables


def test_correctness_table_holds_exactly_the_task_variant_pairs(study):
    root, config = study
    tables = summary.build_tables(root, config)
    corr = tables["correctness"]
    expected_pairs = [(t, v) for t in config["tasks"] for v in config["variants"]]
    assert list(zip(corr["task"], corr["variant"], strict=True)) == expected_pairs
    for row in corr.itertuples():
        recorded = read_json(root / f"correctness/{row.task}/{row.variant}.json")
        want = recorded["summary"]
        assert row.cases == want["cases"] == len(recorded["cases"])
        assert row.official_passes == want["official_passes"]
        assert row.bit_identical_cases == want["bit_identical_cases"]
        assert row.elements == want["elements"]
        assert row.elements_bit_equal == want["elements_bit_equal"]
        assert row.max_ratio_official == want["max_ratio_official"]
        assert row.max_ratio_historical == want["max_ratio_historical"]
        assert row.passed == recorded["passed"]
    assert str(corr["elements_bit_equal"].dtype) == "Int64"
    failing = corr[(corr["task"] == 53) & (corr["variant"] == "cupy-default")].iloc[0]
    assert failing["official_passes"] == failing["cases"] - 1
    assert failing["failing_checks"] == "graph_replay"
    assert failing["max_ratio_official"] == 3.5


def test_case_tables_list_every_recorded_case_once(study):
    root, config = study
    tables = summary.build_tables(root, config)
    expected, expected_baselines = [], []
    for t in config["tasks"]:
        for v in config["variants"]:
            corr = read_json(root / f"correctness/{t}/{v}.json")
            expected += [(t, v, c["name"]) for c in corr["cases"]]
        baselines = read_json(root / f"correctness/{t}/baselines.json")["implementations"]
        for b in ("torchscript", "inductor"):  # config order
            expected += [(t, b, c["name"]) for c in baselines[b]["cases"]]
            expected_baselines.append((t, b))
    cases = tables["correctness_cases"]
    assert list(zip(cases["task"], cases["implementation"], cases["name"], strict=True)) == expected

    tiny = tables["tiny_values"]
    assert len(tiny) == len(config["tasks"]) * len(config["variants"]) * len(TINY_CASES)
    flushed = tiny[tiny["variant"] == "nvrtc-cubin-ftz"]
    assert set(flushed["bit_equal"]) == {700}

    base = tables["baseline_bit_identity"]
    assert list(zip(base["task"], base["baseline"], strict=True)) == expected_baselines


def test_control_bit_equality_counts_integers_per_control_set(study):
    root, config = study
    table = summary.build_tables(root, config)["control_bit_equality"]
    sets = [*TINY_CASES, tables.TAIL_CONTROLS]
    assert len(table) == len(config["tasks"]) * len(config["variants"]) * len(sets)
    tail = table[(table["control_set"] == tables.TAIL_CONTROLS) & (table["task"] == 81)]
    by_variant = dict(zip(tail["variant"], tail["elements_bit_equal"], strict=True))
    assert by_variant == {
        "cupy-default": 64 + 12,
        "nvrtc-cubin-noftz": 80,
        "nvrtc-cubin-ftz": 76,
        "nvrtc-ptx-noftz": 80,
    }
    assert set(tail["elements"]) == {80}


def test_timing_tables_match_measurements_and_floor(study):
    root, config = study
    tables = summary.build_tables(root, config)
    gbps = read_json(root / "env/fingerprint.json")["copy_bandwidth"]["gbps"]
    for scope in ("full", "tail"):
        table = tables[f"timing_{scope}"]
        expected = []
        for t in config["tasks"]:
            tim = read_json(root / f"timing/{t}.json")
            for key, per_impl in tim["measurements"].items():
                if key.startswith(scope + "/"):
                    assert set(per_impl) == set(tim["timed"])
                    method = key.split("/")[1]
                    for impl in tim["timed"]:  # rows follow the timed order
                        m = per_impl[impl]
                        expected.append((t, impl, method, m["median_ms"], m["q1_ms"], m["q3_ms"]))
        got = list(
            zip(
                table["task"],
                table["impl"],
                table["method"],
                table["median_ms"],
                table["q1_ms"],
                table["q3_ms"],
                strict=True,
            )
        )
        assert got == expected
    tail = tables["timing_tail"]
    tim53 = read_json(root / "timing/53.json")
    row = tail[
        (tail["task"] == 53) & (tail["impl"] == "nvrtc-cubin-noftz") & (tail["method"] == "graph")
    ].iloc[0]
    floor_ms = tim53["tail_bytes"] / (gbps * 1e9) * 1e3
    assert row["bytes_moved"] == tim53["tail_bytes"]
    assert row["pct_of_floor"] == pytest.approx(100 * floor_ms / row["median_ms"], rel=1e-12)
    ratio = tim53["ratios"]["tail/graph"]["nvrtc-cubin-noftz"]
    assert row["eager_over_impl"] == ratio["vs_eager"]["median"]
    assert row["best_compiled"] == ratio["vs_best_compiled"]["baseline"]
    assert row["best_compiled_over_impl_q3"] == ratio["vs_best_compiled"]["q3"]
    eager = tail[(tail["impl"] == "eager")]
    assert eager["eager_over_impl"].isna().all()
    # the gated-out variant is not timed for task 53, and is listed as skipped
    assert "cupy-default" not in set(tail[tail["task"] == 53]["impl"])
    skipped = tables["skipped"]
    assert skipped.to_dict("records") == [
        {
            "task": 53,
            "stage": stage,
            "implementation": "cupy-default",
            "reason": "correctness failed",
            "failing_checks": "graph_replay",
        }
        for stage in ("timing", "small_shape")
    ]


def test_compiler_contract_and_witness(study):
    root, config = study
    tables = summary.build_tables(root, config)
    contract = tables["compiler_contract"].set_index("variant")
    assert list(contract.index) == list(config["variants"])
    cupy = contract.loc["cupy-default"]
    assert cupy["implicit_options"] == "-ftz=true"
    assert cupy["actual_options"].endswith("-ftz=true")
    assert pd.isna(cupy["requested_ftz"])
    assert bool(cupy["expected_ftz"]) and bool(cupy["effective_ftz"])
    assert cupy["compiler"] == "nvrtc 13.0"
    meta = read_json(root / "compile/cupy-default/meta.json")
    assert cupy["artifact_sha256"] == meta["artifact_sha256"][:12]
    assert "CUDA_CACHE_DISABLE=1" in cupy["cuda_cache_compile"]
    assert pd.isna(contract.loc["nvrtc-ptx-noftz", "sass_ftz_count"])
    assert contract.loc["nvrtc-cubin-ftz", "sass_ftz_count"] == 9
    assert not contract.loc["nvrtc-cubin-noftz", "effective_ftz"]

    assert cupy["launch"] == "per-element x256; tail53: grid-stride x128 4/SM"

    witness = tables["witness81"]
    assert len(witness) == len(config["variants"]) * 2
    flushed = witness[witness["variant"] == "nvrtc-cubin-ftz"]
    assert set(flushed["output_bits"]) == {"0x80000000"}
    assert set(flushed["reference_bits"]) == {"0x82b54ddb"}
    assert not flushed["bit_equal"].any()
    kept = witness[witness["variant"] == "nvrtc-cubin-noftz"]
    assert set(kept["output_bits"]) == {"0x82b54ddb"} and kept["bit_equal"].all()


def test_verify_mismatch_becomes_a_finding(study):
    root, config = study
    path = root / "verify/nvrtc-cubin-noftz.json"
    ver = read_json(path)
    ver.update(effective_ftz=True, mismatch=True, requested_mismatch=True, finding=None)
    write_json(path, ver)
    contract = summary.build_tables(root, config)["compiler_contract"].set_index("variant")
    row = contract.loc["nvrtc-cubin-noftz"]
    assert row["mismatch"]
    assert row["finding"] == "expected ftz=False but effective ftz=True"


def test_margin_audit_and_small_tables(study):
    root, config = study
    tables = summary.build_tables(root, config)
    audit = tables["margin_audit"]
    recorded = read_json(root / "protocol/margin_audit.json")["cases"]
    assert list(zip(audit["file"], audit["path"], strict=True)) == [
        (r["file"], r["path"]) for r in recorded
    ]
    n_cases = 0
    for t in config["tasks"]:
        for v in config["variants"]:
            n_cases += len(read_json(root / f"correctness/{t}/{v}.json")["cases"])
        baselines = read_json(root / f"correctness/{t}/baselines.json")["implementations"]
        n_cases += sum(len(rec["cases"]) for rec in baselines.values())
        n_cases += len(TINY_CASES) * len(config["variants"])
    assert (audit["record"] == "case").sum() == n_cases
    flips = audit[audit["flips"] & (audit["record"] == "case")]
    assert list(zip(flips["file"], flips["name"], flips["flip"], strict=True)) == [
        ("results/correctness/81/nvrtc-ptx-noftz.json", "uniform_seed0", "official_only")
    ]
    replay = audit[
        (audit["file"] == "results/correctness/53/cupy-default.json")
        & (audit["name"] == "graph_replay")
    ].iloc[0]
    assert replay["max_ratio_official"] == 3.5 and not replay["flips"]

    cost = tables["ftz_cost"]
    assert list(zip(cost["task"], cost["route"], strict=True)) == [
        (53, "nvrtc-cubin"),
        (81, "nvrtc-cubin"),
    ]
    rec = read_json(root / "controls/81.json")["ftz_cost"]["nvrtc-cubin"]
    row = cost[cost["task"] == 81].iloc[0]
    assert row["on_over_off"] == rec["ratio_on_over_off"]["median"]
    assert row["off_median_ms"] == rec["off"]["median_ms"]
    assert row["on_rounds"] == config["timing"]["rounds"]

    small = tables["small_shapes"]
    assert set(small["batch"]) == {128}
    per_task = sum(
        len(m) for m in read_json(root / "controls/53.json")["small_shape"]["measurements"].values()
    )
    assert (small["task"] == 53).sum() == per_task

    env = tables["environment"].set_index("field")["value"]
    assert env["gpu.name"] == "NVIDIA H200"
    assert env["copy_bandwidth.gbps"] == 4294.967296
    assert env["driver.nvidia_smi.driver_version"] == "580.95.05"

    witness = tables["direction_witness"].iloc[0]
    assert witness["allclose_a_b"] != witness["allclose_b_a"]
    assert witness["a_bits"] == f32_bits_hex(witness["a"])


def test_nonfinite_values_are_read_as_floats(study):
    root, config = study
    path = root / "correctness/81/nvrtc-cubin-ftz.json"
    corr = read_json(path)
    corr["cases"][0]["max_abs_diff"] = "nan"
    corr["cases"][1]["max_ratio_historical"] = "inf"
    write_json(path, corr)
    cases = summary.build_tables(root, config)["correctness_cases"]
    rows = cases[(cases["task"] == 81) & (cases["implementation"] == "nvrtc-cubin-ftz")]
    assert pd.isna(rows.iloc[0]["max_abs_diff"])
    assert rows.iloc[1]["max_ratio_historical"] == float("inf")


# ---------------------------------------------------------------- provenance


def _edit(path: Path, edit) -> None:
    data = read_json(path)
    edit(data)
    write_json(path, data)


@pytest.mark.parametrize(
    ("rel", "edit", "field"),
    [
        (
            "correctness/53/nvrtc-cubin-ftz.json",
            lambda d: d["provenance"].update(artifact_sha256="0" * 64),
            "provenance.artifact_sha256",
        ),
        (
            "correctness/81/cupy-default.json",
            lambda d: d["provenance"].update(pin_commit="1" * 40),
            "provenance.pin_commit",
        ),
        (
            "correctness/81/baselines.json",
            lambda d: d["provenance"].update(task_sha256="2" * 64),
            "provenance.task_sha256",
        ),
        (
            "timing/81.json",
            lambda d: d["provenance"]["artifacts"].update({"nvrtc-ptx-noftz": "3" * 64}),
            "provenance.artifacts.nvrtc-ptx-noftz",
        ),
        (
            "timing/53.json",
            lambda d: d["provenance"].update(pin_commit="4" * 40),
            "provenance.pin_commit",
        ),
        (
            "controls/53.json",
            lambda d: d["provenance"]["artifacts"].update({"cupy-default": "5" * 64}),
            "provenance.artifacts.cupy-default",
        ),
        (
            "controls/81.json",
            lambda d: d["provenance"]["artifacts"].pop("nvrtc-cubin-ftz"),
            "provenance.artifacts.nvrtc-cubin-ftz",
        ),
        (
            "verify/nvrtc-ptx-noftz.json",
            lambda d: d.update(artifact_sha256="6" * 64),
            "artifact_sha256",
        ),
    ],
)
def test_tampered_provenance_is_refused(study, rel, edit, field):
    root, config = study
    _edit(root / rel, edit)
    with pytest.raises(KbfuseError, match=re.escape(field)) as err:
        summary.build_tables(root, config)
    assert rel in str(err.value) and field in str(err.value)


def test_recompiled_artifact_makes_older_results_stale(study):
    root, config = study
    _edit(
        root / "compile/nvrtc-cubin-noftz/meta.json", lambda d: d.update(artifact_sha256="7" * 64)
    )
    with pytest.raises(KbfuseError, match="stale or tampered") as err:
        summary.build_tables(root, config)
    assert "compile/nvrtc-cubin-noftz/meta.json" in str(err.value)


def test_pin_for_another_commit_is_refused(study):
    root, config = study
    other = copy.deepcopy(config)
    other["kernelbench"]["commit"] = "8" * 40
    with pytest.raises(KbfuseError, match="kernelbench/pin.json: field commit"):
        summary.build_tables(root, other)


def test_timing_that_misses_a_configured_variant_is_stale(study):
    root, config = study
    _edit(root / "timing/81.json", lambda d: d["skipped"].clear() or d["timed"].pop())
    with pytest.raises(KbfuseError, match="timing/81.json: fields timed"):
        summary.build_tables(root, config)


def test_missing_or_wrong_kind_input_is_named(study):
    root, config = study
    (root / "controls/81.json").unlink()
    with pytest.raises(KbfuseError, match="controls/81.json is missing"):
        summary.build_tables(root, config)
    write_json(root / "controls/81.json", {"kind": "timing", "schema_version": 1})
    with pytest.raises(KbfuseError, match="controls/81.json: field kind is 'timing'"):
        summary.build_tables(root, config)


# ---------------------------------------------------------------- outputs


def test_write_summary_writes_exactly_the_declared_outputs(study, tmp_path):
    root, config = study
    out1, out2 = tmp_path / "s1", tmp_path / "s2"
    written = summary.write_summary(root, config, out1)
    names = sorted(p.name for p in written)
    assert names == sorted(layout.summary_outputs(config))
    assert sorted(p.name for p in out1.iterdir()) == names
    assert (out1 / "tail_time_81.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (out1 / "control_bit_equality.png").stat().st_size > 1000
    csv = pd.read_csv(out1 / "correctness.csv")
    assert len(csv) == len(config["tasks"]) * len(config["variants"])
    assert "| task |" in (out1 / "correctness.md").read_text().replace("|   task |", "| task |")
    summary.write_summary(root, config, out2)
    for name in names:
        assert (out1 / name).read_bytes() == (out2 / name).read_bytes(), name


def test_every_summary_output_has_a_report_caption():
    config = make_config(tasks=(53, 81, 95))
    captions = REPO / "workflow" / "report"
    for output in layout.summary_outputs(config):
        caption = captions / layout.caption_name(output)
        assert caption.is_file(), caption
        assert len(caption.read_text().strip()) > 40


def test_summary_inputs_name_every_file_read(study):
    root, config = study
    inputs = layout.summary_inputs(config, root)
    assert len(inputs) == len(set(inputs))
    assert all(Path(p).is_file() for p in inputs)
    assert str(root / "controls/witness81.json") in inputs
    json.dumps(inputs)


def test_a_file_that_breaks_the_contract_is_named(study):
    root, config = study
    _edit(root / "timing/81.json", lambda d: d.pop("tail_bytes"))
    with pytest.raises(
        KbfuseError, match="timing/81.json does not follow .*\n  field tail_bytes is missing"
    ):
        summary.build_tables(root, config)


def test_exhaustive_table_counts_every_input_per_task_and_variant(study):
    root, config = study
    table = summary.build_tables(root, config)["exhaustive"]
    assert len(table) == len(config["tasks"]) * len(config["variants"])
    assert set(table["inputs"]) == {1 << 32}
    by_variant = table.groupby("variant")
    flushed = by_variant.get_group("nvrtc-cubin-ftz")
    assert set(flushed["differ"]) == {1000} and not flushed["bit_identical"].any()
    assert set(flushed["first_difference"]) == {
        "input 0xc2b00000: eager 0x82b54ddb, kernel 0x80000000"
    }
    kept = by_variant.get_group("nvrtc-cubin-noftz")
    assert set(kept["differ"]) == {0} and kept["bit_identical"].all()
    assert set(kept["first_difference"]) == {""}
