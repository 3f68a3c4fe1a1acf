"""The survey's per-task job on a GPU (run on the GPU machine: pytest -m gpu).

The fixture's tasks (tests/survey_kbrepo.py) are surveyed on "cuda": the three timing methods
(CUDA events, CUDA-graph replay, cold L2), the kernel profile, a forward that cannot be
captured in a CUDA graph (task 9 reads a value back with `.item()`) keeping its event timing,
both numerics modes' TF32 flags from one job, the GPU lock named after the device's UUID, and
the calls per sample sized from the fastest baseline.
"""

from __future__ import annotations

import math
import re
import subprocess

import pytest
from survey_kbrepo import make_survey_repo

from kbfuse.results import records
from kbfuse.survey.job import run_survey_task
from kbfuse.survey.settings import survey_settings
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
    settings = survey_settings({"survey": SETTINGS})
    out = {}
    for task, modes in ((1, ("strict", "kernelbench-defaults")), (9, ("strict",)),
                        (53, ("strict",)), (66, ("strict",))):  # fmt: skip
        pin = root / f"pin{task}.json"
        pin_task(checkout, record, task, pin)
        paths = {mode: root / f"{task}-{mode}.json" for mode in modes}
        run_survey_task(checkout, pin, settings, paths, print)
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


def test_a_forward_that_reads_back_keeps_events_and_says_why_graph_is_missing(surveyed):
    rec = surveyed[(9, "strict")]
    eager = rec["baselines"]["eager"]
    assert eager["status"] == "ok"
    assert eager["timing"]["graph"] is None
    assert eager["timing"]["graph_missing"]
    assert len(eager["timing"]["events"]["samples_ms"]) == ROUNDS
    assert len(eager["timing"]["cold_l2"]["samples_ms"]) == ROUNDS


def test_dropout_is_nondeterministic_on_the_gpu_too(surveyed):
    rec = surveyed[(66, "strict")]
    assert rec["determinism"]["verdict"] == "nondeterministic"
    assert rec["determinism"]["same_seed_equal"] is True
