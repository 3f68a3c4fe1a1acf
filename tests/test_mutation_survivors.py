"""Tests written for mutants that survived the first mutation run (docs/mutation.md).

Each pins a behaviour the suite did not look at closely enough: the exact message of an
error (which key, which case, which value), a boundary (0 and 0xFFFFFFFF are float32
patterns), an order dependence (NaN anywhere makes a maximum NaN), a nested scratch folder.
"""

from __future__ import annotations

import io
import json
import logging
import math
import os
import re
import tarfile
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import yaml
from conftest import ROOT
from test_summary import make_config, write_study

import kbfuse
from kbfuse import stage
from kbfuse.checks import verify
from kbfuse.checks.numerics import (
    bit_equal_count,
    check_tolerance,
    error_ratio_map,
    f32_bits,
    f32_bits_hex,
    f32_from_bits,
    summarize_cases,
)
from kbfuse.checks.verify import describe_finding
from kbfuse.compilation import cudacache, routes
from kbfuse.errors import KbfuseError
from kbfuse.io import dumps_json, read_json, sha256_bytes, sha256_file, write_json
from kbfuse.results import bundle as bundle_module
from kbfuse.results.bundle import (
    MANIFEST_MEMBER,
    RESULTS_PREFIX,
    format_report,
    make_bundle,
    pack,
    verify_bundle,
)
from kbfuse.results.manifest import (
    build_manifest,
    compare_with_manifest,
    content_sha256,
    environment_of,
    is_safe_relpath,
    load_manifest,
    verify_manifest,
)
from kbfuse.timing import gate, measure
from kbfuse.workflow import deps
from kbfuse.workflow.config import SCHEMA, check_config, load_config, validate_schema, variant_spec

RESULTS = RESULTS_PREFIX

# --------------------------------------------------------------------------- numerics


def test_f32_from_bits_at_both_ends_of_the_range():
    assert f32_from_bits(0) == 0.0 and math.copysign(1.0, f32_from_bits(0)) == 1.0
    assert math.isnan(f32_from_bits(0xFFFFFFFF))
    assert math.isnan(f32_from_bits("0xffffffff"))
    with pytest.raises(KbfuseError, match=r"^float32 bits out of range: 4294967296$"):
        f32_from_bits(0x1_0000_0000)
    with pytest.raises(KbfuseError, match=r"^float32 bits out of range: -1$"):
        f32_from_bits(-1)


@pytest.mark.parametrize("bits", [1.5, True, None])
def test_f32_from_bits_names_a_value_of_the_wrong_type(bits):
    message = f"float32 bits must be an int or a hex string, got {bits!r}"
    with pytest.raises(KbfuseError, match=f"^{re.escape(message)}$"):
        f32_from_bits(bits)


def test_f32_from_bits_names_a_string_that_is_not_hexadecimal():
    with pytest.raises(KbfuseError, match=r"^not a hexadecimal float32 pattern: '0xzz'$"):
        f32_from_bits("0xzz")


def case(name="c", **overrides) -> dict:
    record = {
        "name": name,
        "elements": 4,
        "bit_equal": 4,
        "official_pass": True,
        "equal_nan_pass": True,
        "max_abs_diff": 0.0,
        "max_ratio_official": 0.0,
        "max_ratio_historical": 0.0,
    }
    return {**record, **overrides}


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("elements", 2.5, "case 1 key 'elements' must be an integer, got 2.5"),
        ("elements", True, "case 1 key 'elements' must be an integer, got True"),
        ("bit_equal", "4", "case 1 key 'bit_equal' must be an integer, got '4'"),
        ("official_pass", 1, "case 1 key 'official_pass' must be a bool, got 1"),
        ("equal_nan_pass", "yes", "case 1 key 'equal_nan_pass' must be a bool, got 'yes'"),
        ("max_abs_diff", "x", "case 1 key 'max_abs_diff' is not a number: 'x'"),
        ("max_ratio_official", None, "case 1 key 'max_ratio_official' is not a number: None"),
        ("max_ratio_historical", [], "case 1 key 'max_ratio_historical' is not a number: []"),
    ],
)
def test_summarize_cases_names_the_case_the_key_and_the_value(key, value, message):
    with pytest.raises(KbfuseError, match=f"^{re.escape(message)}$"):
        summarize_cases([case("first"), case("second", **{key: value})])


def test_summarize_cases_names_a_case_that_lacks_a_key_or_is_not_a_dict():
    named = {k: v for k, v in case("second").items() if k != "bit_equal"}
    with pytest.raises(KbfuseError, match=r"^case 1 \(second\) lacks key 'bit_equal'$"):
        summarize_cases([case(), named])
    nameless = {k: v for k, v in case().items() if k not in ("name", "elements")}
    with pytest.raises(KbfuseError, match=r"^case 1 \(\?\) lacks key 'elements'$"):
        summarize_cases([case(), nameless])
    with pytest.raises(KbfuseError, match=r"^case 1 is not a dict: 7$"):
        summarize_cases([case(), 7])
    with pytest.raises(KbfuseError, match=r"^summarize_cases: no cases to summarize$"):
        summarize_cases([])


@pytest.mark.parametrize("key", ["official_pass", "max_abs_diff", "max_ratio_historical"])
def test_summarize_cases_names_the_case_that_lacks_a_bool_or_float(key):
    lacking = {k: v for k, v in case("second").items() if k != key}
    with pytest.raises(KbfuseError, match=rf"^case 1 \(second\) lacks key '{key}'$"):
        summarize_cases([case(), lacking])


@pytest.mark.parametrize("order", [("nan", 1.0), (1.0, "nan")])
def test_a_nan_anywhere_makes_the_maximum_nan(order):
    cases = [case("a", max_abs_diff=order[0]), case("b", max_abs_diff=order[1])]
    assert math.isnan(summarize_cases(cases)["max_abs_diff"])


# --------------------------------------------------------------------------- measure: statistics


def test_round_orders_messages():
    with pytest.raises(KbfuseError, match=r"^round_orders: no implementations to order$"):
        measure.round_orders([], 3, 0)
    with pytest.raises(
        KbfuseError, match=r"^round_orders: implementation names repeat: \['a', 'b', 'a'\]$"
    ):
        measure.round_orders(["a", "b", "a"], 3, 0)
    with pytest.raises(KbfuseError, match=r"^rounds is 0: it must be an integer >= 1$"):
        measure.round_orders(["a"], 0, 0)


def test_sample_checks_name_the_caller_and_the_samples():
    with pytest.raises(KbfuseError, match=r"^stats: need at least one sample, got \[\]$"):
        measure.stats([])
    with pytest.raises(
        KbfuseError, match=r"^stats: samples must be finite and positive, got \[1\.0, 0\.0\]$"
    ):
        measure.stats([1.0, 0.0])
    with pytest.raises(KbfuseError, match=r"^paired_ratios baseline: need at least one sample"):
        measure.paired_ratios([], [1.0])
    with pytest.raises(KbfuseError, match=r"^paired_ratios variant: samples must be finite"):
        measure.paired_ratios([1.0], [math.inf])
    with pytest.raises(
        KbfuseError,
        match=r"^paired_ratios: 2 baseline samples but 1 variant samples; ratios are paired "
        r"per round$",
    ):
        measure.paired_ratios([1.0, 2.0], [1.0])


def test_integer_samples_of_any_size_are_taken_as_float64():
    big = 2**70
    assert measure.stats([big, big])["median_ms"] == float(big)
    assert measure.paired_ratios([big, big], [2**69, 2**69])["median"] == 2.0


# --------------------------------------------------------------------------- cudacache


@pytest.fixture
def clean_env(monkeypatch):
    monkeypatch.setattr(cudacache, "driver_initialised", lambda: False)
    monkeypatch.delitem(__import__("sys").modules, "cupy", raising=False)
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)


def test_isolated_env_makes_nested_scratch_folders_with_named_caches(tmp_path):
    scratch = tmp_path / "a" / "b" / "c"
    env = cudacache.isolated_env(scratch, base_env={})
    cuda_dir, cupy_dir = Path(env["CUDA_CACHE_PATH"]), Path(env["CUPY_CACHE_DIR"])
    assert cuda_dir.parent == scratch and cupy_dir.parent == scratch
    assert cuda_dir.name.startswith("cuda-compute-cache-") and cuda_dir.is_dir()
    assert cupy_dir.name.startswith("cupy-kernel-cache-") and cupy_dir.is_dir()


def test_isolate_says_why_it_is_too_late(clean_env, tmp_path, monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "cupy", object())
    message = (
        f"cudacache.isolate({tmp_path}) called too late: cupy is already imported; the CUDA "
        "driver and CuPy read the cache variables at initialisation, so call isolate before "
        "importing cupy or touching torch.cuda"
    )
    with pytest.raises(KbfuseError, match=f"^{re.escape(message)}$"):
        cudacache.isolate(tmp_path)


# --------------------------------------------------------------------------- deps


def test_a_syntax_error_on_an_import_line_names_the_module_file(tmp_path):
    bad = tmp_path / "broken.py"
    bad.write_text("from kbfuse import (a,\n")
    with pytest.raises(SyntaxError, match="never closed|invalid syntax") as info:
        deps.module_closure("broken", tmp_path)
    assert info.value.filename == str(bad)


def test_a_syntax_error_elsewhere_is_left_to_the_import(tmp_path):
    # only the import lines are parsed: the job that imports the module reports the error
    (tmp_path / "odd.py").write_text("from kbfuse import leaf\ndef (:\n")
    (tmp_path / "leaf.py").write_text("x = 1\n")
    assert deps.module_closure("odd", tmp_path) == ("leaf", "odd")


# --------------------------------------------------------------------------- verify, routes


def test_an_implicit_ftz_of_another_route_is_named_after_the_route():
    finding = describe_finding("v", "nvrtc-cubin", None, True, True, ["--ftz=true"], ["--ftz=true"])
    assert finding == (
        "v: options do not request FTZ, but the nvrtc-cubin route's implicit --ftz=true "
        "flushes subnormals to zero"
    )


def test_only_the_routes_ftz_options_are_named_as_implicit():
    implicit = ["-I/a path with spaces", "--std=c++17", "-arch=sm_90", "-ftz=true"]
    finding = describe_finding("v", "cupy-default", None, True, True, implicit, implicit)
    assert finding == (
        "v: options do not request FTZ, but CuPy's implicit -ftz=true flushes subnormals to zero"
    )


def test_measure_witness_names_the_variant_of_an_odd_output(monkeypatch):
    monkeypatch.setattr(verify, "witness_output", lambda mod: 1.0)
    with pytest.raises(KbfuseError, match=r"^variant 'odd': witness_mul\(1e-10, 1e-30\) gave 1.0"):
        verify.measure_witness(SimpleNamespace(variant="odd"))


def test_the_witness_record_in_full():
    product = float(np.float32(verify.WITNESS_INPUT) * np.float32(verify.WITNESS_SCALE))
    record, flushed = verify.witness_record(0.0, "v")
    assert flushed is True
    assert record == {
        "input": 1e-10,
        "input_bits": f32_bits_hex(1e-10),
        "scale": 1e-30,
        "scale_bits": f32_bits_hex(1e-30),
        "output": 0.0,
        "output_bits": "0x00000000",
        "host_product": product,
        "host_product_bits": f32_bits_hex(product),
        "subnormal_kept": False,
    }


@pytest.mark.parametrize(
    ("x", "scale"),
    [(1.0, 1e-30), (1e-30, 1e-30), (float(np.finfo(np.float32).tiny), 1.0)],
    ids=["normal", "zero", "smallest-normal"],
)
def test_a_witness_whose_host_product_is_not_subnormal_is_refused(monkeypatch, x, scale):
    monkeypatch.setattr(verify, "WITNESS_INPUT", x)
    monkeypatch.setattr(verify, "WITNESS_SCALE", scale)
    product = float(np.float32(x) * np.float32(scale))
    message = f"host witness product {product!r} is not a float32 subnormal"
    with pytest.raises(KbfuseError, match=f"^{re.escape(message)}$"):
        verify.witness_record(0.0, "v")


@pytest.mark.parametrize(
    ("option", "bookkeeping"),
    [
        ("-I/a path with spaces", True),
        ("-I/usr/include", True),
        ("--include-path=/x", True),
        ("-arch=sm_90", True),
        ("--device-as-default-execution-space", True),
        ("--pch", True),
        ("--std=c++17", True),
        ("--std=c++11", False),
        ("--ftz=true", False),
        ("-DXX", False),
        ("not-an-option", False),
    ],
)
def test_cupy_bookkeeping_options(option, bookkeeping):
    assert routes.is_cupy_bookkeeping_option(option) is bookkeeping


def test_option_problems_lists_every_problem():
    assert routes.option_problems("nvrtc-cubin", ["--ftz=true", "--fmad=false"]) == []
    assert routes.option_problems("nvrtc-cubin", ["--ftz=maybe", "--bogus"]) == [
        "route nvrtc-cubin: option '--ftz=maybe': --ftz expects true or false, not 'maybe'",
        "route nvrtc-cubin: option '--bogus' is not an NVRTC option",
    ]


# --------------------------------------------------------------------------- config, manifest


def test_load_config_reads_kernels_from_kernels_by_default(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    config = load_config(ROOT / "config/config.yaml")
    assert "nvrtc-cubin-noftz" in config["variants"]
    empty = tmp_path / "kernels"
    empty.mkdir()
    with pytest.raises(KbfuseError, match=r"variants\.\S+\.kernel"):
        load_config(ROOT / "config/config.yaml", kernels_dir=empty)


def test_load_config_refuses_a_file_that_is_not_a_mapping(tmp_path):
    path = tmp_path / "list.yaml"
    path.write_text("- a\n- b\n")
    message = f"invalid config:\n  config file {path}: expected a mapping, got ['a', 'b']"
    with pytest.raises(KbfuseError, match=f"^{re.escape(message)}$"):
        load_config(path)


def test_variant_spec_defaults_the_kernel_to_naive():
    config = {"variants": {"v": {"route": "nvrtc-cubin", "options": ("--ftz=false",)}}}
    assert variant_spec(config, "v") == {
        "name": "v",
        "route": "nvrtc-cubin",
        "kernel": "naive",
        "options": ["--ftz=false"],
    }
    config["variants"]["v"]["kernel"] = "fast"
    assert variant_spec(config, "v")["kernel"] == "fast"


def test_manifest_inputs_relative_to_cwd_or_to_the_results_dir(tmp_path, monkeypatch):
    config = make_config(variants=("nvrtc-cubin-noftz",))
    root = tmp_path / "results"
    write_study(root, config)
    monkeypatch.chdir(tmp_path)
    fixed = [str(root / "env/fingerprint.json"), str(root / "kernelbench/pin.json")]
    # relative to the working directory (which holds results/), and relative to results/
    manifest = build_manifest(
        root, [*fixed, "results/timing/81.json", "timing/53.json"], config, tmp_path / "m.json"
    )
    assert {"timing/81.json", "timing/53.json"} <= set(manifest["files"])
    # a path that exists relative to the working directory is that file, even when results/
    # holds one of the same name
    (tmp_path / "timing").mkdir()
    (tmp_path / "timing" / "81.json").write_text("{}\n")
    with pytest.raises(
        KbfuseError, match=r"^manifest input timing/81.json is not inside results dir"
    ):
        build_manifest(root, [*fixed, "timing/81.json"], config, tmp_path / "m2.json")
    with pytest.raises(KbfuseError, match=r"^manifest input absent.json is not a file$"):
        build_manifest(root, [*fixed, "absent.json"], config, tmp_path / "m3.json")


@pytest.fixture
def small_study(tmp_path):
    """(results dir, config, manifest path, manifest) of one small complete study."""
    config = make_config(variants=("nvrtc-cubin-noftz",))
    root = tmp_path / "results"
    write_study(root, config)
    manifest = build_manifest(root, [root / "timing/81.json"], config, tmp_path / "m.json")
    return root, config, tmp_path / "m.json", manifest


def test_the_manifest_records_its_schema_and_generator(small_study):
    _, _, path, manifest = small_study
    assert manifest["kind"] == "manifest"
    assert manifest["schema_version"] == 1
    assert manifest["generator"] == {"kbfuse": kbfuse.__version__}
    assert read_json(path) == manifest
    assert sorted(manifest["files"]) == [
        "env/fingerprint.json",
        "kernelbench/pin.json",
        "timing/81.json",
    ]


def test_the_manifest_names_a_missing_fingerprint(small_study, tmp_path):
    root, config, _, _ = small_study
    (root / "env/fingerprint.json").unlink()
    message = f"manifest needs {root / 'env/fingerprint.json'}, which is missing"
    with pytest.raises(KbfuseError, match=f"^{re.escape(message)}$"):
        build_manifest(root, [], config, tmp_path / "m2.json")


def test_make_bundle_lists_every_problem_of_an_edited_manifest(small_study, tmp_path):
    root, _, path, manifest = small_study
    edited = {**manifest, "generator": {"kbfuse": "edited"}}
    path.write_text(json.dumps(edited))  # neither canonical nor matching its content hash
    message = (
        f"refusing to bundle: {path}: bytes differ from the canonical form (edited); "
        f"{path}: field content_sha256 does not match its content (edited)"
    )
    with pytest.raises(KbfuseError, match=f"^{re.escape(message)}$"):
        make_bundle(root, path, tmp_path / "b.tar.gz")


def test_make_bundle_refuses_an_unsafe_path_by_the_manifest_schema(small_study, tmp_path):
    root, _, path, manifest = small_study
    files = {**manifest["files"], "../escape.json": manifest["files"]["timing/81.json"]}
    unsafe = {k: v for k, v in manifest.items() if k != "content_sha256"} | {"files": files}
    unsafe["content_sha256"] = content_sha256(unsafe)
    path.write_text(dumps_json(unsafe))
    message = (
        f"manifest {path} does not follow the manifest record schema:\n"
        "  field files is '../escape.json': '../escape.json' does not match "
    )
    with pytest.raises(KbfuseError, match=f"^{re.escape(message)}"):
        make_bundle(root, path, tmp_path / "b.tar.gz")
    assert not (tmp_path / "b.tar.gz").exists()


# --------------------------------------------------------------------------- second run


def default_config() -> dict:
    return validate_schema(yaml.safe_load((ROOT / "config/config.yaml").read_text()))


@pytest.mark.parametrize("value", [-80.0, -110.0])
def test_check_config_refuses_low_equal_to_high(value):
    cfg = default_config()
    cfg["controls"]["tiny_values"].update(low=value, high=value)
    message = f"config key controls.tiny_values: low {value!r} must be below high {value!r}"
    with pytest.raises(KbfuseError, match=f"^invalid config:\n  {re.escape(message)}$"):
        check_config(cfg, ROOT / "kernels")


def test_validate_schema_fills_the_level_and_the_default_kernel():
    cfg = yaml.safe_load((ROOT / "config/config.yaml").read_text())
    cfg["kernelbench"].pop("level", None)
    name = next(iter(cfg["variants"]))
    cfg["variants"][name].pop("kernel", None)
    filled = validate_schema(cfg)
    assert filled["kernelbench"]["level"] == 2
    assert filled["variants"][name]["kernel"] == "naive"


def test_schema_errors_are_listed_by_key_in_order():
    cfg = yaml.safe_load((ROOT / "config/config.yaml").read_text())
    cfg["seeds"] = [0, -1]
    cfg["colour"] = "blue"
    known = ", ".join(yaml.safe_load(SCHEMA.read_text())["properties"])
    message = (
        f"invalid config:\n  config key colour: unknown key (known here: {known})\n"
        "  config key seeds[1]: -1 is invalid: -1 is less than the minimum of 0"
    )
    with pytest.raises(KbfuseError, match=f"^{re.escape(message)}$"):
        validate_schema(cfg)


def test_validate_schema_takes_another_schema(tmp_path):
    schema = tmp_path / "schema.yaml"
    schema.write_text("type: object\nrequired: [x]\n")
    with pytest.raises(
        KbfuseError, match="^invalid config:\n  config key x: missing \\(required\\)$"
    ):
        validate_schema({}, schema)
    assert validate_schema({"x": 1, "variants": {"v": {}}}, schema) == {
        "x": 1,
        "variants": {"v": {"kernel": "naive"}},
        "kernelbench": {"level": 2},
        "nvrtc_versions": [],
    }


def test_check_config_finds_the_default_kernel_in_kernels(tmp_path, monkeypatch):
    cfg = default_config()
    cfg.pop("fused2")  # the first study's kernels only
    name = next(iter(cfg["variants"]))
    cfg["variants"] = {name: {k: v for k, v in cfg["variants"][name].items() if k != "kernel"}}
    monkeypatch.chdir(ROOT)
    check_config(cfg)  # kernels/naive.cu
    monkeypatch.chdir(tmp_path)
    message = f"config key variants.{name}.kernel: 'naive' has no source kernels/naive.cu"
    with pytest.raises(KbfuseError, match=f"^invalid config:\n  {re.escape(message)}$"):
        check_config(cfg)


def test_check_config_names_a_kernel_source_that_does_not_load(tmp_path):
    cfg = default_config()
    name = next(iter(cfg["variants"]))
    cfg["variants"] = {name: {**cfg["variants"][name], "kernel": "bad"}}
    (tmp_path / "bad.cu").write_text("// no launch line\n")
    with pytest.raises(
        KbfuseError, match=rf"^invalid config:\n  config key variants\.{name}\.kernel: .*launch"
    ):
        check_config(cfg, tmp_path)


def test_f32_bits_refuses_what_is_not_one_float32():
    with pytest.raises(KbfuseError, match=r"^f32_bits needs a one-element float32 tensor, got "):
        f32_bits(torch.tensor([1.0], dtype=torch.float64))
    with pytest.raises(KbfuseError, match=r"^f32_bits needs a one-element float32 tensor, got "):
        f32_bits(torch.tensor([1.0, 2.0]))
    for value in (True, "1.0", None):
        with pytest.raises(KbfuseError, match=rf"^f32_bits needs a real number, got {value!r}$"):
            f32_bits(value)


def test_f32_bits_rounds_a_number_to_float32_whatever_the_default_dtype():
    saved = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        assert f32_bits(0.1) == 0x3DCCCCCD
    finally:
        torch.set_default_dtype(saved)


def test_progress_lines_reach_the_logger_and_the_log_as_written(caplog, tmp_path):
    log = tmp_path / "logs" / "verify.log"
    log.parent.mkdir()
    log.write_text("an earlier run\n")
    say = stage.Progress(log, "kbfuse.checks.verify", fresh=True)
    with caplog.at_level(logging.INFO, logger="kbfuse.checks.verify"):
        say("variant v: 100% %s done")
    assert log.read_text() == "variant v: 100% %s done\n"
    assert [r.getMessage() for r in caplog.records] == ["variant v: 100% %s done"]
    stage.Progress(log, "kbfuse.checks.verify")("appended")
    assert log.read_text().splitlines() == ["variant v: 100% %s done", "appended"]


def test_format_report_names_the_bundle_and_its_environment():
    report = {
        "bundle": "b.tar.gz",
        "bundle_sha256": "f" * 64,
        "environment": {
            "gpu": "H200",
            "driver": "580",
            "driver_cuda": "13.0",
            "cuda": "13.0.1",
            "torch": "2.11",
            "torch_cuda": "13.0",
            "nvrtc": "13.0.88",
        },
        "pin": {"url": "KernelBench.git", "commit": "c" * 40},
        "checked": 3,
        "changed": [],
        "missing": ["timing/81.json"],
        "extra": [],
        "duplicates": [],
        "manifest_problems": [],
        "ok": False,
    }
    assert format_report(report) == (
        "bundle b.tar.gz\n"
        f"  sha256 {'f' * 64}\n"
        "  produced on: GPU H200, driver 580 (CUDA 13.0), CUDA runtime 13.0.1, torch 2.11 "
        "(CUDA 13.0), NVRTC 13.0.88\n"
        f"  KernelBench KernelBench.git @ {'c' * 40}\n"
        "  files listed in manifest: 3\n"
        "  MISSING timing/81.json\n"
        "  FAILED\n"
    )
    # a report of verify_manifest (no bundle): no name, no hash, no duplicates key
    bare = {k: v for k, v in report.items() if k not in ("bundle", "bundle_sha256", "duplicates")}
    assert format_report(bare).startswith("bundle \n  sha256 \n")


def test_verify_bundle_names_the_bundle_and_the_manifest_member(small_study, tmp_path):
    root, _, path, manifest = small_study
    bundle = make_bundle(root, path, tmp_path / "b.tar.gz")
    report = verify_bundle(bundle)
    assert report["ok"] is True
    assert report["bundle"] == str(bundle) and report["bundle_sha256"] == sha256_file(bundle)
    with tarfile.open(bundle, "r:gz") as tar:
        members = {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}
    members[MANIFEST_MEMBER] = json.dumps(manifest).encode()  # same content, not canonical
    edited = tmp_path / "edited.tar.gz"
    edited.write_bytes(pack(members))
    assert verify_bundle(edited)["manifest_problems"] == [
        f"{MANIFEST_MEMBER}: bytes differ from the canonical form (edited)"
    ]


def test_the_bundle_gzip_header_holds_no_file_name_or_time():
    data = pack({"a.json": b"{}\n"})
    assert data[:3] == b"\x1f\x8b\x08"  # gzip, deflate
    assert data[3] & 0x08 == 0  # FLG.FNAME clear
    assert data[4:8] == b"\0\0\0\0"  # MTIME 0
    assert data[8] == 2  # XFL 2: the slowest, best compression (level 9)


@pytest.mark.parametrize(
    ("record", "reason"),
    [
        (["a"], "corrupt correctness record: not a JSON object (list)"),
        (
            {
                "kind": "correctness",
                "implementation": "v",
                "passed": True,
                "failing_checks": ["seed0"],
            },
            "corrupt correctness record: passed is true but failing_checks is not empty",
        ),
    ],
)
def test_gate_reasons_word_for_word(record, reason):
    assert gate.gate({"v": record}) == (
        [],
        {
            "v": {
                "reason": reason,
                "failing_checks": (record["failing_checks"] if isinstance(record, dict) else []),
            }
        },
    )


# --------------------------------------------------------------------------- third run


def test_environment_of_reads_nested_and_flat_fingerprints():
    nested = {
        "gpu": {"name": "NVIDIA H200", "compute_capability": "9.0"},
        "driver": {
            "nvidia_smi": {"driver_version": "580.159.04"},
            "cuda_driver_api": {"cuda": "13.0"},
        },
        "cuda_runtime": {"cuda": "13.2"},
        "torch": "2.11.0+cu130",
        "torch_cuda": "13.0",
        "cupy": "14.2.0",
        "nvrtc": {"version": "13.0"},
        "triton": "3.6.0",
        "python": "3.12.3",
    }
    assert environment_of({"fingerprint": nested}) == {
        "gpu": "NVIDIA H200",
        "compute_capability": "9.0",
        "driver": "580.159.04",
        "driver_cuda": "13.0",
        "cuda": "13.2",
        "torch": "2.11.0+cu130",
        "torch_cuda": "13.0",
        "cupy": "14.2.0",
        "nvrtc": "13.0",
        "triton": "3.6.0",
        "python": "3.12.3",
    }
    flat = {"driver": "570.1", "cuda_runtime": "12.8", "nvrtc": "12.8", "gpu": ["not", "scalar"]}
    env = environment_of({"fingerprint": flat})
    assert (env["driver"], env["cuda"], env["nvrtc"]) == ("570.1", "12.8", "12.8")
    assert env["gpu"] is None and env["driver_cuda"] is None and env["python"] is None
    assert set(environment_of({}).values()) == {None}


def test_verify_record_in_full(fake_device_verify):
    run, root = fake_device_verify
    record = run(pin={"tasks": {"53": {}}})
    assert record == {
        "kind": "verify",
        "schema_version": 1,
        "variant": "v",
        "route": "nvrtc-ptx",
        "kernel": "tail_81",
        "artifact_sha256": "e" * 64,
        "requested_ftz": False,
        "expected_ftz": False,
        "effective_ftz": False,
        "witness": verify.witness_record(PRODUCT, "v")[0],
        "task81": [],
        "task81_note": f"task 81 is not in the pin record {root / 'pin.json'}: no task-81 "
        "tail witness was run",
        "mismatch": False,
        "requested_mismatch": False,
        "finding": None,
        "cuda_cache": cudacache.current_setting(),
    }


def test_verify_builds_the_task81_witness_once_from_checkout_pin_and_device(fake_device_verify):
    run, root = fake_device_verify
    pin = {"tasks": {"81": {}}}
    record = run(pin=pin)
    assert record["task81"] == [TASK81_RECORD]
    assert record["task81_note"] is None
    assert FakeTask81.built == [(root, pin, torch.device("cuda", 3))]


PRODUCT = float(np.float32(1e-10) * np.float32(1e-30))


TASK81_RECORD = {
    "input": -88.0,
    "output": -1e-37,
    "output_bits": "0x8007434c",
    "reference": -1e-37,
    "reference_bits": "0x8007434c",
}


class FakeTask81:
    built: list = []

    def __init__(self, checkout, pin, device):
        FakeTask81.built.append((checkout, pin, device))

    def measure(self, mod):
        return [TASK81_RECORD]


@pytest.fixture
def fake_device_verify(tmp_path, monkeypatch):
    """run(pin) -> the verify record of one keeping nvrtc-ptx artifact on a fake device 3."""
    FakeTask81.built = []
    load = staticmethod(lambda a, m, kernels=(): SimpleNamespace(variant=m["variant"], device=3))
    monkeypatch.setattr(verify.LoadedModule, "load", load)
    monkeypatch.setattr(verify, "witness_output", lambda mod: PRODUCT)
    monkeypatch.setattr(verify, "Task81Witness", FakeTask81)
    options = ["--std=c++11", "--ftz=false"]
    meta = {
        "kind": "compile",
        "variant": "v",
        "route": "nvrtc-ptx",
        "kernel": "tail_81",
        "requested_options": options,
        "actual_options": options,
        "implicit_options": [],
        "expected_ftz": False,
        "artifact_sha256": "e" * 64,
    }
    write_json(tmp_path / "meta.json", meta)

    def run(pin):
        def read_pin(path):
            assert path == tmp_path / "pin.json"
            return pin

        monkeypatch.setattr(verify, "read_pin", read_pin)
        return verify.verify_variant(
            tmp_path / "tails.bin",
            tmp_path / "meta.json",
            tmp_path,
            tmp_path / "pin.json",
            tmp_path / "out.json",
        )

    return run, tmp_path


def test_findings_word_for_word():
    on = describe_finding("v", "nvrtc-cubin", True, True, False, ["--ftz=true"], [])
    assert on == (
        "v: options request FTZ on, but the artifact keeps subnormals (actual options: "
        "--ftz=true); v: the options actually passed imply FTZ on, but the loaded artifact "
        "keeps subnormals on the device; the artifact does not match its compile options (a "
        "CUDA compute-cache entry from another FTZ setting is one known cause: see cuda_cache)"
    )
    two = describe_finding(
        "v", "cupy-default", None, True, True, ["-ftz=true"], ["-ftz=true", "--ftz=true"]
    )
    assert two == (
        "v: options do not request FTZ, but CuPy's implicit -ftz=true --ftz=true flushes "
        "subnormals to zero"
    )
    # an implicit FTZ option that did not decide the bits is not named as the cause
    stale = describe_finding(
        "v", "cupy-default", False, False, True, ["--ftz=false"], ["-ftz=true"]
    )
    assert stale.startswith(
        "v: options request FTZ off, but the artifact flushes subnormals to zero (actual "
        "options: --ftz=false); v: the options actually passed imply FTZ off"
    )


@pytest.mark.parametrize(
    "name",
    ["a\\b", "a\x00b", "C:/x", "C:", "/abs", "../up", "a/../../up", "", "."],
)
def test_unsafe_member_names_are_refused(name):
    member = tarfile.TarInfo(name)
    with pytest.raises(KbfuseError, match="has an unsafe path; refusing to extract"):
        bundle_module._member_name(member)


@pytest.mark.parametrize(
    ("name", "normalised"), [("./a/./b.json", "a/b.json"), ("ab/c", "ab/c"), ("C/x", "C/x")]
)
def test_safe_member_names_are_normalised(name, normalised):
    assert bundle_module._member_name(tarfile.TarInfo(name)) == normalised


def test_read_bundle_skips_folders_and_reads_on(tmp_path):
    out = tmp_path / "b.tar.gz"
    with tarfile.open(out, "w:gz") as tar:
        folder = tarfile.TarInfo(RESULTS + "dir")
        folder.type = tarfile.DIRTYPE
        tar.addfile(folder)
        data = b"{}\n"
        info = tarfile.TarInfo(RESULTS + "dir/a.json")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    found = bundle_module.read_bundle(out, extract_to=tmp_path / "x")
    assert found.records == {RESULTS + "dir/a.json": {"sha256": sha256_bytes(data), "bytes": 3}}
    assert found.duplicates == set()
    assert found.sha256 == sha256_file(out)
    assert (tmp_path / "x" / RESULTS / "dir" / "a.json").read_bytes() == data


def test_load_manifest_messages(small_study, tmp_path):
    _, _, _, manifest = small_study
    path = tmp_path / "bad.json"
    path.write_text("{not json")
    with pytest.raises(KbfuseError, match=rf"^manifest {re.escape(str(path))} is not valid JSON: "):
        load_manifest(path)
    path.write_text("[]")
    with pytest.raises(
        KbfuseError, match=rf"^manifest {re.escape(str(path))}: expected a JSON object$"
    ):
        load_manifest(path)
    with pytest.raises(KbfuseError, match=r"^manifest \S+absent\.json cannot be read: No such"):
        load_manifest(tmp_path / "absent.json")
    with pytest.raises(
        KbfuseError, match=r"^manifest manifest: field kind is 'timing', not 'manifest'$"
    ):
        load_manifest({**manifest, "kind": "timing"})
    edited = {**manifest, "generator": {"kbfuse": "edited"}}
    data, problems = load_manifest(edited)
    assert data == edited
    assert problems == ["manifest: field content_sha256 does not match its content (edited)"]


def test_numerics_input_messages():
    ref = torch.zeros(2)
    with pytest.raises(KbfuseError, match=r"^tolerance atol must be a real number, got True$"):
        check_tolerance(True, 0.0)
    with pytest.raises(KbfuseError, match=r"^tolerance rtol must be a real number, got '1'$"):
        check_tolerance(0.0, "1")
    with pytest.raises(KbfuseError, match=r"^reference must be a torch.Tensor, got list$"):
        bit_equal_count([0.0, 0.0], ref)
    with pytest.raises(KbfuseError, match=r"^candidate must be float32, got torch.float64$"):
        bit_equal_count(ref, ref.double())
    with pytest.raises(
        KbfuseError, match=r"^device mismatch: reference on cpu, candidate on meta$"
    ):
        bit_equal_count(ref, torch.zeros(2, device="meta"))
    with pytest.raises(KbfuseError, match=r"^unknown route 'nvcc'; known routes: \["):
        routes.get_route("nvcc")


def test_verify_variant_refuses_metadata_that_is_not_an_object(tmp_path):
    (tmp_path / "meta.json").write_text("[]\n")
    with pytest.raises(KbfuseError, match=r"variants must be a non-empty mapping|not a compile"):
        verify.verify_variant(
            tmp_path / "a.bin", tmp_path / "meta.json", tmp_path, None, tmp_path / "o"
        )
    assert not (tmp_path / "o").exists()


def test_error_ratio_map_scales_by_the_candidate_by_default():
    ref, cand = torch.tensor([2.0]), torch.tensor([1.0])
    default = error_ratio_map(ref, cand, 0.0, 0.5)
    assert default.tolist() == [2.0]  # |2 - 1| / (0.5 * |1|)
    assert error_ratio_map(ref, cand, 0.0, 0.5, scale="reference").tolist() == [1.0]


# --------------------------------------------------------------------------- fourth run


@pytest.mark.parametrize(
    ("option", "problem"),
    [
        ("", "empty option string"),
        (
            "--ftz true",
            "option '--ftz true' contains whitespace: give one option per list item, written "
            "--name=value",
        ),
        ("--ftz", "option '--ftz': --ftz needs =true or false"),
        ("--ftz=", "option '--ftz=': --ftz needs =true or false"),
        ("--maxrregcount", "option '--maxrregcount': --maxrregcount needs =an integer"),
        ("--std", "option '--std': --std needs =c++03|c++11|c++14|c++17|c++20"),
        ("-I", "option '-I': --include-path needs =a value"),
    ],
)
def test_parse_option_problems_word_for_word(option, problem):
    assert routes.parse_option(option) == (None, problem)


def test_parse_option_keeps_the_text_and_the_value():
    parsed, problem = routes.parse_option("-Iinclude")
    assert problem is None
    assert (parsed.text, parsed.spec.name, parsed.value) == ("-Iinclude", "include-path", "include")


def test_option_problems_of_a_string_and_of_every_option():
    assert routes.option_problems("nvrtc-cubin", "--ftz=true") == [
        "route nvrtc-cubin: options must be a list of strings, got '--ftz=true'"
    ]
    assert routes.option_problems("nvrtc-cubin", ["-arch=sm_90", "--bogus"]) == [
        "route nvrtc-cubin: option '-arch=sm_90' sets the architecture, which the route and the "
        "config key `arch` own; remove it",
        "route nvrtc-cubin: option '--bogus' is not an NVRTC option",
    ]


def test_a_backslash_path_is_not_safe():
    assert is_safe_relpath("timing/81.json") is True
    assert is_safe_relpath("timing\\81.json") is False


def test_compare_with_manifest_names_an_unsafe_path_and_reads_on(small_study):
    """The manifest schema refuses such a path before; this is the second line of defence."""
    _, _, _, manifest = small_study
    record = manifest["files"]["timing/81.json"]
    data = {**manifest, "files": {"../escape.json": record, "timing/81.json": record}}
    report = compare_with_manifest(data, ["earlier"], {"timing/81.json": record}, {})
    assert report["manifest_problems"] == [
        "earlier",
        "manifest lists an unsafe path '../escape.json'",
    ]
    assert report["missing"] == [] and report["changed"] == [] and report["extra"] == []
    assert report["checked"] == 2 and report["ok"] is False


def test_verify_manifest_reports_every_problem_and_reads_on(small_study):
    root, _, path, manifest = small_study
    files = {"absent/a.json": manifest["files"]["timing/81.json"], **manifest["files"]}
    edited = {k: v for k, v in manifest.items() if k != "content_sha256"} | {"files": files}
    edited["content_sha256"] = content_sha256(edited)
    (root / "env/fingerprint.json").write_text("{not json")
    pin = read_json(root / "kernelbench/pin.json")
    write_json(root / "kernelbench/pin.json", {**pin, "commit": "0" * 40})
    report = verify_manifest(root, edited)
    assert report["manifest_problems"] == [
        "manifest field kernelbench_pin differs from kernelbench/pin.json",
    ]
    assert report["missing"] == ["absent/a.json"]
    changed = {c["path"]: c for c in report["changed"]}
    assert sorted(changed) == ["env/fingerprint.json", "kernelbench/pin.json"]
    expected = manifest["files"]["kernelbench/pin.json"]
    assert changed["kernelbench/pin.json"]["expected_sha256"] == expected["sha256"]
    assert changed["kernelbench/pin.json"]["expected_bytes"] == expected["bytes"]
    assert report["pin"] == {"url": pin["url"], "commit": pin["commit"]}


# --------------------------------------------------------------------------- fifth run


def _tar(out: Path, members: list[tuple[str, bytes]], mode: str = "w:gz") -> Path:
    with tarfile.open(out, mode) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out


def test_a_bundle_must_be_gzipped(tmp_path):
    plain = _tar(tmp_path / "b.tar.gz", [("a.json", b"{}\n")], mode="w")
    message = f"bundle {plain} is not a readable .tar.gz: "
    with pytest.raises(KbfuseError, match=f"^{re.escape(message)}"):
        bundle_module.read_bundle(plain, extract_to=tmp_path / "x")
    assert not (tmp_path / "x").exists()


def test_extraction_goes_on_after_a_duplicate(tmp_path):
    members = [(RESULTS + "a", b"1"), (RESULTS + "a", b"2"), (RESULTS + "b", b"3")]
    out = _tar(tmp_path / "b.tar.gz", members)
    found = bundle_module.read_bundle(out, extract_to=tmp_path / "x")
    assert sorted(found.records) == [RESULTS + "a", RESULTS + "b"]
    assert found.records[RESULTS + "a"] == {"sha256": sha256_bytes(b"1"), "bytes": 1}
    assert found.duplicates == {RESULTS + "a"}
    x = tmp_path / "x" / RESULTS
    assert (x / "a").read_bytes() == b"1" and (x / "b").read_bytes() == b"3"


def test_open_bundle_extracts_into_a_fresh_folder_and_removes_it(small_study, tmp_path):
    """What replaced the old check that a member resolves inside the extraction folder: the
    members are written only into a new temporary folder, so nothing there can be a link."""
    root, _, path, _ = small_study
    out = make_bundle(root, path, tmp_path / "b.tar.gz")
    work, outside = tmp_path / "work", tmp_path / "outside"
    work.mkdir()
    outside.mkdir()
    (work / "kbfuse-bundle").symlink_to(outside)  # planted where a careless reader would write
    with bundle_module.open_bundle(out, work) as (report, results, manifest):
        assert report["ok"] is True
        assert results.parent.parent.parent == work
        assert results.parent.parent.name.startswith("kbfuse-bundle-")
        assert (results / "timing/81.json").read_bytes() == (root / "timing/81.json").read_bytes()
        assert manifest == read_json(path)
    assert [p.name for p in work.iterdir()] == ["kbfuse-bundle"]
    assert list(outside.iterdir()) == []


def test_extraction_names_a_member_it_cannot_write(tmp_path):
    members = [(RESULTS + "a", b"file"), (RESULTS + "a/b", b"under a file")]
    out = _tar(tmp_path / "b.tar.gz", members)
    message = f"bundle member '{RESULTS}a/b' cannot be extracted: "
    with pytest.raises(KbfuseError, match=f"^{re.escape(message)}"):
        bundle_module.read_bundle(out, extract_to=tmp_path / "x")


def test_format_report_lists_duplicates_and_says_ok():
    report = {
        "environment": {},
        "pin": {},
        "checked": 1,
        "changed": [],
        "missing": [],
        "extra": [],
        "duplicates": ["kbfuse-bundle/results/a.json"],
        "manifest_problems": [],
        "ok": True,
    }
    lines = format_report(report).splitlines()
    assert lines[-2:] == [
        "  DUPLICATE member kbfuse-bundle/results/a.json",
        "  OK: every file matches the manifest",
    ]


def test_check_config_lists_every_missing_kernel_by_name(tmp_path):
    cfg = default_config()
    cfg.pop("fused2")  # the first study's kernels only
    first, second = list(cfg["variants"])[:2]
    cfg["variants"] = {
        first: {**cfg["variants"][first], "kernel": "gone"},
        second: {**cfg["variants"][second], "kernel": "lost"},
    }
    message = (
        f"invalid config:\n  config key variants.{first}.kernel: 'gone' has no source "
        f"{tmp_path / 'gone.cu'}\n  config key variants.{second}.kernel: 'lost' has no source "
        f"{tmp_path / 'lost.cu'}"
    )
    with pytest.raises(KbfuseError, match=f"^{re.escape(message)}$"):
        check_config(cfg, tmp_path)


def test_load_manifest_needs_a_files_mapping(small_study):
    _, _, _, manifest = small_study
    message = (
        "manifest manifest does not follow the manifest record schema:\n"
        "  field files is []: [] is not of type 'object'"
    )
    with pytest.raises(KbfuseError, match=f"^{re.escape(message)}$"):
        load_manifest({**manifest, "files": []})


def test_option_problems_refuses_what_is_not_a_list():
    assert routes.option_problems("nvrtc-cubin", 5) == [
        "route nvrtc-cubin: options must be a list of strings, got 5"
    ]
    assert routes.option_problems("nvrtc-cubin", ("--ftz=true",)) == []


def test_verify_names_cupys_implicit_ftz_from_the_route(tmp_path, monkeypatch):
    options = ["--std=c++11", "--fmad=false"]
    meta = {
        "kind": "compile",
        "variant": "cupy",
        "route": "cupy-default",
        "kernel": "tail_81",
        "requested_options": options,
        "actual_options": [*options, "-ftz=true"],
        "implicit_options": ["-ftz=true"],
        "expected_ftz": True,
        "artifact_sha256": "e" * 64,
    }
    write_json(tmp_path / "meta.json", meta)
    load = staticmethod(lambda a, m, kernels=(): SimpleNamespace(variant=m["variant"], device=0))
    monkeypatch.setattr(verify.LoadedModule, "load", load)
    monkeypatch.setattr(verify, "witness_output", lambda mod: 0.0)  # the artifact flushes
    record = verify.verify_variant(
        tmp_path / "tails.bin", tmp_path / "meta.json", tmp_path, None, tmp_path / "out.json"
    )
    assert record["finding"] == (
        "cupy: options do not request FTZ, but CuPy's implicit -ftz=true flushes subnormals to zero"
    )
    assert record["mismatch"] is False


# Survivors of the run of today's verify (docs/mutation.md): the record and the log of a job.


def test_verify_records_the_cache_setting_the_artifact_was_loaded_under(
    fake_device_verify, monkeypatch
):
    """The setting is read before the artifact loads: a load that changes the environment
    afterwards does not change what the record (and the log) say the artifact ran under."""
    run, _ = fake_device_verify
    monkeypatch.delenv("CUDA_CACHE_DISABLE", raising=False)
    before = cudacache.current_setting()

    def load_then_disable_the_cache(artifact, meta, kernels=()):
        monkeypatch.setenv("CUDA_CACHE_DISABLE", "1")
        return SimpleNamespace(variant=meta["variant"], device=3)

    monkeypatch.setattr(verify.LoadedModule, "load", staticmethod(load_then_disable_the_cache))
    record = run(pin={"tasks": {}})
    assert before["CUDA_CACHE_DISABLE"] is None
    assert record["cuda_cache"] == before
    assert cudacache.current_setting()["CUDA_CACHE_DISABLE"] == "1"


def test_a_verify_job_log_holds_that_job_only_and_reaches_the_verify_logger(caplog, tmp_path):
    log = tmp_path / "verify.log"
    log.write_text("an earlier job\n")
    message = "variants must be a non-empty mapping name -> (artifact, meta), got {}"
    refused = pytest.raises(KbfuseError, match=f"^{re.escape(message)}$")
    with caplog.at_level(logging.INFO, logger="kbfuse.checks.verify"), refused:
        verify.verify_variants({}, tmp_path, None, {}, log)
    assert log.read_text() == f"failed: {message}\n"
    assert [(r.name, r.getMessage()) for r in caplog.records] == [
        ("kbfuse.checks.verify", f"failed: {message}")
    ]
