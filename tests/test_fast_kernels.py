"""kernels/fast.cu compiled on the CPU: its launch record and what its SASS is made of.

The fast tails are meant to differ from the naive ones only in how elements reach the shared
element functions: 16-byte loads and stores, and no 64-bit division or remainder in the
vectorised loop (task 95's column index). Both are checked here on the cubin NVRTC builds for
sm_90 (pip wheels; no GPU needed). That the bits equal eager's is the GPU tests' job
(tests/test_gpu_fast.py) and the workflow's (correctness and the exhaustive control).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from kbfuse.compilation import disasm, kernelsrc
from kbfuse.compilation.compile import compile_variant

ROOT = Path(__file__).resolve().parents[1]
OPTIONS = ["--std=c++11", "--fmad=false", "--ftz=false"]
TAILS = ("tail53", "tail81", "tail95")


pytestmark = pytest.mark.usefixtures("isolated_process")  # tests/conftest.py


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    """kernel -> (meta, SASS listing) for naive.cu and fast.cu, nvrtc-cubin, sm_90, FTZ off."""
    out = tmp_path_factory.mktemp("compiled")
    result = {}
    for kernel in ("naive", "fast"):
        paths = {
            "artifact": out / kernel / "tails.bin",
            "meta": out / kernel / "meta.json",
            "log": out / kernel / "compile.log",
        }
        meta = compile_variant(
            ROOT / "kernels" / f"{kernel}.cu",
            f"{kernel}-noftz",
            {"route": "nvrtc-cubin", "kernel": kernel, "options": OPTIONS},
            "sm_90",
            scratch_dir=out / "scratch",
            **paths,
        )
        listing = disasm.sass_text(paths["artifact"].read_bytes())
        assert listing, "expected a disassembler from the pip wheels"
        result[kernel] = (meta, listing)
    return result


def functions(listing: str) -> dict[str, list[str]]:
    """Function name -> its instructions (nvdisasm listing)."""
    found: dict[str, list[str]] = {}
    current = None
    for line in listing.splitlines():
        section = re.search(r"\.section\s+\.text\.([\w$]+)", line)
        if section:
            current = found.setdefault(section.group(1), [])
            continue
        label = re.match(r"\s*\.(L_x_\d+):", line)
        if label and current is not None:
            current.append(f"LABEL {label.group(1)}")
            continue
        instruction = re.search(r"/\*[0-9a-f]{4,}\*/\s+(.*?)\s*;", line)
        if instruction and current is not None:
            current.append(instruction.group(1))
    return found


def loops(instructions: list[str]) -> list[list[str]]:
    """The bodies of the loops: from a label to a branch back to it."""
    labels = {}
    bodies = []
    for index, text in enumerate(instructions):
        if text.startswith("LABEL "):
            labels[text.split()[1]] = index
            continue
        target = re.search(r"BRA\s+`?\(?\.(L_x_\d+)", text)
        if target and labels.get(target.group(1), index + 1) <= index:
            bodies.append(instructions[labels[target.group(1)] : index + 1])
    return bodies


def test_compile_records_launch_plan_and_every_source_file(compiled):
    for kernel in ("naive", "fast"):
        meta, _ = compiled[kernel]
        unit = kernelsrc.load(ROOT / "kernels" / f"{kernel}.cu")
        assert meta["launch"] == unit.launch.record()
        assert meta["source_sha256"] == unit.sha256
        assert list(meta["source_files"]) == [f"{kernel}.cu", "eager_ops.cuh"]
        assert meta["kernel"] == kernel
    assert compiled["fast"][0]["launch"]["per_kernel"]["tail53"]["blocks_per_sm"] == 64


def test_fast_tails_move_16_bytes_per_access_and_naive_ones_4(compiled):
    fast = functions(compiled["fast"][1])
    naive = functions(compiled["naive"][1])
    for name in TAILS:
        fast_loads = [i for i in fast[name] if i.startswith("LDG") and i.split()[0].endswith("128")]
        fast_stores = [i for i in fast[name] if re.match(r"STG\S*\.128\b", i)]
        assert fast_loads and fast_stores, name
        assert not [i for i in naive[name] if re.match(r"(LDG|STG)\S*\.128\b", i)], name


def test_vector_loops_have_no_64_bit_division(compiled):
    fast = functions(compiled["fast"][1])
    naive = functions(compiled["naive"][1])
    for name in TAILS:
        vector_loops = [
            body for body in loops(fast[name]) if any(".128" in i for i in body if "LDG" in i)
        ]
        assert vector_loops, name
        for body in vector_loops:
            calls = [i for i in body if i.startswith("CALL")]
            assert not [c for c in calls if "_s64" in c or "_u64" in c], (name, calls)
    # the study-faithful kernel does pay a 64-bit remainder per element for task 95's column
    assert any("rem_s64" in i for i in naive["tail95"] if i.startswith("CALL"))
