"""The second study's kernel sources compiled on the CPU: NVRTC for sm_90, no GPU needed.

kernels/fused2_naive.cu and kernels/fused2_fast.cu through the compile stage, with FTZ off and
on, as cubin and PTX: the compile records (launch plans, every source file hashed, FTZ counts
in PTX and SASS), every kernel the second study launches in the artifact, and what the fast
kernels are made of (16-byte accesses for task 4, 16- and 8-byte loads and float64 sums for
task 65). That their bits equal eager's is the GPU tests' job (tests/test_gpu_fused2.py) and
the workflow's (correctness, the contract, the exhaustive control).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from test_fast_kernels import functions, loops

from kbfuse.compilation import disasm, kernelsrc
from kbfuse.compilation.compile import compile_variant
from kbfuse.results.records import schema_text, validate_record
from kbfuse.tasks.registry import FUSED2_TASKS, kernel_names

ROOT = Path(__file__).resolve().parents[1]
BASE = ["--std=c++11", "--fmad=false"]
SOURCES = ("fused2_naive", "fused2_fast")
# NVIDIA's expf and tanhf use these approximations with .ftz on purpose, whatever --ftz says
# (the first study's kernels show the same two): everything else keeps subnormals.
INTERNAL_FTZ = {"ex2.approx.ftz.f32", "rcp.approx.ftz.f32"}

pytestmark = pytest.mark.usefixtures("isolated_process")  # tests/conftest.py


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    """(kernel, route, ftz) -> (meta, SASS listing or None) for both sources, sm_90."""
    out = tmp_path_factory.mktemp("fused2-compiled")
    result = {}
    for kernel in SOURCES:
        for route in ("nvrtc-cubin", "nvrtc-ptx"):
            for ftz in (False, True):
                name = f"{kernel.replace('_', '-')}-{route}-{'ftz' if ftz else 'noftz'}"
                paths = {
                    "artifact": out / name / "tails.bin",
                    "meta": out / name / "meta.json",
                    "log": out / name / "compile.log",
                }
                options = [*BASE, f"--ftz={'true' if ftz else 'false'}"]
                meta = compile_variant(
                    ROOT / "kernels" / f"{kernel}.cu",
                    name,
                    {"route": route, "kernel": kernel, "options": options},
                    "sm_90",
                    scratch_dir=out / "scratch",
                    **paths,
                )
                listing = None
                if route == "nvrtc-cubin":
                    listing = disasm.sass_text(paths["artifact"].read_bytes())
                    assert listing, "expected a disassembler from the pip wheels"
                result[(kernel, route, ftz)] = ({**meta, "_artifact": paths["artifact"]}, listing)
    return result


def test_compile_records_the_launch_plans_and_every_header(compiled):
    for kernel in SOURCES:
        meta, _ = compiled[(kernel, "nvrtc-cubin", False)]
        unit = kernelsrc.load(ROOT / "kernels" / f"{kernel}.cu")
        assert meta["launch"] == unit.launch.record()
        assert meta["source_sha256"] == unit.sha256
        assert list(meta["source_files"]) == [
            f"{kernel}.cu",
            "eager_ops_conv.cuh",
            "eager_ops.cuh",
            "reduce_ops.cuh",
        ]
    naive = compiled[("fused2_naive", "nvrtc-cubin", False)][0]["launch"]
    fast = compiled[("fused2_fast", "nvrtc-cubin", False)][0]["launch"]
    assert naive["default"]["mode"] == "per-element"
    assert naive["per_kernel"] == {
        "tail65": {
            "mode": "per-block",
            "threads": 256,
            "blocks_per_sm": None,
            "items_per_thread": None,
        }
    }
    assert fast["default"] == {
        "mode": "grid-stride",
        "threads": 256,
        "blocks_per_sm": 8,
        "items_per_thread": 8,
    }
    assert fast["per_kernel"]["tail65"]["mode"] == "per-block"
    assert fast["per_kernel"]["stage65"]["mode"] == "per-element"


def test_every_compile_record_follows_its_schema(compiled):
    # The summary validates every record it reads: on the H200 (session 11) it refused the
    # second study's compile records when the schema did not know the per-block launch.
    for meta, _ in compiled.values():
        record = {k: v for k, v in meta.items() if not k.startswith("_")}
        validate_record(record, "compile", "compile record")
    launch = json.loads(schema_text("compile.schema.json"))["$defs"]["launch"]
    enum = launch["properties"]["mode"]["enum"]
    assert sorted(enum) == sorted(kernelsrc.LAUNCH_MODES)


def test_every_kernel_of_the_second_study_is_in_every_artifact(compiled):
    needed = set(kernel_names(FUSED2_TASKS))
    assert needed == {"tail4", "tail65", "stage65", "witness_mul"}
    for (kernel, _route, ftz), (meta, listing) in compiled.items():
        if listing is not None:
            assert needed <= set(functions(listing)), (kernel, ftz)
        else:  # the PTX the driver compiles at load
            ptx = Path(meta["_artifact"]).read_text()
            assert needed <= set(re.findall(r"\.entry\s+(\w+)", ptx)), (kernel, ftz)


def test_ftz_off_keeps_subnormals_but_in_nvidias_own_approximations(compiled):
    for kernel in SOURCES:
        for route in ("nvrtc-cubin", "nvrtc-ptx"):
            off = compiled[(kernel, route, False)][0]
            on = compiled[(kernel, route, True)][0]
            assert (off["requested_ftz"], off["expected_ftz"]) == (False, False)
            assert (on["requested_ftz"], on["expected_ftz"]) == (True, True)
            assert set(off["ptx_ftz_opcodes"]) == INTERNAL_FTZ, (kernel, route)
            assert off["ptx_ftz_count"] == sum(off["ptx_ftz_opcodes"].values())
            # with FTZ every float32 operation flushes: adds, multiplies, divisions, the
            # float64 sum's float -> double conversion
            assert on["ptx_ftz_count"] > 10 * off["ptx_ftz_count"], (kernel, route)
            for opcode in ("add.rn.ftz.f32", "mul.rn.ftz.f32", "div.rn.ftz.f32"):
                assert on["ptx_ftz_opcodes"].get(opcode, 0) > 0, (kernel, route, opcode)
            assert on["ptx_ftz_opcodes"].get("cvt.ftz.f64.f32", 0) > 0, (kernel, route)
        cubin_off = compiled[(kernel, "nvrtc-cubin", False)][0]
        cubin_on = compiled[(kernel, "nvrtc-cubin", True)][0]
        assert cubin_on["sass_ftz_count"] > cubin_off["sass_ftz_count"], kernel


def _accesses(instructions: list[str], kind: str) -> set[str]:
    """The widths of the global loads (kind LDG) or stores (STG) of one kernel, predicated
    ones (`@P0 LDG...`) included."""
    widths = set()
    for text in instructions:
        match = re.match(rf"(?:@!?U?P\w+\s+)?{kind}\S*?(?:\.(64|128))?\s", text + " ")
        if match:
            widths.add(match.group(1) or "32")
    return widths


def test_the_fast_kernels_access_memory_as_the_h200_wants(compiled):
    fast = functions(compiled[("fused2_fast", "nvrtc-cubin", False)][1])
    naive = functions(compiled[("fused2_naive", "nvrtc-cubin", False)][1])
    # task 4: float4 loads and stores in the vector loop, scalar ones in the naive kernel
    assert "128" in _accesses(fast["tail4"], "LDG") and "128" in _accesses(fast["tail4"], "STG")
    assert _accesses(naive["tail4"], "LDG") == {"32"} and _accesses(naive["tail4"], "STG") == {"32"}
    vector_loops = [b for b in loops(fast["tail4"]) if any(".128" in i for i in b if "LDG" in i)]
    assert vector_loops
    for body in vector_loops:  # no 64-bit division per float4 (the channel: 32-bit indices)
        assert not [i for i in body if i.startswith("CALL") and ("_s64" in i or "_u64" in i)]
    # task 65: window rows as float4 where aligned, else two float2; no store but the partials
    assert {"128", "64"} <= _accesses(fast["tail65"], "LDG")
    assert "128" not in _accesses(naive["tail65"], "LDG")
    for source in (fast, naive):
        instructions = source["tail65"]
        opcodes = {re.sub(r"^@!?U?P\w+\s+", "", i).split()[0] for i in instructions if i.strip()}
        assert "DADD" in opcodes  # the float64 sums
        assert any(re.match(r"(ATOMG|RED)", op) for op in opcodes)  # finished blocks counted
        assert any(op.startswith("SHFL.DOWN") for op in opcodes)  # the fixed-offset tree
