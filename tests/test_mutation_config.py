"""Tests written for mutants of the rewritten config.py that survived the run of
docs/mutation.md: the NVRTC version of a variant (resolved, and refused on a route that does
not compile through NVRTC), every bad config file named, and messages word for word. Then
for the survivors of 2026-12-01 in config.py and in routes.py (a variant's options): YAML read
as PyYAML's SafeLoader builds it, limits at their exact boundary, option refusals word for
word, every option after a refused one still checked.
"""

from __future__ import annotations

import copy
import math
import re

import pytest
import yaml
from conftest import ROOT

from kbfuse.compilation import routes
from kbfuse.errors import KbfuseError
from kbfuse.workflow import config as config_module
from kbfuse.workflow.config import (
    MAX_CONFIG_VALUES,
    SHOWN_CHARS,
    check_config,
    check_config_files,
    coerce_numbers,
    read_config_file,
    select_toolchains,
    shown,
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


# --- survivors of the run of 2026-12-01 ----------------------------------------------------------


def test_a_self_referencing_mapping_is_read_and_refused_as_too_many_values(tmp_path):
    # SafeLoader builds a recursive mapping lazily (construct_mapping with deep=False); read
    # deeply it would be "found unconstructable recursive node" instead
    path = tmp_path / "loop.yaml"
    path.write_text("a: &x {b: *x}\n")
    document = read_config_file(path)
    assert document["a"]["b"] is document["a"]
    message = (
        f"invalid config:\n  config file {path}: more than {MAX_CONFIG_VALUES} values once its "
        "YAML aliases are expanded"
    )
    with pytest.raises(KbfuseError, match=f"^{re.escape(message)}$"):
        check_config_files([path])


def test_an_unhashable_key_is_refused_by_yaml_naming_the_file(tmp_path):
    path = tmp_path / "key.yaml"
    path.write_text("? [a, b]\n: 1\n")
    message = f"config file {path}: while constructing a mapping in "
    with pytest.raises(KbfuseError, match=f"^{re.escape(message)}.* found unhashable key"):
        read_config_file(path)


def test_a_config_file_is_read_as_utf8_whatever_the_locale(tmp_path, monkeypatch):
    """A stand-in for a Latin-1 locale: open() without an encoding decodes as Latin-1."""
    real_open = open

    def latin1_locale_open(path, *args, encoding=None, **kwargs):
        return real_open(path, *args, encoding=encoding or "latin-1", **kwargs)

    monkeypatch.setattr(config_module, "open", latin1_locale_open, raising=False)
    path = tmp_path / "u.yaml"
    path.write_bytes("name: caf\u00e9\n".encode())
    assert read_config_file(path) == {"name": "caf\u00e9"}


def test_the_values_are_counted_up_to_the_limit_exactly(monkeypatch):
    monkeypatch.setattr(config_module, "MAX_CONFIG_VALUES", 4)
    assert not config_module._too_many_values({"a": [1], "b": 2})  # 4 values
    assert config_module._too_many_values({"a": [1, 2], "b": 3})  # 5 values
    assert config_module._too_many_values([[[[[]]]]])  # 5 nested lists


def _custom_schema(tmp_path, schema: dict):
    path = tmp_path / "schema.yaml"
    path.write_text(yaml.safe_dump(schema))
    return path


def test_an_unknown_key_where_no_key_is_known(tmp_path):
    schema = _custom_schema(tmp_path, {"type": "object", "additionalProperties": False})
    message = "invalid config:\n  config key a: unknown key (known here: )"
    with pytest.raises(KbfuseError, match=f"^{re.escape(message)}$"):
        validate_schema({"a": 1}, schema)


def test_a_mapping_where_a_list_is_wanted_is_a_type_error_not_missing_keys():
    cfg = copy.deepcopy(RAW)
    cfg["tasks"] = {"a": 1}
    message = (
        "invalid config:\n  config key tasks: {'a': 1} is invalid: {'a': 1} is not of type "
        "'array' (on the command line give lists and mappings in YAML flow style, e.g. "
        "--config 'tasks=[53, 81]' or --config 'timing={rounds: 25, warmup: 8}')"
    )
    with pytest.raises(KbfuseError, match=f"^{re.escape(message)}$"):
        validate_schema(cfg)


def test_a_schema_without_variants_leaves_no_variant(tmp_path):
    schema = _custom_schema(tmp_path, {"type": "object"})
    message = "config key nvrtc_versions: [] leaves no variant in the study"
    with pytest.raises(KbfuseError, match=f"^{re.escape(message)}$"):
        validate_schema({}, schema)


def test_variants_of_an_nvrtc_version_not_listed_leave_the_study():
    config = {
        "variants": {"old": {"route": "nvrtc-cubin", "nvrtc": "12.9"}, "default": {}},
        "nvrtc_versions": ["13.0"],
    }
    assert select_toolchains(config)["variants"] == {"default": {}}
    config["variants"] = {"old": {"nvrtc": "12.9"}}
    config["nvrtc_versions"] = ["13.0", "12.8"]
    message = "config key nvrtc_versions: ['12.8', '13.0'] leaves no variant in the study"
    with pytest.raises(KbfuseError, match=f"^{re.escape(message)}$"):
        select_toolchains(config)


def test_a_problem_at_the_top_level_is_named_so():
    message = (
        "invalid config:\n  config key <top level>: key 1 is not a string (in YAML, quote it: '1')"
    )
    with pytest.raises(KbfuseError, match=f"^{re.escape(message)}$"):
        validate_schema({1: "x"})


def test_integers_are_refused_from_129_bits_on():
    assert config_module._value_problems({"seed": 2**128 - 1}) == []
    big = 2**128
    message = f"invalid config:\n  config key timing.seed: {big} is out of range"
    with pytest.raises(KbfuseError, match=f"^{re.escape(message)}$"):
        validate_schema({"timing": {"seed": big}})


def test_a_control_character_in_a_nested_key_is_named():
    message = "invalid config:\n  config key variants: key 'a\\x01' has a control character"
    with pytest.raises(KbfuseError, match=f"^{re.escape(message)}$"):
        validate_schema({"variants": {"a\x01": {}}})


def test_every_bad_item_of_a_list_is_named():
    message = (
        "invalid config:\n  config key tasks[0]: inf is not a finite number\n"
        "  config key tasks[2]: nan is not a finite number"
    )
    with pytest.raises(KbfuseError, match=f"^{re.escape(message)}$"):
        validate_schema({"tasks": [math.inf, 53, math.nan]})


def test_numbers_are_coerced_under_additional_properties_and_untyped_items():
    schema = {"type": "object", "additionalProperties": {"type": "integer"}}
    assert coerce_numbers({"a": "5"}, schema) == {"a": 5}
    assert coerce_numbers({"a": "5"}, {"type": "object"}) == {"a": "5"}
    assert coerce_numbers(["1"], {"type": "array"}) == ["1"]
    assert coerce_numbers(["1"], {"type": "array", "items": {"type": "number"}}) == [1]


def test_a_value_of_80_characters_is_shown_whole_and_a_longer_one_cut():
    assert shown("a" * 78) == repr("a" * 78)  # 80 characters with the quotes
    assert shown("a" * 79) == "'" + "a" * 74 + " ...]"
    assert len(shown(list(range(100)))) == SHOWN_CHARS


def test_a_config_that_is_no_mapping_is_named_with_its_value():
    message = "invalid config:\n  config: expected a mapping, got [1, 2]"
    with pytest.raises(KbfuseError, match=f"^{re.escape(message)}$"):
        validate_schema([1, 2])


# --- a variant's options (routes.option_problems, called by check_config) ----------------------


def test_a_printable_non_ascii_option_is_refused_as_such():
    assert routes.option_problems("nvrtc-cubin", ["-DX=caf\u00e9"]) == [
        "route nvrtc-cubin: option '-DX=café' is refused: it contains a non-ASCII or control "
        "character"
    ]


def test_a_shell_character_in_a_value_is_refused_naming_the_pattern():
    assert routes.option_problems("nvcc-cubin", ["-DX=$(id)"]) == [
        "route nvcc-cubin: option '-DX=$(id)' is refused: --define-macro values must match "
        f"{routes.MACRO_DEFINITION} (no shell characters, paths or commas)"
    ]


def test_the_options_after_a_refused_one_are_still_checked():
    assert routes.option_problems("nvrtc-ptx", ["-I/usr/include", "--ftz=maybe", "-pch"]) == [
        f"route nvrtc-ptx: option '-I/usr/include' is refused: it {routes._READS_HEADERS}",
        "route nvrtc-ptx: option '--ftz=maybe': --ftz expects true or false, not 'maybe'",
        f"route nvrtc-ptx: option '-pch' is refused: it {routes._PCH}",
    ]


def test_integer_options_take_digits():
    parsed, reason = routes.parse_option("--maxrregcount=32")
    assert reason is None
    assert (parsed.spec.name, parsed.value) == ("maxrregcount", "32")
    assert routes.option_problems("nvcc-cubin", ["--maxrregcount=32", "-split-compile=0"]) == []


def test_the_check_block_is_checked_after_the_rest_word_for_word():
    cfg = validate_schema(copy.deepcopy(RAW))
    cfg["controls"]["tiny_values"]["low"] = cfg["controls"]["tiny_values"]["high"]
    cfg["check"] = {"seed": -1}
    high = cfg["controls"]["tiny_values"]["high"]
    message = (
        f"invalid config:\n  config key controls.tiny_values: low {high!r} must be below high "
        f"{high!r}\n  config key check.seed is -1: it must be an integer >= 0"
    )
    with pytest.raises(KbfuseError, match=f"^{re.escape(message)}$"):
        check_config(cfg, ROOT / "kernels")
    cfg["check"] = "x"
    with pytest.raises(KbfuseError, match=r"\n  config key check is 'x': it must be a mapping$"):
        check_config(cfg, ROOT / "kernels")


def test_true_and_false_become_booleans_only_where_the_schema_wants_one():
    assert coerce_numbers("true", {"type": "string"}) == "true"
    assert coerce_numbers("false", {}) == "false"
    assert coerce_numbers("true", {"type": "boolean"}) is True
    assert coerce_numbers("false", {"type": "boolean"}) is False
    assert coerce_numbers("yes", {"type": "boolean"}) == "yes"
