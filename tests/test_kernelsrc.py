"""Kernel sources: header inlining, the kbfuse-launch contract, grid sizes."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from kbfuse.compilation import kernelsrc
from kbfuse.compilation.kernelsrc import (
    Launch,
    LaunchPlan,
    grid_blocks,
    included_headers,
    parse_launch,
)
from kbfuse.errors import KbfuseError

ROOT = Path(__file__).resolve().parents[1]
KERNELS = ROOT / "kernels"
PER_ELEMENT = "// kbfuse-launch: per-element threads=256\n"


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_headers_are_inlined_once_and_hashed(tmp_path):
    write(tmp_path / "ops.cuh", '#pragma once\n#include "more.cuh"\n__device__ int one();\n')
    write(tmp_path / "more.cuh", "#pragma once\n__device__ int two();\n")
    cu = write(
        tmp_path / "k.cu",
        PER_ELEMENT + '#include "ops.cuh"\n#include "more.cuh"  // again\n#include <cstdint>\n',
    )
    unit = kernelsrc.load(cu)
    assert '#include "' not in unit.text.replace('#include "more.cuh": inlined', "")
    assert unit.text.count("__device__ int two();") == 1
    assert unit.text.count("__device__ int one();") == 1
    assert "#pragma once" not in unit.text
    assert "#include <cstdint>" in unit.text  # system headers are the compiler's business
    assert list(unit.files) == ["k.cu", "ops.cuh", "more.cuh"]
    assert unit.files["ops.cuh"] == hashlib.sha256((tmp_path / "ops.cuh").read_bytes()).hexdigest()
    assert unit.sha256 == hashlib.sha256(unit.text.encode()).hexdigest()
    assert included_headers(cu) == [tmp_path / "ops.cuh", tmp_path / "more.cuh"]


def test_editing_a_header_changes_the_translation_unit_hash(tmp_path):
    write(tmp_path / "ops.cuh", "__device__ float f(float x) { return x; }\n")
    cu = write(tmp_path / "k.cu", PER_ELEMENT + '#include "ops.cuh"\n')
    before = kernelsrc.load(cu).sha256
    write(tmp_path / "ops.cuh", "__device__ float f(float x) { return -x; }\n")
    assert kernelsrc.load(cu).sha256 != before


@pytest.mark.parametrize(
    ("files", "message"),
    [
        ({"k.cu": PER_ELEMENT + '#include "missing.cuh"\n'}, r"missing.cuh does not exist"),
        (
            {"k.cu": PER_ELEMENT + '#include "a.cuh"\n', "a.cuh": '#include "a.cuh"\n'},
            r"circular \(k.cu -> a.cuh -> a.cuh\)",
        ),
        ({"k.cu": PER_ELEMENT + '#include "../x.cuh"\n'}, r"only headers next to"),
        ({"k.cu": PER_ELEMENT + '#include "other.cu"\n'}, r"only headers next to"),
        ({"k.cu": "__global__ void f() {}\n"}, r"needs exactly one '// kbfuse-launch"),
    ],
)
def test_bad_sources_are_named(tmp_path, files, message):
    for name, text in files.items():
        write(tmp_path / name, text)
    with pytest.raises(KbfuseError, match=message):
        kernelsrc.load(tmp_path / "k.cu")


def test_launch_lines_default_and_per_kernel():
    plan = parse_launch(
        "// kbfuse-launch: grid-stride threads=128 blocks-per-sm=4 items-per-thread=8\n"
        "  //kbfuse-launch tail53 : per-element threads=512\n",
        "k.cu",
    )
    assert plan.default == Launch("grid-stride", 128, 4, 8)
    assert plan.for_kernel("tail53") == Launch("per-element", 512)
    assert plan.for_kernel("tail81") is plan.default
    assert LaunchPlan.from_record(plan.record()) == plan


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (PER_ELEMENT * 2, r"exactly one .* found 2"),
        ("// kbfuse-launch: blocky threads=256\n", r"mode 'blocky' is not one of"),
        ("// kbfuse-launch: per-element threads=0\n", r"'threads=0' is not name=positive"),
        ("// kbfuse-launch: per-element threads=2048\n", r"threads=2048 is over 1024"),
        ("// kbfuse-launch: per-element\n", r"missing \['threads'\]"),
        ("// kbfuse-launch: per-element threads=64 blocks-per-sm=2\n", r"unknown \['blocks-per"),
        (
            "// kbfuse-launch: grid-stride threads=256 blocks-per-sm=2\n",
            r"missing \['items-per-thread'\]",
        ),
        (
            PER_ELEMENT + "// kbfuse-launch t: per-element threads=1\n" * 2,
            r"two kbfuse-launch lines for 't'",
        ),
    ],
)
def test_bad_launch_lines_are_named(text, message):
    with pytest.raises(KbfuseError, match=message):
        parse_launch(text, "k.cu")


def test_grid_sizes():
    per_element = Launch("per-element", 256)
    assert grid_blocks(per_element, 1, 132) == 1
    assert grid_blocks(per_element, 257, 132) == 2
    assert grid_blocks(per_element, 2048 * 8192, 132) == 65536  # task 53 at the pinned shape
    stride = Launch("grid-stride", 256, 16, 8)
    assert grid_blocks(stride, 1024 * 8192, 132) == 132 * 16  # a full device
    assert grid_blocks(stride, 2048 * 8192, 132) == 132 * 16
    assert grid_blocks(stride, 10_000, 132) == 5  # ceil(10000 / 2048): no idle blocks
    assert grid_blocks(Launch("grid-stride", 256, 64, 8), 2048 * 8192, 132) == 8192
    with pytest.raises(KbfuseError, match="element count 0 must be positive"):
        grid_blocks(per_element, 0, 132)
    with pytest.raises(KbfuseError, match="SM count 0"):
        grid_blocks(stride, 10, 0)


def test_the_study_kernels_declare_their_launches():
    naive = kernelsrc.load(KERNELS / "naive.cu")
    assert naive.launch == LaunchPlan(Launch("per-element", 256), {})
    assert list(naive.files) == ["naive.cu", "eager_ops.cuh"]
    fast = kernelsrc.load(KERNELS / "fast.cu")
    assert fast.launch.default == Launch("grid-stride", 256, 16, 8)
    assert fast.launch.for_kernel("tail53") == Launch("grid-stride", 256, 64, 8)
    assert fast.launch.for_kernel("tail81") == Launch("grid-stride", 256, 8, 8)
    # __launch_bounds__ in fast.cu must allow the declared block size
    assert "__launch_bounds__(256)" in fast.text
    # both implementations compute through the same per-task element functions
    for unit in (naive, fast):
        for element in ("tail53_element(", "tail81_element(", "tail95_element("):
            assert unit.text.count(element) >= 2, (unit.path, element)
    assert naive.files["eager_ops.cuh"] == fast.files["eager_ops.cuh"]


def test_compiler_messages_name_the_file_and_line_of_the_error(tmp_path):
    from kbfuse.compilation import nvrtc

    write(tmp_path / "ops.cuh", "#pragma once\n\n__device__ float f(float x) { return y; }\n")
    source = PER_ELEMENT + '#include "ops.cuh"\n\n__global__ void g() { z; }\n'
    cu = write(tmp_path / "k.cu", source)
    with pytest.raises(KbfuseError, match='identifier "y" is undefined') as info:
        nvrtc.compile_program(kernelsrc.load(cu).text, ["--std=c++11"], "k.cu")
    log = str(info.value)
    assert 'ops.cuh(3): error: identifier "y" is undefined' in log
    assert 'k.cu(4): error: identifier "z" is undefined' in log
