"""Tests written for mutants of the rewritten config.py that survived the run of
docs/mutation.md: the NVRTC version of a variant (resolved, and refused on a route that does
not compile through NVRTC), every bad config file named, and messages word for word.
"""

from __future__ import annotations

import copy
import re

import pytest
import yaml
from conftest import ROOT

from kbfuse.errors import KbfuseError
from kbfuse.workflow.config import (
    MAX_CONFIG_VALUES,
    check_config,
    check_config_files,
    read_config_file,
    validate_schema,
    variant_spec,
)

RAW = yaml.safe_load((ROOT / "config/config.yaml").read_text())


def test_variant_spec_carries_the_nvrtc_version_only_when_given():
    config = {"variants": {"v": {"route": "nvrtc-cubin", "options": ["--ftz=false"]}}}
    assert "nvrtc" not in variant_spec(config, "v")
    config["variants"]["v"]["nvrtc"] = "12.9"
    assert variant_spec(config, "v") == {
        "name": "v",
        "route": "nvrtc-cubin",
        "kernel": "naive",
        "options": ["--ftz=false"],
        "nvrtc": "12.9",
    }


def test_nvrtc_on_a_route_without_nvrtc_is_refused_word_for_word():
    cfg = validate_schema(copy.deepcopy(RAW))
    cfg["variants"]["cupy-default"]["nvrtc"] = "12.9"
    message = (
        "invalid config:\n  config key variants.cupy-default.nvrtc: '12.9' applies only to the "
        "routes ['nvrtc-cubin', 'nvrtc-ptx'], not 'cupy-default'"
    )
    with pytest.raises(KbfuseError, match=f"^{re.escape(message)}$"):
        check_config(cfg, ROOT / "kernels")


def test_every_bad_config_file_is_named(tmp_path):
    broken, listed, bomb = tmp_path / "a.yaml", tmp_path / "b.yaml", tmp_path / "c.yaml"
    broken.write_text("a: 1\na: 2\n")
    listed.write_text("- 1\n")
    lines = ["a0: &a0 [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]"]
    lines += [f"a{i}: &a{i} [*a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}]" for i in range(1, 9)]
    bomb.write_text("\n".join(lines) + "\n")
    message = (
        f"invalid config:\n  config file {broken}: key 'a' is given twice in one mapping "
        "(lines 1 and 2): YAML would silently keep only the last\n"
        f"  config file {listed}: expected a mapping, got [1]\n"
        f"  config file {bomb}: more than {MAX_CONFIG_VALUES} values once its YAML aliases are "
        "expanded"
    )
    with pytest.raises(KbfuseError, match=f"^{re.escape(message)}$"):
        check_config_files([broken, listed, bomb])


def test_a_config_nested_too_deeply_is_named(tmp_path):
    path = tmp_path / "deep.yaml"
    path.write_text("a: " + "[" * 5000 + "]" * 5000 + "\n")
    message = f"config file {path}: nested too deeply to read"
    with pytest.raises(KbfuseError, match=f"^{re.escape(message)}$"):
        read_config_file(path)


def test_a_wrong_scalar_type_gets_no_flow_style_hint():
    cfg = copy.deepcopy(RAW)
    cfg["timing"]["warmup"] = "abc"
    message = (
        "invalid config:\n  config key timing.warmup: 'abc' is invalid: 'abc' is not of type "
        "'integer'"
    )
    with pytest.raises(KbfuseError, match=f"^{re.escape(message)}$"):
        validate_schema(cfg)
