"""Loading artifacts and launching the naive and fast tails.

The CPU tests check what happens before CUDA is touched (grid sizes, artifact hashes). The
GPU tests compile kernels/naive.cu and kernels/fast.cu with kbfuse.compilation.compile in a child
process
with an isolated CUDA compute cache (the cache's key ignores --ftz, so the compiles must not
see an earlier one), then check the kernels bit for bit against the pinned models' eager
tails, on sampled inputs, on the fast kernels' fallback paths, and on every float32 input.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import compile_in_child

from kbfuse.checks.exhaustive import exhaustive_control
from kbfuse.checks.numerics import f32_bits_hex
from kbfuse.compilation.kernelsrc import Launch
from kbfuse.compilation.launch import (
    MAX_GRID_X,
    FusedProgram,
    LoadedModule,
    grid_for,
    run_tail,
    run_witness,
)
from kbfuse.errors import KbfuseError
from kbfuse.io import read_json, sha256_file, write_json
from kbfuse.tasks.kernelbench import build_model, load_task, pin_kernelbench
from kbfuse.tasks.tails import TAILS

ROOT = Path(__file__).resolve().parents[1]
KERNELS = ROOT / "kernels"
TASKS = (53, 81, 95)
BASE_OPTIONS = ["--std=c++11", "--fmad=false"]


def compile_artifact(
    root: Path, name: str, route: str, options, arch: str = "auto", kernel: str = "naive"
):
    """(artifact, meta) of kernels/<kernel>.cu compiled by kbfuse.compilation.compile in an
    isolated child."""
    spec = {"route": route, "kernel": kernel, "options": list(options)}
    artifact, meta = compile_in_child(root / name, KERNELS / f"{kernel}.cu", name, spec, arch)
    return artifact, read_json(meta)


def pin_tasks(kb_repo, root: Path, tasks=TASKS):
    """(checkout, pin record, pin path) of the test KernelBench repo."""
    url, commit = kb_repo
    checkout, pin_path = root / "checkout", root / "pin.json"
    pin = pin_kernelbench(url, commit, 2, list(tasks), checkout, pin_path)
    return checkout, pin, pin_path


def host_witness_product() -> np.float32:
    return np.float32(1e-10) * np.float32(1e-30)


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int32)


# --------------------------------------------------------------------------- CPU


def test_grid_covers_every_element_with_256_threads():
    one_per_thread = Launch("per-element", 256)
    assert grid_for(1, one_per_thread, 132) == 1
    assert grid_for(256, one_per_thread, 132) == 1
    assert grid_for(257, one_per_thread, 132) == 2
    assert grid_for(2048 * 8192, one_per_thread, 132) == 65536  # task 53 at the pinned shape
    assert grid_for(256 * MAX_GRID_X, one_per_thread, 132) == MAX_GRID_X
    with pytest.raises(KbfuseError, match="over the grid limit"):
        grid_for(256 * MAX_GRID_X + 1, one_per_thread, 132)
    with pytest.raises(KbfuseError, match="element count 0 must be positive"):
        grid_for(0, one_per_thread, 132)
    # a grid-stride kernel never needs more than blocks-per-sm blocks on every SM
    assert grid_for(2**40, Launch("grid-stride", 256, 16, 8), 132) == 132 * 16


def test_load_needs_the_launch_plan_of_the_compile_record(tmp_path):
    artifact = tmp_path / "tails.bin"
    artifact.write_bytes(b"artifact")
    meta = {"variant": "v", "artifact_sha256": sha256_file(artifact)}
    with pytest.raises(KbfuseError, match="has no valid launch record .*recompile"):
        LoadedModule.load(artifact, meta)
    with pytest.raises(KbfuseError, match="has no valid launch record"):
        LoadedModule.load(artifact, {**meta, "launch": {"mode": "per-element", "threads": 256}})


def test_load_rejects_an_artifact_that_does_not_match_its_metadata(tmp_path):
    artifact = tmp_path / "tails.bin"
    artifact.write_bytes(b"not the compiled artifact")
    meta = {"kind": "compile", "variant": "v", "artifact_sha256": "0" * 64}
    with pytest.raises(KbfuseError, match=f"has sha256 {sha256_file(artifact)}.*says .*{'0' * 64}"):
        LoadedModule.load(artifact, meta)
    with pytest.raises(KbfuseError, match="has no artifact_sha256"):
        LoadedModule.load(artifact, {"variant": "v"})
    with pytest.raises(KbfuseError, match="does not exist"):
        LoadedModule.load(tmp_path / "missing.bin", meta)
    meta_path = tmp_path / "meta.json"
    write_json(meta_path, meta)
    with pytest.raises(KbfuseError, match="has sha256"):
        LoadedModule.load(artifact, meta_path)  # a path to the metadata works the same way


def test_host_witness_product_is_a_float32_subnormal():
    product = host_witness_product()
    assert 0 < product < np.finfo(np.float32).tiny
    assert f32_bits_hex(float(product)) == "0x000116c2"


# --------------------------------------------------------------------------- GPU


@pytest.fixture(scope="module")
def gpu_env(kb_repo, tmp_path_factory):
    root = tmp_path_factory.mktemp("gpu-launch")
    checkout, pin, _ = pin_tasks(kb_repo, root)
    specs = {task: load_task(checkout, pin, task) for task in TASKS}
    compiled = {
        name: compile_artifact(root, name, route, [*BASE_OPTIONS, ftz])
        for name, route, ftz in (
            ("cubin-noftz", "nvrtc-cubin", "--ftz=false"),
            ("cubin-ftz", "nvrtc-cubin", "--ftz=true"),
            ("ptx-noftz", "nvrtc-ptx", "--ftz=false"),
        )
    }
    compiled["fast-noftz"] = compile_artifact(
        root, "fast-noftz", "nvrtc-cubin", [*BASE_OPTIONS, "--ftz=false"], kernel="fast"
    )
    modules = {name: LoadedModule.load(*pair) for name, pair in compiled.items()}
    return specs, modules


def random_linear_outputs(cols: int, seed: int) -> torch.Tensor:
    """Rows of several scales: near zero, the clamp and GELU ranges, far tails, tiny values."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    parts = [torch.randn(2048, cols, generator=g) * s for s in (1e-3, 1.0, 3.0, 10.0, 100.0)]
    parts.append(torch.empty(2048, cols).uniform_(-110.0, -60.0, generator=g))
    parts.append(torch.empty(2048, cols).uniform_(-1e-37, 1e-37, generator=g))
    return torch.cat(parts).to("cuda")


SPECIAL_VALUES = [
    0.0, -0.0, 1.0, -1.0, 2.0, -2.0, 4.0, -4.0, 88.0, -88.0, -87.5, -103.0, -104.0,
    1e-45, -1e-45, 1e-40, -1e-40, 1.1754944e-38, -1.1754944e-38, 3.4028235e38, -3.4028235e38,
    math.inf, -math.inf, math.nan,
]  # fmt: skip


def special_linear_outputs(cols: int) -> torch.Tensor:
    values = torch.tensor(SPECIAL_VALUES, dtype=torch.float32)
    reps = math.ceil(cols / len(values)) + 1
    rows = [torch.roll(values.repeat(reps)[:cols], shifts=k) for k in range(len(values))]
    return torch.stack(rows).to("cuda")


@pytest.mark.gpu
def test_launch_validation_errors(gpu_env):
    specs, modules = gpu_env
    mod = modules["cubin-noftz"]
    m81 = build_model(specs[81], seed=0, device="cuda")
    y = torch.zeros(8, 64, device="cuda")
    with pytest.raises(KbfuseError, match="y \\(linear output\\) must be on a CUDA device"):
        run_tail(mod, TAILS[81], m81, y.cpu())
    with pytest.raises(KbfuseError, match="must be contiguous"):
        run_tail(mod, TAILS[81], m81, torch.zeros(64, 8, device="cuda").t())
    with pytest.raises(KbfuseError, match="must be float32, got torch.float64"):
        run_tail(mod, TAILS[81], m81, y.double())
    with pytest.raises(KbfuseError, match="must be 2-D"):
        run_tail(mod, TAILS[81], m81, y.reshape(-1))
    with pytest.raises(KbfuseError, match="out has shape"):
        run_tail(mod, TAILS[81], m81, y, out=torch.zeros(8, 32, device="cuda"))
    with pytest.raises(KbfuseError, match="out must be on a CUDA device"):
        run_tail(mod, TAILS[81], m81, y, out=torch.zeros(8, 64))
    m95 = build_model(specs[95], seed=0, device="cpu")
    with pytest.raises(KbfuseError, match="model.add_value must be on a CUDA device, got cpu"):
        run_tail(mod, TAILS[95], m95, y)
    with pytest.raises(KbfuseError, match="one value per column"):
        run_tail(mod, TAILS[95], m95.cuda(), torch.zeros(8, 48, device="cuda"))
    with pytest.raises(KbfuseError, match="witness x must be a contiguous float32 CUDA tensor"):
        run_witness(mod, torch.ones(4), 1e-30)
    # A kernel the artifact lacks is named with the artifact (seen on the H200, session 11).
    with pytest.raises(KbfuseError, match="kernel 'tail54' cannot be loaded: CUDA_ERROR_NOT_FOUND"):
        mod.function("tail54")


@pytest.mark.gpu
@pytest.mark.parametrize("variant", ["cubin-noftz", "ptx-noftz", "fast-noftz"])
@pytest.mark.parametrize("task", TASKS)
def test_tail_is_bit_identical_to_eager_without_ftz(gpu_env, task, variant):
    specs, modules = gpu_env
    tail = TAILS[task]
    for seed in (0, 1):
        model = build_model(specs[task], seed=seed, device="cuda")
        cols = tail.library(model).out_features
        y = random_linear_outputs(cols, seed)
        reference = tail.reference(model, y)
        out = torch.full_like(y, math.nan)
        assert run_tail(modules[variant], tail, model, y, out) is out
        torch.cuda.synchronize()
        mismatches = int((bits(out) != bits(reference)).sum())
        assert mismatches == 0, f"task {task} {variant} seed {seed}: {mismatches} of {y.numel()}"


@pytest.mark.gpu
@pytest.mark.parametrize("variant", ["cubin-noftz", "fast-noftz"])
@pytest.mark.parametrize("task", TASKS)
def test_special_values_match_eager(gpu_env, task, variant):
    specs, modules = gpu_env
    tail = TAILS[task]
    model = build_model(specs[task], seed=0, device="cuda")
    y = special_linear_outputs(tail.library(model).out_features)
    reference = tail.reference(model, y)
    out = run_tail(modules[variant], tail, model, y)
    torch.cuda.synchronize()
    assert torch.equal(torch.isnan(out), torch.isnan(reference))
    finite = ~torch.isnan(reference)
    assert torch.equal(bits(out)[finite], bits(reference)[finite])


@pytest.mark.gpu
@pytest.mark.parametrize("task", TASKS)
def test_fused_program_equals_the_model(gpu_env, task):
    specs, modules = gpu_env
    model = build_model(specs[task], seed=2, device="cuda")
    torch.manual_seed(5)
    (x,) = specs[task].module.get_inputs()
    x = (x * 20 - 10).to("cuda")
    with torch.no_grad():
        expected = model(x)
    got = FusedProgram(modules["cubin-noftz"], TAILS[task], model)(x)
    torch.cuda.synchronize()
    assert torch.equal(bits(got), bits(expected))


@pytest.mark.gpu
def test_witness_keeps_or_flushes_the_subnormal(gpu_env):
    _, modules = gpu_env
    x = torch.full((1000,), 1e-10, dtype=torch.float32, device="cuda")
    product = host_witness_product()
    kept = run_witness(modules["cubin-noftz"], x, 1e-30)
    flushed = run_witness(modules["cubin-ftz"], x, 1e-30)
    via_ptx = run_witness(modules["ptx-noftz"], x, 1e-30)
    torch.cuda.synchronize()
    assert (bits(kept) == int(product.view(np.int32))).all()
    assert (bits(via_ptx) == int(product.view(np.int32))).all()
    assert (flushed == 0).all()


@pytest.mark.gpu
def test_task81_at_minus_88(gpu_env):
    specs, modules = gpu_env
    model = build_model(specs[81], seed=0, device="cuda")
    y = torch.tensor([[-88.0, -87.5]], device="cuda")
    reference = TAILS[81].reference(model, y)
    kept = run_tail(modules["cubin-noftz"], TAILS[81], model, y)
    flushed = run_tail(modules["cubin-ftz"], TAILS[81], model, y)
    torch.cuda.synchronize()
    assert reference[0, 0].item() == -2.6640246534862188e-37
    assert f32_bits_hex(kept[0, 0]) == f32_bits_hex(reference[0, 0])
    assert f32_bits_hex(kept[0, 1]) == f32_bits_hex(reference[0, 1])
    assert f32_bits_hex(flushed[0, 0]) == "0x80000000"  # -0.0
    assert torch.equal(bits(kept), bits(reference))


@pytest.mark.gpu
@pytest.mark.parametrize("variant", ["cubin-noftz", "fast-noftz"])
@pytest.mark.parametrize("task", TASKS)
def test_run_tail_replays_in_a_cuda_graph(gpu_env, task, variant):
    specs, modules = gpu_env
    mod, tail = modules[variant], TAILS[task]
    model = build_model(specs[task], seed=0, device="cuda")
    cols = tail.library(model).out_features
    y = random_linear_outputs(cols, seed=3)
    out = torch.empty_like(y)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            run_tail(mod, tail, model, y, out)
    torch.cuda.current_stream().wait_stream(side)

    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run_tail(mod, tail, model, y, out)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(bits(out), bits(tail.reference(model, y)))

    y.copy_(random_linear_outputs(cols, seed=4))  # same storage, new values
    before = out.clone()
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(bits(out), bits(tail.reference(model, y)))
    assert not torch.equal(bits(out), bits(before))


def misaligned(shape, device="cuda") -> torch.Tensor:
    """A contiguous float32 tensor whose data pointer is 4 bytes past a 16-byte boundary."""
    storage = torch.empty(math.prod(shape) + 1, device=device)
    view = storage[1:].view(shape)
    assert view.data_ptr() % 16 == 4
    return view


@pytest.mark.gpu
@pytest.mark.parametrize("task", TASKS)
def test_fast_fallback_paths_are_bit_identical(gpu_env, task):
    """Misaligned input or output, and (tasks 53, 81) a count that is not a multiple of 4, take
    the fast kernels' one-element-per-step paths; the bits must not change."""
    specs, modules = gpu_env
    tail, fast = TAILS[task], modules["fast-noftz"]
    model = build_model(specs[task], seed=1, device="cuda")
    cols = tail.library(model).out_features
    y = random_linear_outputs(cols, seed=7)[:1000]
    reference = tail.reference(model, y)
    shifted_y = misaligned(tuple(y.shape))
    shifted_y.copy_(y)
    for source, out in ((shifted_y, torch.empty_like(y)), (y, misaligned(tuple(y.shape)))):
        run_tail(fast, tail, model, source, out)
        torch.cuda.synchronize()
        assert torch.equal(bits(out), bits(reference))
    if task != 95:  # task 95's column count is the model's; here rows * cols is odd
        odd = y.reshape(-1)[: 7 * 13].reshape(7, 13)
        got = run_tail(fast, tail, model, odd)
        torch.cuda.synchronize()
        assert torch.equal(bits(got), bits(tail.reference(model, odd)))


@pytest.mark.gpu
@pytest.mark.parametrize("task", TASKS)
def test_exhaustive_control_on_every_float32_input(gpu_env, task):
    """All 2^32 inputs: FTZ-off naive and fast are bit-identical to eager; FTZ-on is not."""
    specs, modules = gpu_env
    model = build_model(specs[task], seed=0, device="cuda")
    chosen = {name: modules[name] for name in ("cubin-noftz", "fast-noftz", "cubin-ftz")}
    said = []
    result = exhaustive_control(model, TAILS[task], chosen, said.append)
    for name in ("cubin-noftz", "fast-noftz"):
        assert result[name]["inputs"] == 2**32
        assert result[name]["differ"] == 0 and result[name]["nan_payload_only"] == 0
        assert result[name]["unwritten"] == 0
        assert result[name]["bit_identical"] and result[name]["examples"] == []
    flushed = result["cubin-ftz"]
    assert flushed["differ"] > 0 and not flushed["bit_identical"]
    assert len(flushed["examples"]) == 4
    assert len(said) == 3
