"""The second study's kernels on the GPU: bit identity, the exhaustive control, the contract.

Marked `gpu`: run on the GPU machine in the study's virtualenv,
`python -m pytest -m gpu tests/test_gpu_fused2.py`. The kernels of kernels/fused2_naive.cu and
kernels/fused2_fast.cu are compiled as nvrtc-cubin (FTZ off and on) in child processes with a
private CUDA compute cache (tests/conftest.py `compile_in_child`); the models are the fixture's
tasks 4 and 65 (tests/kbrepo.py) built on the GPU, at the fixture's small shapes and at shapes
whose convolution output has the pinned tasks' row width (254 and 382 floats: every other row
of task 65's planes only 8-byte aligned, the fast kernel's float2 path).

What each test shows:
- the split is exact on CUDA: cuDNN's convolution without its bias, then the tail module
  (bias add and the rest) gives the model's own output bit for bit, in both numerics modes;
- task 4's kernels (naive and fast, FTZ off) are bit-identical to eager on the library output
  and every tail control, and on all 2^32 float32 inputs (the exhaustive control); with FTZ on
  they differ where subnormals appear and still pass the official check;
- task 65's stage kernels are bit-identical to eager's element-wise stage; its tail kernels
  give the same bits run after run and naive and fast alike, and are no worse than eager
  against the float64 reduction of eager's own stage (the contract's deciding reference),
  measured against the tail and the task in float64 as well;
- the correctness stage (run_correctness_variants) records the contract as held for the
  FTZ-off variants and as failed for task 4's FTZ-on one.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch
from conftest import compile_in_child
from kbrepo import FUSED2_TASKS, make_kernelbench_repo
from test_gpu_launch import KERNELS

from kbfuse.checks import contract
from kbfuse.checks.correctness import run_correctness_variants
from kbfuse.checks.exhaustive import exhaustive_control
from kbfuse.checks.tail_controls import control_inputs
from kbfuse.io import read_json
from kbfuse.tasks import baselines
from kbfuse.tasks.kernelbench import build_model, load_task, pin_kernelbench
from kbfuse.tasks.tails import tail_for

pytestmark = pytest.mark.gpu

BASE = ["--std=c++11", "--fmad=false"]
VARIANTS = {
    "naive-noftz": ("fused2_naive", [*BASE, "--ftz=false"]),
    "fast-noftz": ("fused2_fast", [*BASE, "--ftz=false"]),
    "naive-ftz": ("fused2_naive", [*BASE, "--ftz=true"]),
}
KEEPING = ("naive-noftz", "fast-noftz")
MODES = ("strict", "kernelbench-defaults")
# (batch, in_channels, height, width) of inputs: the fixture's own and ones whose convolution
# output rows are as wide as the pinned tasks' (task 4: 254, task 65: 382 floats)
SHAPES = {4: [(2, 3, 18, 18), (2, 3, 256, 256)], 65: [(2, 3, 22, 22), (2, 3, 384, 384)]}


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int32)


@pytest.fixture(scope="module")
def pinned(tmp_path_factory):
    root = tmp_path_factory.mktemp("gpu-fused2-pin")
    url, commit = make_kernelbench_repo(root / "kb", tasks=FUSED2_TASKS)
    pin = pin_kernelbench(url, commit, 2, list(FUSED2_TASKS), root / "checkout", root / "pin.json")
    return root / "checkout", pin, root / "pin.json"


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
    root = tmp_path_factory.mktemp("gpu-fused2-compile")
    out = {}
    for name, (kernel, options) in VARIANTS.items():
        spec = {"route": "nvrtc-cubin", "kernel": kernel, "options": options}
        out[name] = compile_in_child(root / name, KERNELS / f"{kernel}.cu", name, spec)
    return out


@pytest.fixture(scope="module")
def modules(artifacts):
    from kbfuse.compilation.launch import LoadedModule

    kernels = ("tail4", "tail65", "stage65")
    return {
        name: LoadedModule.load(artifact, read_json(meta), kernels)
        for name, (artifact, meta) in artifacts.items()
    }


def cuda_model(pinned, task, seed=42):
    checkout, pin, _ = pinned
    return build_model(load_task(checkout, pin, task), seed=seed, device="cuda")


def inputs(task):
    generator = torch.Generator().manual_seed(task)
    for shape in SHAPES[task]:
        yield torch.rand(shape, generator=generator).cuda() * 10 - 5


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("task", FUSED2_TASKS)
def test_the_split_after_the_convolution_is_exact_on_cuda(pinned, task, mode):
    baselines.set_numerics(mode)
    try:
        model = cuda_model(pinned, task)
        tail = tail_for(task)
        for x in inputs(task):
            with torch.no_grad():
                whole = model(x)
            split = tail.reference(model, tail.library_output(model, x))
            assert torch.equal(bits(split), bits(whole)), (task, mode, tuple(x.shape))
    finally:
        baselines.set_numerics()


def controls_of(model, tail):
    cols = tail.control_columns(model)
    found = {
        name: tail.control_input(model, values).cuda()
        for name, values in control_inputs(tail, model, cols).items()
    }
    offset = tail.column_offset(model)
    found["tail/bounds_minus_add"] = (found["tail/bounds"] - offset.detach()).contiguous()
    return found


def test_task_4_kernels_are_bit_identical_to_eager_without_ftz(pinned, modules):
    from kbfuse.compilation.launch import run_tail

    model = cuda_model(pinned, 4)
    tail = tail_for(4)
    cases = {f"library/{tuple(x.shape)}": tail.library_output(model, x) for x in inputs(4)}
    cases.update(controls_of(model, tail))
    flushed = []
    for name, y in cases.items():
        reference = tail.reference(model, y)
        for variant in KEEPING:
            out = run_tail(modules[variant], tail, model, y, torch.full_like(y, math.nan))
            assert torch.equal(bits(out), bits(reference)), (variant, name)
        ftz = run_tail(modules["naive-ftz"], tail, model, y, torch.full_like(y, math.nan))
        if not torch.equal(bits(ftz), bits(reference)):
            flushed.append(name)
        finite = torch.isfinite(reference)
        assert torch.allclose(reference[finite], ftz[finite], atol=1e-4, rtol=1e-4), name
    # near expf's subnormal thresholds mish is subnormal, and FTZ flushes it (the bias lifts
    # the tiny controls' values to normal ones, as task 95's add does in the first study)
    assert {"tail/bounds", "tail/large", "tail/bounds_minus_add"} <= set(flushed)


def test_task_4_exhaustive_control_on_all_float32_inputs(pinned, modules):
    model = cuda_model(pinned, 4)
    result = exhaustive_control(
        model, tail_for(4), {v: modules[v] for v in (*KEEPING, "naive-ftz")}, print
    )
    for variant in KEEPING:
        assert result[variant]["inputs"] == 2**32
        assert result[variant]["differ"] == 0 and result[variant]["unwritten"] == 0, variant
        assert result[variant]["nan_payload_only"] == 0 and result[variant]["bit_identical"]
    assert result["naive-ftz"]["differ"] > 0 and not result["naive-ftz"]["bit_identical"]


def test_task_65_stage_kernels_are_bit_identical_to_eagers_stage(pinned, modules):
    from kbfuse.compilation.launch import run_stage

    model = cuda_model(pinned, 65)
    tail = tail_for(65)
    cases = {f"library/{tuple(x.shape)}": tail.library_output(model, x) for x in inputs(65)}
    cases.update(controls_of(model, tail))
    for name, y in cases.items():
        eager = tail.stage_reference(model, y)
        for variant in KEEPING:
            stage = run_stage(modules[variant], tail, model, y)
            assert torch.equal(bits(stage), bits(eager)), (variant, name)


def test_task_65_sums_are_deterministic_and_no_worse_than_eagers(pinned, modules):
    from kbfuse.compilation.launch import run_tail

    model = cuda_model(pinned, 65)
    model64 = copy.deepcopy(model).double()
    tail = tail_for(65)
    for x in inputs(65):
        y = tail.library_output(model, x)
        with torch.no_grad():
            eager = model(x)
            tail64 = tail.reference(model64, y.double())
            task64 = model64(x.double())
        reduction = tail.reduction(model, y)
        reduction64 = reduction.again(reduction.stage.double())
        outs = {v: run_tail(modules[v], tail, model, y) for v in KEEPING}
        again = run_tail(modules["fast-noftz"], tail, model, y)
        assert torch.equal(bits(again), bits(outs["fast-noftz"]))  # the same bits every run
        # naive and fast add the same values in the same order
        assert torch.equal(bits(outs["naive-noftz"]), bits(outs["fast-noftz"]))
        out = outs["fast-noftz"]
        assert torch.allclose(eager, out, atol=1e-4, rtol=1e-4)
        deciding = contract.float64_comparison(reduction64, eager, out, "float64_reduction")
        assert deciding["no_worse"], deciding
        # correctly rounded: within half a float32 step of the float64 sum
        step = (torch.nextafter(out, torch.full_like(out, math.inf)) - out).double()
        assert bool(((out.double() - reduction64).abs() <= step / 2).all())
        for name, reference in (("float64_tail", tail64), ("float64_task", task64)):
            measured = contract.float64_comparison(reference, eager, out, name)
            print(tuple(x.shape), measured)


def test_the_correctness_stage_records_the_contract(pinned, artifacts, tmp_path):
    checkout, _, pin_path = pinned
    request = {
        "seeds": [0],
        "distributions": ["uniform", "uniform_xneg100"],
        "tolerance": {"atol": 1e-4, "rtol": 1e-4},
        "input_seed": 42,
        "numerics": "kernelbench-defaults",
    }
    try:
        for task in FUSED2_TASKS:
            outs = {name: tmp_path / f"{task}-{name}.json" for name in artifacts}
            records = run_correctness_variants(
                task, artifacts, outs, checkout, pin_path, request, tmp_path / f"{task}.log"
            )
            for name, record in records.items():
                assert record["passed"], (task, name, record["failing_checks"])
                assert record["numerics"]["mode"] == "kernelbench-defaults"
                # FTZ flushes the subnormal mish values (task 4) and sigmoids (task 65's stage)
                assert record["contract"]["passed"] == (name in KEEPING), (task, name)
            if task == 65:
                cases = records["fast-noftz"]["contract"]["cases"]
                assert all(c["stage"]["bit_identical"] for c in cases)
                assert all(c["float64_reduction"]["no_worse"] for c in cases)
    finally:
        baselines.set_numerics()


def test_verify_measures_the_ftz_of_second_study_artifacts(artifacts, tmp_path):
    """The witness alone: a second-study source has no task-81 tail to load."""
    from kbfuse.checks.verify import verify_variants

    outs = {name: tmp_path / f"{name}.json" for name in artifacts}
    records = verify_variants(artifacts, tmp_path, None, outs, tmp_path / "verify.log")
    for name, record in records.items():
        assert record["effective_ftz"] is name.endswith("-ftz"), name
        assert not record["mismatch"] and record["task81"] == []
