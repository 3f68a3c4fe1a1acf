"""The survey's per-task job on a GPU (run on the GPU machine: pytest -m gpu).

The fixture's tasks (tests/survey_kbrepo.py) are surveyed on "cuda": the three timing methods
(CUDA events, CUDA-graph replay, cold L2), the kernel profile, a forward that cannot be
captured in a CUDA graph (task 9 reads a value back with `.item()`) keeping its event timing,
both numerics modes' TF32 flags from one job, the GPU lock named after the device's UUID, and
the calls per sample sized from the fastest baseline; and a real out-of-memory error beside
another process that holds the device's memory, after which the task runs again alone.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
import time

import pytest
from survey_kbrepo import make_survey_repo

from kbfuse.results import records
from kbfuse.survey.job import run_survey_task
from kbfuse.survey.settings import survey_settings
from kbfuse.tasks.evaluator import write_contract
from kbfuse.tasks.kernelbench import pin_kernelbench, pin_task
from kbfuse.workflow import gpulock

pytestmark = pytest.mark.gpu

ROUNDS = 6
SETTINGS = {"device": "cuda", "rounds": ROUNDS, "warmup": 2, "invocations_per_pair": 3}
METHODS = ["events", "graph", "cold_l2"]


@pytest.fixture(scope="module")
def surveyed(tmp_path_factory):
    root = tmp_path_factory.mktemp("survey-gpu")
    url, commit = make_survey_repo(root / "kb")
    checkout, record = root / "checkout", root / "checkout.json"
    pin_kernelbench(url, commit, 2, [53], checkout, record)
    write_contract(checkout, record, root / "contract.json")
    settings = survey_settings({"survey": SETTINGS})
    out = {}
    for task, modes in ((1, ("strict", "kernelbench-defaults")), (9, ("strict",)),
                        (53, ("strict",)), (66, ("strict",))):  # fmt: skip
        pin = root / f"pin{task}.json"
        pin_task(checkout, record, task, pin)
        paths = {mode: root / f"{task}-{mode}.json" for mode in modes}
        run_survey_task(checkout, pin, settings, root / "contract.json", paths, print)
        for mode, path in paths.items():
            out[(task, mode)] = records.read_record(path, "survey_task")
    return out


def test_the_gpu_lock_is_named_after_the_devices_uuid():
    lock = gpulock.for_device("cuda")
    assert re.fullmatch(r"kbfuse-gpu-GPU-[0-9a-f]{8}(-[0-9a-f]{4}){3}-[0-9a-f]{12}\.lock",
                        lock.path.name)  # fmt: skip
    smi = subprocess.run(["nvidia-smi", "--query-gpu=uuid", "--format=csv,noheader"],
                         capture_output=True, text=True, check=True).stdout.split()  # fmt: skip
    assert lock.path.name.removeprefix("kbfuse-gpu-").removesuffix(".lock") in smi


def test_every_record_names_its_gpu(surveyed):
    """environment.gpu: index, UUID (as nvidia-smi lists it) and name of the job's GPU."""
    smi = subprocess.run(["nvidia-smi", "--query-gpu=uuid,name", "--format=csv,noheader"],
                         capture_output=True, text=True, check=True).stdout  # fmt: skip
    names = dict(tuple(p.strip() for p in line.split(",", 1)) for line in smi.splitlines())
    for key, rec in surveyed.items():
        gpu = rec["environment"]["gpu"]
        assert set(gpu) == {"index", "uuid", "name"}, key
        assert names[gpu["uuid"]] == gpu["name"] == rec["environment"]["device_name"], key
        assert gpu["index"] == 0, key  # the library call, not placed: CUDA's device 0


def test_calls_per_sample_are_sized_from_the_fastest_baseline(surveyed):
    for (task, mode), rec in surveyed.items():
        protocol = rec["timing_protocol"]
        fastest = protocol["fastest_call_ms"]
        assert fastest > 0, (task, mode)
        assert protocol["invocations_per_pair"] == min(3, math.ceil(1.0 / fastest))
    one_job = (surveyed[(1, "strict")], surveyed[(1, "kernelbench-defaults")])
    assert all(r["job"] == {
            "modes": ["strict", "kernelbench-defaults"],
            "built_in": "strict",
            "rerun_alone": False,
        }
               for r in one_job)  # fmt: skip


def test_records_say_cuda_and_the_three_methods(surveyed):
    for rec in surveyed.values():
        assert rec["device"] == "cuda" and rec["environment"]["cuda"]
        assert rec["timing_protocol"]["methods"] == METHODS


def test_numerics_modes_set_the_tf32_flags(surveyed):
    assert surveyed[(1, "strict")]["numerics"] == {
        "mode": "strict",
        "matmul_tf32": False,
        "cudnn_tf32": False,
    }
    assert surveyed[(1, "kernelbench-defaults")]["numerics"] == {
        "mode": "kernelbench-defaults",
        "matmul_tf32": False,
        "cudnn_tf32": True,
    }


def test_every_baseline_has_three_timings_kernels_and_ratios(surveyed):
    rec = surveyed[(53, "strict")]
    for name, entry in rec["baselines"].items():
        assert entry["status"] == "ok", (name, entry["failure"])
        assert entry["correctness"]["official_pass"] is True
        timing = entry["timing"]
        assert timing["graph_missing"] is None
        for method in METHODS:
            assert len(timing[method]["samples_ms"]) == ROUNDS, (name, method)
            assert timing[method]["median_ms"] > 0
        assert entry["kernels"] and all(k["device_us"] > 0 for k in entry["kernels"])
    assert set(rec["ratios"]) == {"torchscript", "inductor"}
    assert all(set(r) == set(METHODS) for r in rec["ratios"].values())
    names = [k["name"] for k in rec["baselines"]["inductor"]["kernels"]]
    assert any("triton" in n for n in names), names


def test_every_profiled_baseline_has_a_timeline_of_its_forward(surveyed):
    for (task, mode), rec in surveyed.items():
        # the profiles were captured alone and read (CPU work) after the job left the GPU
        assert rec["phases_s"]["profile"] > 0 and rec["phases_s"]["profile_read"] > 0
        for name, entry in rec["baselines"].items():
            line = entry["timeline"]
            assert line["forwards"] == 3, (task, mode, name)
            assert 0 < line["busy_us"] <= line["span_us"] + 1e-6
            assert line["idle_us"] == pytest.approx(line["span_us"] - line["busy_us"], abs=1e-6)
            # the busy time is at most the kernels' summed time (overlaps count once)
            summed = sum(k["device_us"] for k in entry["kernels"])
            assert line["busy_us"] <= summed + 1e-3, (task, mode, name)


AUTOTUNE = "inductor-max-autotune-no-cudagraphs"


def test_max_autotune_is_built_alone_in_each_mode_and_checked_like_any_baseline(tmp_path):
    url, commit = make_survey_repo(tmp_path / "kb")
    checkout, record = tmp_path / "checkout", tmp_path / "checkout.json"
    pin_kernelbench(url, commit, 2, [53], checkout, record)
    write_contract(checkout, record, tmp_path / "contract.json")
    pin_task(checkout, record, 53, tmp_path / "pin.json")
    settings = survey_settings(
        {"survey": {**SETTINGS, "baselines": ["eager", "inductor", AUTOTUNE]}}
    )
    paths = {m: tmp_path / f"{m}.json" for m in ("strict", "kernelbench-defaults")}
    run_survey_task(
        checkout, tmp_path / "pin.json", settings, tmp_path / "contract.json", paths, print
    )
    compiles = {}
    for mode, path in paths.items():
        rec = records.read_record(path, "survey_task")
        compiles[mode] = sum(rec["compile_cache"].values())  # cache lookups: one per compile
        entry = rec["baselines"][AUTOTUNE]
        assert entry["status"] == "ok", entry["failure"]
        assert entry["built_in"] == mode and entry["build_s"] > 0
        assert entry["correctness"]["official_pass"] is True
        assert entry["timing"]["graph"]["median_ms"] > 0 and entry["kernels"]
        assert rec["phases_s"]["alone_builds"] > 0
        # its warm-up, beside other jobs, compiled first; the build alone took its kernels
        assert entry["warm_build_s"] > 0 and rec["phases_s"]["warm_builds"] > 0
        assert entry["conv_backends"] == "ATEN,TRITON"  # Inductor's own: none configured
        print(f"{mode}: warm-up {entry['warm_build_s']:.2f} s, alone {entry['build_s']:.2f} s")
    # the second mode's build alone compiled a graph of its own (it once reused the first's)
    assert compiles["kernelbench-defaults"] > compiles["strict"]


def test_max_autotune_on_aten_conv_backends_leaves_a_grouped_convolution_to_cudnn():
    """survey.max_autotune_conv_backends: ATEN (level 3's reference): Inductor's Triton
    convolution templates are not among max-autotune's choices, the convolution stays cuDNN's
    (an extern kernel in the generated code), and the build is Inductor's max-autotune still."""
    import torch
    from torch._inductor.utils import run_and_get_code

    from kbfuse.survey import baselines

    torch.manual_seed(0)
    model = torch.nn.Conv2d(64, 64, 5, padding=2, groups=64).cuda()
    x = torch.randn(4, 64, 56, 56, device="cuda")
    with torch._inductor.config.patch(force_disable_caches=True):  # the code is generated here
        (forward, build_s), code = run_and_get_code(
            baselines.build, AUTOTUNE, model, [x], "eval", torch.cuda.synchronize, "ATEN"
        )
    generated = "\n".join(code)
    assert build_s > 0
    assert "extern_kernels.convolution" in generated
    assert "triton_tem" not in generated and "convolution2d" not in generated
    with torch.no_grad():
        torch.testing.assert_close(forward(x), model(x))


def test_a_forward_that_reads_back_keeps_events_and_says_why_graph_is_missing(surveyed):
    rec = surveyed[(9, "strict")]
    eager = rec["baselines"]["eager"]
    assert eager["status"] == "ok"
    assert eager["timing"]["graph"] is None
    assert eager["timing"]["graph_missing"]
    assert len(eager["timing"]["events"]["samples_ms"]) == ROUNDS
    assert len(eager["timing"]["cold_l2"]["samples_ms"]) == ROUNDS


def test_a_trace_runs_in_the_cudnn_mode_it_was_traced_in():
    """TorchScript bakes cuDNN's allow_tf32 into each convolution when it traces: a trace made
    in strict FP32 gives strict bits under KernelBench's defaults (the survey's TorchScript
    column did not move with the mode); traced in each mode, it gives that mode's bits."""
    import torch

    from kbfuse.survey import baselines
    from kbfuse.survey.settings import set_numerics

    torch.manual_seed(0)
    model = torch.nn.Conv2d(64, 64, 3, padding=1).cuda()
    x = torch.randn(8, 64, 32, 32, device="cuda")
    try:
        set_numerics("strict")
        strict_trace = baselines.make("torchscript", model, [x], "kernelbench")
        eager_strict = baselines.make("eager", model, [x], "kernelbench")(x)
        set_numerics("kernelbench-defaults")
        eager_tf32 = baselines.make("eager", model, [x], "kernelbench")(x)
        tf32_trace = baselines.make("torchscript", model, [x], "kernelbench")
        assert not torch.equal(eager_tf32, eager_strict)  # TF32 changes this convolution
        assert torch.equal(strict_trace(x), eager_strict)  # the old trace: strict bits
        assert torch.equal(tf32_trace(x), eager_tf32)  # traced in the mode: its bits
    finally:
        set_numerics("strict")


def test_torchscript_is_built_in_each_mode_and_matches_eager_there(surveyed):
    for mode in ("strict", "kernelbench-defaults"):
        ts = surveyed[(1, mode)]["baselines"]["torchscript"]
        assert ts["built_in"] == mode and ts["correctness"]["official_pass"] is True
        assert surveyed[(1, mode)]["baselines"]["inductor"]["built_in"] == "strict"


def test_dropout_is_nondeterministic_on_the_gpu_too(surveyed):
    rec = surveyed[(66, "strict")]
    assert rec["determinism"]["verdict"] == "nondeterministic"
    assert rec["determinism"]["same_seed_equal"] is True


# Another job beside the survey's: holds the device's GPU lock shared and every byte of device
# memory it can get until told to go, then frees it before it lets go of the lock.
HOLDER = r"""
import sys, time
from pathlib import Path
import torch
from kbfuse.workflow import gpulock

ready, go = Path(sys.argv[1]), Path(sys.argv[2])
with gpulock.for_device("cuda").shared():
    blocks, size = [], 1 << 30
    while size >= 1 << 21:
        try:
            blocks.append(torch.empty(size, dtype=torch.uint8, device="cuda"))
        except torch.OutOfMemoryError:
            size //= 2
    ready.write_text(f"{sum(b.numel() for b in blocks)} {torch.cuda.mem_get_info()[0]}")
    print("holder: holding", ready.read_text(), flush=True)
    deadline = time.monotonic() + 300
    while not go.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    print("holder: told to go" if go.exists() else "holder: gave up waiting", flush=True)
    del blocks
    torch.cuda.empty_cache()
    torch.cuda.synchronize()
    print("holder: memory freed", torch.cuda.mem_get_info(), flush=True)
print("holder: lock released", flush=True)
"""

# The survey's job, in a process of its own (nothing of earlier tests cached in its allocator):
# its CUDA context made before the memory runs out, then the job once the holder is ready;
# when the job says it will wait to be alone, the holder is told to go.
JOB = r"""
import json, sys, time
from pathlib import Path
import torch
from kbfuse.survey.job import run_survey_task
from kbfuse.survey.settings import survey_settings

checkout, pin, contract, out, context, ready, go = map(Path, sys.argv[1:8])
torch.zeros(1, device="cuda")
torch.cuda.empty_cache()
context.touch()
while not ready.exists():
    time.sleep(0.05)

def say(line):
    print(line, flush=True)
    if line.startswith("out of memory beside other jobs"):
        go.touch()

settings = survey_settings({"survey": json.loads(sys.argv[8])})
run_survey_task(checkout, pin, settings, contract, {"strict": out}, say)
"""


def test_a_task_out_of_memory_beside_another_job_runs_again_alone(tmp_path):
    """A real out-of-memory error: another process holds the lock shared and the device's
    memory, so the task's model cannot even be loaded; the job waits to be alone (the other
    process frees its memory and lets go once the job has said why it waits) and runs the
    whole task again."""
    url, commit = make_survey_repo(tmp_path / "kb")
    checkout, record, pin = tmp_path / "checkout", tmp_path / "checkout.json", tmp_path / "53.pin"
    pin_kernelbench(url, commit, 2, [53], checkout, record)
    pin_task(checkout, record, 53, pin)
    write_contract(checkout, record, tmp_path / "contract.json")
    out = tmp_path / "53-strict.json"
    context, ready, go = tmp_path / "context", tmp_path / "ready", tmp_path / "go"
    settings = json.dumps({**SETTINGS, "baselines": ["eager"]})
    paths = (checkout, pin, tmp_path / "contract.json", out, context, ready, go)
    args = [str(p) for p in paths] + [settings]
    job = subprocess.Popen([sys.executable, "-c", JOB, *args], stdout=subprocess.PIPE, text=True)
    holder = None
    try:
        deadline = time.monotonic() + 120
        while not context.exists():
            assert job.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(ready), str(go)])
        said, _ = job.communicate(timeout=300)
        print(said)
        assert job.returncode == 0, said
        assert holder.wait(timeout=60) == 0
    finally:
        go.touch()
        ready.touch()
        for process in (job, holder):
            if process is not None and process.poll() is None:
                process.kill()
                process.wait()
    held, left = map(int, (tmp_path / "ready").read_text().split())
    assert held > 100 * 2**30 and left < 256 * 2**20  # over 100 GiB held, little left
    assert "out of memory beside other jobs: the whole task again, alone" in said
    rec = records.read_record(out, "survey_task")
    assert rec["job"] == {"modes": ["strict"], "built_in": "strict", "rerun_alone": True}
    eager = rec["baselines"]["eager"]
    assert eager["status"] == "ok" and len(eager["timing"]["events"]["samples_ms"]) == ROUNDS
    assert rec["phases_s"]["wait_alone"] > 0  # it waited for the other job to let go
