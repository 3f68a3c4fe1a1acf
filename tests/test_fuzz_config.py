"""Issues 12 and 18: property tests over the config check, option lists, launch lines and kernel
sources. Whatever the input, the answer is a value or a KbfuseError, never another exception;
and a config the check accepts is one that no job's own validator refuses later.
"""

from __future__ import annotations

import copy
import math
import tempfile
from pathlib import Path

import pytest
import torch
import yaml
from conftest import json_paths
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from snakemake.cli import parse_config
from snakemake.utils import update_config

from kbfuse.checks import controls, correctness
from kbfuse.compilation import compile as kcompile
from kbfuse.compilation import kernelsrc, routes
from kbfuse.errors import KbfuseError
from kbfuse.timing import measure
from kbfuse.workflow.config import check_config, read_config_file, validate_schema

ROOT = Path(__file__).resolve().parents[1]
KERNELS = ROOT / "kernels"
DEFAULT = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


PATHS = [p for p in json_paths(DEFAULT) if p]
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-3, max_value=3)
    | st.integers()
    | st.floats()
    | st.text(max_size=12)
    | st.sampled_from(["1e-4", "81", "-60", "sm_90", "auto", ".nan", " ", "--ftz=true", "naive"])
)
VALUES = st.recursive(
    SCALARS,
    lambda children: (
        st.lists(children, max_size=3)
        | st.dictionaries(st.text(max_size=8) | st.integers(), children, max_size=3)
    ),
    max_leaves=6,
)


def checked_or_refused(cfg) -> dict | None:
    """The checked config, or None when the check refused it with a KbfuseError."""
    try:
        validate_schema(cfg)
        check_config(cfg, KERNELS)
    except KbfuseError as exc:
        assert str(exc).startswith("invalid config:\n  ")
        return None
    return cfg


PINNED_TOLERANCE = {"atol": 1e-4, "rtol": 1e-4}  # from the contract, not the config


def assert_jobs_accept(cfg: dict) -> None:
    """What the GPU jobs check before their work (they raise KbfuseError otherwise)."""
    measure.check_protocol(cfg["timing"])
    controls.check_controls_cfg(cfg["controls"])
    correctness.check_request(
        cfg["seeds"], cfg["distributions"], PINNED_TOLERANCE, cfg["timing"]["input_seed"]
    )
    assert all(math.isfinite(v) for v in cfg["controls"]["witness81_inputs"])  # run_witness81
    assert cfg["kernelbench"]["url"].strip()  # kernelbench.checkout
    for seed in [*cfg["seeds"], cfg["timing"]["input_seed"]]:  # inputs.make_input, build_model
        torch.Generator().manual_seed(seed)
    if cfg["arch"] != "auto":
        kcompile.resolve_arch(cfg["arch"])
    for name in cfg["variants"]:
        spec = {**cfg["variants"][name]}
        kcompile.check_spec(name, spec)


def mutate(cfg: dict, path: tuple, value) -> dict:
    node = cfg
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return cfg


@FUZZ
@given(path=st.sampled_from(PATHS), value=VALUES)
def test_any_value_anywhere_is_checked_or_refused_with_a_message(path, value):
    cfg = checked_or_refused(mutate(copy.deepcopy(DEFAULT), path, value))
    if cfg is not None:
        assert_jobs_accept(cfg)


JOB_CHECKED = [p for p in PATHS if p[0] in ("timing", "controls", "seeds", "arch", "kernelbench")]
EDGE_VALUES = [
    *range(-2, 4),
    *(2**64 - 1, 2**64),
    *(0.0, 1.0, 2.5, -0.0, float("nan"), float("inf"), float("-inf"), -1e-300, -60.0, -110.0),
    *(True, False, None, [], {}, [0], [0, 0]),
    *("1", "0", "-1", "1e-4", "1.5", "-1e999", " ", "", "-x", "sm_90", "sm_89a", "sm_100f"),
]
EDGE = st.sampled_from(EDGE_VALUES)


def test_every_edge_value_at_every_job_checked_key_is_refused_or_accepted_by_the_jobs():
    """The exhaustive single-change version of the property below (deterministic)."""
    refused = 0
    for path in JOB_CHECKED:
        for value in EDGE_VALUES:
            cfg = checked_or_refused(mutate(copy.deepcopy(DEFAULT), path, copy.deepcopy(value)))
            if cfg is None:
                refused += 1
            else:
                assert_jobs_accept(cfg)
    assert 0 < refused < len(JOB_CHECKED) * len(EDGE_VALUES)


@FUZZ
@given(changes=st.lists(st.tuples(st.sampled_from(JOB_CHECKED), EDGE), min_size=1, max_size=3))
def test_a_config_the_check_accepts_is_accepted_by_every_job(changes):
    """Issue 18: nothing the GPU jobs refuse (warmup 0, low >= high, nan, 25.0 rounds...)
    passes the config check."""
    cfg = copy.deepcopy(DEFAULT)
    for path, value in changes:
        try:
            # a copy: sampled_from hands out the same {} twice, and a config holding itself
            # is not one a file or --config can give (YAML aliases are refused before this)
            mutate(cfg, path, copy.deepcopy(value))
        except (TypeError, KeyError, IndexError):  # an earlier change replaced a parent
            assume(False)
    cfg = checked_or_refused(cfg)
    if cfg is not None:
        assert_jobs_accept(cfg)


TOP_KEYS = list(DEFAULT)


@FUZZ
@given(key=st.sampled_from(TOP_KEYS), text=st.text(max_size=40))
def test_any_config_override_is_checked_or_refused_with_a_message(key, text):
    try:
        overrides = parse_config([f"{key}={text}"])
    except Exception:  # noqa: BLE001 - Snakemake's own parser refused it, before kbfuse
        assume(False)
    cfg = copy.deepcopy(DEFAULT)
    update_config(cfg, overrides)
    cfg = checked_or_refused(cfg)
    if cfg is not None:
        assert_jobs_accept(cfg)


@FUZZ
@given(
    text=st.text(max_size=200)
    | st.lists(
        st.sampled_from(["a:", " b", "\n", "- ", "[", "]", "{", "}", "? ", ": ", "!!", "&x", "*x"])
        | st.text(max_size=5),
        max_size=30,
    ).map("".join)
)
def test_any_config_file_text_is_read_or_refused_with_a_message(text):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "c.yaml"
        path.write_text(text, encoding="utf-8", errors="surrogatepass")
        try:
            read_config_file(path)
        except KbfuseError as exc:
            assert str(exc).startswith(f"config file {path}: ")


def test_a_deeply_nested_config_file_is_refused_with_a_message(tmp_path):
    path = tmp_path / "deep.yaml"
    path.write_text("[" * 5000 + "]" * 5000)
    with pytest.raises(KbfuseError, match=r"nested too deeply|config file"):
        read_config_file(path)


OPTION_PARTS = st.sampled_from(
    ["-", "--", "D", "I", "U", "ftz", "arch", "Xptxas", "include", "pch", "=", "$", "(", "/", ","]
)


@FUZZ
@given(
    options=st.lists(
        st.text(max_size=20)
        | st.lists(OPTION_PARTS | st.text(max_size=3), max_size=6).map("".join)
        | st.integers()
        | st.none(),
        max_size=5,
    ),
    route=st.sampled_from([*routes.ROUTES, "bogus"]),
)
def test_any_option_list_gives_messages_naming_the_route(options, route):
    problems = routes.option_problems(route, options)
    assert all(isinstance(p, str) for p in problems)
    if route in routes.ROUTES:
        assert all(p.startswith(f"route {route}: ") for p in problems)


LAUNCH_PARTS = st.sampled_from(
    [
        "// kbfuse-launch: ",
        "// kbfuse-launch tail53: ",
        "per-element ",
        "grid-stride ",
        "threads=",
        "blocks-per-sm=",
        "items-per-thread=",
        "256 ",
        "0",
        "\n",
        "=",
        " ",
        "\u00b2",
        "\u0661",
        "\x00",
        "99999999999",
    ]
)


@FUZZ
@given(text=st.lists(LAUNCH_PARTS | st.text(max_size=4), max_size=25).map("".join))
def test_any_launch_line_is_parsed_or_refused_with_a_message(text):
    try:
        plan = kernelsrc.parse_launch(text, "k.cu")
    except KbfuseError as exc:
        assert str(exc).startswith("kernel source k.cu")
        return
    for launch in [plan.default, *plan.per_kernel.values()]:
        assert 0 < launch.threads <= kernelsrc.MAX_THREADS_PER_BLOCK
        assert kernelsrc.grid_blocks(launch, 1000, 132) >= 1


SOURCE_PARTS = st.sampled_from(
    [
        "// kbfuse-launch: per-element threads=256\n",
        '#include "a.cuh"',
        "#include <cstdint>",
        "#include <stdio.h>",
        "#include A",
        "/*",
        "*/",
        "//",
        '"',
        "'",
        "\\",
        "\n",
        "#",
        "include",
        " ",
        "%:",
        "__has_include",
        'R"(',
        ')"',
        "1'0",
    ]
)


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    source=st.lists(SOURCE_PARTS | st.text(max_size=4), max_size=20).map("".join),
    header=st.lists(SOURCE_PARTS | st.text(max_size=4), max_size=8).map("".join),
)
def test_any_kernel_source_is_loaded_or_refused_with_a_message(source, header):
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "k.cu").write_text(source, encoding="utf-8", errors="surrogatepass")
        (root / "a.cuh").write_text(header, encoding="utf-8", errors="surrogatepass")
        try:
            unit = kernelsrc.load(root / "k.cu")
        except KbfuseError as exc:
            assert str(exc).startswith("kernel source ")
            return
        assert set(unit.files) <= {"k.cu", "a.cuh"}
        if "a.cuh" in unit.files:
            assert kernelsrc.included_headers(root / "k.cu") == [root / "a.cuh"]


@FUZZ
@given(arch=st.text(max_size=8) | st.from_regex(r"sm_[0-9]{1,4}[a-z]?", fullmatch=True))
def test_the_config_admits_exactly_the_architectures_compile_accepts(arch):
    cfg = copy.deepcopy(DEFAULT)
    cfg["arch"] = arch
    admitted = checked_or_refused(cfg) is not None
    try:
        compiles = arch == "auto" or kcompile.resolve_arch(arch) == arch
    except KbfuseError:
        compiles = False
    assert admitted == compiles, arch


def test_integers_too_long_for_python_are_refused_with_a_message(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("seeds: [" + "9" * 5000 + "]\n")
    with pytest.raises(KbfuseError, match=r"config file .*c\.yaml: .*digits"):
        read_config_file(path)
    cfg = copy.deepcopy(DEFAULT)
    update_config(cfg, parse_config(["seeds=[" + "9" * 5000 + "]"]))
    with pytest.raises(KbfuseError, match=r"config key seeds\[0\]: '9999.* is invalid"):
        validate_schema(cfg)
    cfg = copy.deepcopy(DEFAULT)
    cfg["seeds"] = [10**5000]  # above torch's seed range
    with pytest.raises(
        KbfuseError, match=r"config key seeds\[0\]: <an integer of 16610 bits> is out of range"
    ):
        validate_schema(cfg)
