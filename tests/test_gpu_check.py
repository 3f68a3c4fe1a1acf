"""kbfuse check on the GPU corpus (tests/candidates/*.py) against KernelBench at the pin:
each candidate gets the right verdict and names the right reason.

The KernelBench checkout: $KBFUSE_CHECK_KERNELBENCH (a checkout or a clone of the pinned
commit), else results/kernelbench/checkout (the workflow's), else a clone of
.kb/KernelBench.git (the mirror tools/h200-run.sh carries) at the pin. Each candidate is checked
once (module cache) and then asserted on; `-k own_53` runs one. own_53 is timed against
eager, TorchScript and Inductor, the others against eager and TorchScript (their verdicts do
not depend on the baselines; Inductor's compile would double their time). The own kernels
take 2-3 minutes each (nvcc builds the extension, then the witness), the others under one:
split the module over calls of 10 minutes with -k.
"""

from __future__ import annotations

import functools
import os
import subprocess
from pathlib import Path

import pytest
import yaml

from kbfuse.candidates.check import check_candidate, checkout_commit, find_task_file
from kbfuse.candidates.spec import task_of_file

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "tests" / "candidates"
PIN = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())["kernelbench"]["commit"]
BASE = {
    "official_trials": 5,
    "seeds": [0],
    "time_limit_s": 590,
    "timing": {"warmup": 2, "rounds": 6, "invocations_per_pair": 5},
}
FULL_BASELINES = ["eager", "torchscript", "inductor"]
OWN = ("own_53", "own_81", "own_95")


@functools.cache
def kernelbench(tmp: str) -> Path:
    given = os.environ.get("KBFUSE_CHECK_KERNELBENCH")
    for candidate in (given, ROOT / "results/kernelbench/checkout"):
        if candidate and Path(candidate, "KernelBench").is_dir():
            assert checkout_commit(candidate) == PIN, f"{candidate} is not at the pin {PIN}"
            return Path(candidate)
    mirror = ROOT / ".kb" / "KernelBench.git"
    assert mirror.is_dir(), "no KernelBench checkout: set KBFUSE_CHECK_KERNELBENCH"
    target = Path(tmp) / "KernelBench"
    subprocess.run(["git", "clone", "-q", str(mirror), str(target)], check=True)
    subprocess.run(["git", "-C", str(target), "checkout", "-q", PIN], check=True)
    return target


@functools.cache
def verdict_of(stem: str, tmp: str) -> dict:
    checkout = kernelbench(tmp)
    path = CORPUS / f"{stem}.py"
    level, task = task_of_file(path)
    baselines = {"own_53": FULL_BASELINES}.get(stem, ["eager", "torchscript"])
    return check_candidate(
        path,
        level,
        task,
        find_task_file(checkout, level, task),
        Path(tmp) / "verdicts" / f"{stem}.json",
        {**BASE, "baselines": baselines, "witness_cache": str(Path(tmp) / "witness-cache")},
        device="cuda",
        commit=checkout_commit(checkout),
    )


@pytest.fixture(scope="module")
def tmp(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("gpu-check"))


@pytest.mark.parametrize("stem", OWN)
def test_own_fused_tails_pass_bit_for_bit(stem, tmp):
    record = verdict_of(stem, tmp)
    assert record["verdict"] == "pass", record["checks"]
    assert record["failed_checks"] == [] and record["findings"] == []
    cases = record["correctness"]["cases"]
    assert len(cases) == 5 + 1 + 4 + 1  # official, weights, distributions, after timing
    assert all(c["bit_identical"] and c["max_ulps"] == 0 for c in cases.values())
    contract = record["contract"]
    assert contract["routes"] == ["torch.utils.cpp_extension.load_inline"]
    assert contract["builds"][0]["extra_cuda_cflags"] == ["--fmad=false"]
    assert any("--expt-relaxed-constexpr" in b["cuda_flags"] for b in contract["ninja"])
    assert contract["implies"]["ftz"] is False and contract["implies"]["fmad"] is False
    assert contract["effective_ftz"] is False
    assert contract["witness"][0]["output"] != 0.0
    for name in ("side_stream", "unfinished_on_caller_stream", "timer_patched", "lazy_result"):
        assert record["checks"][name]["status"] == "pass", name
    assert {"events", "cold_l2", "graph"} <= set(record["timing"])
    assert record["timing"]["graph_missing"] is None
    speed = record["speedup"]["events"]
    assert speed["best_compiled"] in ("torchscript", "inductor")
    assert speed["over_eager"]["median"] > 0 and speed["over_best_compiled"]["median"] > 0


def test_fast_math_is_named_in_the_contract_and_measured(tmp):
    record = verdict_of("fastmath_81", tmp)
    assert record["checks"]["official"]["status"] == "pass"  # within 1e-2
    assert {"fast_math", "ftz", "ftz_effective", "not_bit_identical"} <= set(record["findings"])
    contract = record["contract"]
    assert contract["implies"]["use_fast_math"] is True
    assert contract["implies"]["prec_div"] is False
    assert contract["effective_ftz"] is True and contract["witness"][0]["output"] == 0.0
    assert any("--use_fast_math" in b["cuda_flags"] for b in contract["ninja"])
    assert record["verdict"] == "pass"  # fast math is a finding, not a failure


def test_a_wrong_kernel_fails_on_values(tmp):
    record = verdict_of("wrong_53", tmp)
    assert record["verdict"] == "fail"
    assert record["failed_checks"][0] == "official"
    assert "output_after_timing" in record["failed_checks"]


def test_zeros_pass_kernelbenchs_check_on_task_23_and_fail_here(tmp):
    record = verdict_of("zeros_23", tmp)
    assert record["checks"]["official"]["status"] == "pass"
    assert record["trivial"]["zeros"]["passes"] is True
    assert "blind_spot" in record["findings"]
    assert record["failed_checks"] == ["input_independent"]


def test_a_caching_candidate_fails_on_changed_inputs(tmp):
    record = verdict_of("caching_53", tmp)
    assert "input_independent" in record["failed_checks"]
    assert "official" in record["failed_checks"]
    assert record["correctness"]["cases"]["official_0"]["bit_identical"] is True


def test_side_stream_work_is_found_by_the_profiler(tmp):
    record = verdict_of("side_stream_53", tmp)
    assert record["checks"]["official"]["status"] == "pass"
    assert "side_stream" in record["failed_checks"]
    side = record["guards"]["side_stream"]
    assert side["detected"] and set(side["candidate_streams"]) - set(side["caller_streams"])
    assert set(record["failed_checks"]) <= {"side_stream", "unfinished_on_caller_stream"}


def test_a_lazy_result_is_named(tmp):
    record = verdict_of("lazy_53", tmp)
    assert record["failed_checks"] == ["lazy_result"]


def test_a_patched_event_timer_is_named_and_does_not_change_the_figures(tmp):
    record = verdict_of("timer_patch_53", tmp)
    assert record["failed_checks"] == ["timer_patched"]
    assert record["guards"]["patched"]["after_import"] == ["torch.cuda.Event.elapsed_time"]
    samples = record["timing"]["events"]["candidate"]["samples_ms"]
    assert min(samples) > 0.001  # the patch returns 0.001 ms; kbfuse's clock is the original
