"""NVRTC as a variant axis: NVRTC 12.9 beside 13.0 in one process, on the CPU (compiling needs no
GPU). Both come as pip wheels in the test extra (nvidia-cuda-nvrtc 13.0.88 and
nvidia-cuda-nvrtc-cu12 12.9.86)."""

from __future__ import annotations

import contextlib
import io
import json
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

from kbfuse.compilation import nvrtc
from kbfuse.compilation.compile import compile_variant
from kbfuse.errors import KbfuseError
from kbfuse.io import read_json, sha256_file
from kbfuse.workflow.config import load_config, validate_schema

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "config" / "config.yaml"
REFERENCE = ROOT / "results" / "reference" / "h200" / "compile"


def compile_quietly(variant, spec, out: Path) -> dict:
    with contextlib.redirect_stdout(io.StringIO()):
        return compile_variant(
            ROOT / "kernels" / f"{spec['kernel']}.cu",
            variant,
            spec,
            "sm_90",
            out / f"{variant}.bin",
            out / f"{variant}.json",
            None,
        )


def test_both_nvrtc_versions_load_side_by_side():
    default, twelve = nvrtc.load_library(), nvrtc.load_library("12.9")
    assert (default.version, default.full_version) == ("13.0", "13.0.88")
    assert (twelve.version, twelve.full_version) == ("12.9", "12.9.86")
    assert twelve.path.endswith("cuda_nvrtc/lib/libnvrtc.so.12")
    assert nvrtc.load_library("12") is twelve and nvrtc.load_library("13") is default
    assert nvrtc.matches("12.9", "12") and not nvrtc.matches("12.9", "12.1")


def test_a_missing_version_is_one_line_naming_what_to_install(tmp_path):
    spec = {"route": "nvrtc-cubin", "kernel": "naive", "nvrtc": "11.8", "options": ["--ftz=false"]}
    with pytest.raises(KbfuseError, match=r"NVRTC 11\.8 is not installed; found only 13\.0") as err:
        compile_quietly("old", spec, tmp_path)
    assert "\n" not in str(err.value)
    assert not (tmp_path / "old.bin").exists() and not (tmp_path / "old.json").exists()
    message = nvrtc.missing_message("12.9", [])
    assert message.startswith("NVRTC 12.9 is not installed: pip install 'kbfuse[nvrtc12]'")
    assert "nvidia-cuda-nvrtc-cu12 12.9" in message


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    """Every NVRTC variant of the default config, compiled here: variant -> meta record."""
    out = tmp_path_factory.mktemp("toolchains")
    config = load_config(CONFIG, ROOT / "kernels")
    return {
        name: compile_quietly(name, spec, out)
        for name, spec in config["variants"].items()
        if spec["route"] != "cupy-default"  # CuPy's own NVRTC, needs CuPy
    }


TWINS = {
    "nvrtc-cubin-noftz": "nvrtc12-cubin-noftz",
    "nvrtc-cubin-ftz": "nvrtc12-cubin-ftz",
    "nvrtc-ptx-noftz": "nvrtc12-ptx-noftz",
    "nvrtc-ptx-ftz": "nvrtc12-ptx-ftz",
    "fast-nvrtc-cubin-noftz": "fast-nvrtc12-cubin-noftz",
}


@pytest.mark.parametrize(("variant", "twin"), TWINS.items())
def test_twins_record_their_toolchain_and_keep_the_ftz_counts(compiled, variant, twin):
    ours, theirs = compiled[variant], compiled[twin]
    assert ours["compiler"]["requested_version"] is None
    assert ours["compiler"]["full_version"] == "13.0.88"
    assert theirs["compiler"]["requested_version"] == "12.9"
    assert theirs["compiler"]["full_version"] == "12.9.86"
    for record in (ours, theirs):
        library = record["compiler"]["library"]
        assert record["compiler"]["library_sha256"] == sha256_file(library)
    # another compiler, another artifact ...
    assert ours["artifact_sha256"] != theirs["artifact_sha256"]
    # ... with the same FTZ instructions in PTX and SASS and the same expected FTZ
    for key in ("ptx_ftz_count", "sass_ftz_count", "expected_ftz", "requested_options"):
        assert ours[key] == theirs[key], key
    flushing = variant.endswith("-ftz")
    assert ours["expected_ftz"] is flushing
    assert ours["ptx_ftz_count"] == (110 if flushing else 126 if variant.startswith("fast") else 8)


@pytest.mark.parametrize("variant", TWINS)
def test_the_default_toolchain_reproduces_the_reference_artifacts(compiled, variant):
    reference = read_json(REFERENCE / variant / "meta.json")
    assert compiled[variant]["artifact_sha256"] == reference["artifact_sha256"]


def test_nvrtc_versions_decides_which_twins_are_in_the_study():
    raw = yaml.safe_load(CONFIG.read_text())
    full = validate_schema(yaml.safe_load(CONFIG.read_text()))
    assert set(TWINS.values()) <= set(full["variants"])
    raw["nvrtc_versions"] = []
    without = validate_schema(raw)
    assert not set(TWINS.values()) & set(without["variants"])
    assert set(TWINS) | {"cupy-default"} == set(without["variants"])
    only_twins = yaml.safe_load(CONFIG.read_text())  # validate_schema filtered `raw` in place
    only_twins["nvrtc_versions"] = []
    only_twins["variants"] = {name: only_twins["variants"][name] for name in TWINS.values()}
    with pytest.raises(KbfuseError, match=r"nvrtc_versions: \[\] leaves no variant"):
        validate_schema(only_twins)


def test_nvrtc_is_refused_where_the_route_does_not_use_it(tmp_path):
    raw = yaml.safe_load(CONFIG.read_text())
    raw["variants"]["cupy-default"]["nvrtc"] = "12.9"
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(KbfuseError, match=r"variants.cupy-default.nvrtc: '12.9' applies only"):
        load_config(path, ROOT / "kernels")
    raw["variants"]["cupy-default"]["nvrtc"] = "twelve"
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(KbfuseError, match=r"variants.cupy-default.nvrtc: 'twelve' is invalid"):
        load_config(path, ROOT / "kernels")


def test_a_carried_library_never_replaces_the_default(tmp_path, monkeypatch):
    """KBFUSE_NVRTC_PATH adds versions (NVRTC 12.9 carried to an offline machine); the default
    NVRTC stays the installed one. (On the H200 the carried 12.9 once came first and compiled
    the default variants too.)"""
    carried = tmp_path / "nvrtc12"
    carried.mkdir()
    twelve = Path(nvrtc.load_library("12.9").path)
    shutil.copy(twelve, carried / twelve.name)  # a copy: the search skips a file found twice
    monkeypatch.setenv(nvrtc.PATH_ENV, str(carried))
    sources = [source for _, source in nvrtc.candidates()]
    assert sources[:2] == ["pip wheel nvidia-cuda-nvrtc", "pip wheel nvidia-cuda-nvrtc-cu12"]
    assert f"{nvrtc.PATH_ENV} {carried}" in sources[2:]


def test_the_cuda12_extra_resolves_on_pypi(tmp_path):
    """Every requirement of the `cuda12` extra exists on PyPI and resolves together (it named a
    `nvidia-cuda-cuobjdump-cu12` that was never published). pip --dry-run, no install."""
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    report = tmp_path / "report.json"
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--dry-run", "--ignore-installed"]
        + ["--report", str(report), *extra["cuda12"]],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    resolved = {item["metadata"]["name"] for item in json.loads(report.read_text())["install"]}
    assert {"cupy-cuda12x", "nvidia-cuda-nvrtc-cu12", "nvidia-cuda-cuobjdump"} <= resolved
