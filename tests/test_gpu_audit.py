"""`snakemake audit` on a GPU, end to end, on two real candidates written as a corpus in
CUDA-L1's format (one JSON record per line, read through the packaged `cuda_l1` mapping):
`own_53` (kbfuse's fused tail through load_inline: passes bit for bit) and `side_stream_53`
(computes on a stream of its own: fails `side_stream`, which only a GPU can show), each with
made-up claims, its `ref_code` the pinned task file itself; measured in the claims' mode
(PyTorch's defaults) and in strict FP32. KernelBench comes from
$KBFUSE_CHECK_KERNELBENCH or .kb/KernelBench.git, as in tests/test_gpu_check.py.

With $KBFUSE_AUDIT_CUDA_L1 naming CUDA-L1's own `optimized_cuda_code/h100.json` (not in this
repository), its first two level-2 kernels with code are audited too, judged against the
pinned task files.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml
from conftest import copy_workflow, snakemake, write_test_config

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parent.parent
CANDIDATES = ROOT / "tests" / "candidates"
PIN = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())["kernelbench"]["commit"]
TASK53 = "KernelBench/level2/53_Gemm_Scaling_Hardtanh_GELU.py"
SETTINGS = {
    "official_trials": 5,
    "seeds": [0],
    "time_limit_s": 590,
    "baselines": ["eager", "torchscript", "inductor"],
    "timing": {"warmup": 2, "rounds": 6, "invocations_per_pair": 5},
}
CLAIMS = {  # CUDA-L1's keys, values of the test's choosing
    "own_53": {"score_default": 1.0, "score_torch_compile_default": 50.0},
    "side_stream_53": {"score_default": 30.0, "score_torch_compile_default": 20.0},
}
AUDIT_TIMEOUT_S = 1500
MODES = ["kernelbench-defaults", "strict"]  # the claims' mode (CUDA-L1's), and strict FP32


def _mirror() -> str:
    mirror = os.environ.get("KBFUSE_CHECK_KERNELBENCH") or str(ROOT / ".kb" / "KernelBench.git")
    assert Path(mirror).exists(), "no KernelBench repository: set KBFUSE_CHECK_KERNELBENCH"
    return mirror


def _record(stem: str, reference: str) -> dict:
    return {
        "level_id": 2,
        "task_id": 53,
        "ref_code": reference,
        "custom_code": (CANDIDATES / f"{stem}.py").read_text(),
        "score_torch_compile_reduce_overhead": None,
        "score_cuda_graph": None,
        "score_cudnn": None,
        **CLAIMS[stem],
    }


def _audit(workdir: Path, mirror: str, block: dict) -> None:
    overlay = write_test_config(workdir, mirror, PIN, arch="auto", check=SETTINGS, audit=block)
    start = time.monotonic()
    snakemake(
        workdir,
        "--cores",
        str(os.cpu_count()),
        "audit",
        "--configfile",
        str(overlay),
        timeout=AUDIT_TIMEOUT_S,
    )
    print(f"snakemake audit {block['name']}: {time.monotonic() - start:.0f} s")


@pytest.fixture(scope="module")
def audited(tmp_path_factory) -> Path:
    mirror = _mirror()
    reference = subprocess.run(  # bytes: no newline translation, the file as pinned
        ["git", "-C", mirror, "show", f"{PIN}:{TASK53}"], capture_output=True, check=True
    ).stdout.decode()
    workdir = copy_workflow(tmp_path_factory.mktemp("gpu-audit") / "wf")
    corpus = workdir / "corpus.json"
    corpus.write_text("".join(json.dumps(_record(s, reference)) + "\n" for s in CLAIMS))
    block = {"corpus": str(corpus), "mapping": "cuda_l1", "name": "two", "numerics": MODES}
    _audit(workdir, mirror, block)
    return workdir / "results" / "audit" / "two"


def _table(root: Path) -> pd.DataFrame:
    table = pd.read_csv(root / "summary" / "table.csv")
    table.index = [line.split()[-1] for line in table["source"]]  # "corpus.json line 1" -> "1"
    return table


def test_each_candidate_has_its_verdict_and_outcome(audited):
    table = _table(audited)
    own, side = table.loc["1"], table.loc["2"]
    assert own["verdict"] == "pass" and pd.isna(own["findings"])  # no finding
    assert own["outcome"].startswith("passes")
    assert side["verdict"] == "fail" and "side_stream" in side["failed_checks"].split()
    assert side["outcome"] == "fails: side stream"
    assert set(table["reference_vs_pinned"]) == {"same"}  # ref_code is the pinned file
    for name in table["entry"]:
        for mode in MODES:
            record = json.loads((audited / "verdicts" / mode / f"{name}.json").read_text())
            assert record["sandbox"]["used"] == "bwrap" and record["task"]["commit"] == PIN
            assert record["environment"]["device"] == "cuda"
            assert record["settings"]["numerics"] == mode
            # the audit's jobs hold the GPU lock; each step's wait for it is part of its time
            waits, phases = record["lock_wait_s"], record["phases_s"]
            assert set(waits) == {"reference", "candidate", "witness", "compare"}
            assert all(0 <= waits[step] <= phases[step] for step in waits)
    # strict FP32 on both sides: the fused tail is still right, the side stream still seen
    assert own["strict_verdict"] == "pass"
    assert side["strict_outcome"] == "fails: side stream"


def test_measured_figures_stand_beside_the_claims(audited):
    own = _table(audited).loc["1"]
    assert own["method"] == "events"
    for column in (
        "measured_over_eager",
        "measured_over_best_compiled",
        "measured_over_torch_compile",
    ):
        assert 0 < own[f"{column}_q1"] <= own[column] <= own[f"{column}_q3"], column
    assert own["best_compiled"] in ("torchscript", "inductor")
    # the study's tail is no 50x faster than Inductor: that made-up claim does not reproduce
    assert own["claim_over_torch_compile"] == 50.0
    assert own["status_over_torch_compile"] == "does not reproduce"
    side = _table(audited).loc["2"]
    assert side["status_over_eager"] == "fails check"


def test_the_summary_files(audited):
    tallies = pd.read_csv(audited / "summary" / "tallies.csv")
    outcome = tallies[tallies["group"] == "outcome"].set_index("kind")["count"]
    assert outcome["fails: side stream"] == 1 and outcome.sum() == 2
    text = (audited / "summary" / "table.md").read_text()
    assert "timing method events" in text
    assert (audited / "summary" / "claims.png").stat().st_size > 20_000


def test_cuda_l1_kernels_against_the_pin(tmp_path_factory):
    corpus = os.environ.get("KBFUSE_AUDIT_CUDA_L1")
    if not corpus:
        pytest.skip("KBFUSE_AUDIT_CUDA_L1 does not name CUDA-L1's optimized_cuda_code/h100.json")
    workdir = copy_workflow(tmp_path_factory.mktemp("gpu-audit-l1") / "wf")
    # two tasks of small outputs (about 1 GB of scratch each: the corpus's first, tasks 1 and
    # 4, need 31 and 62 GB) and task 2, whose record has no code
    block = {"corpus": corpus, "mapping": "cuda_l1", "name": "l1", "tasks": [2, 24, 70]}
    _audit(workdir, _mirror(), block)
    root = workdir / "results" / "audit" / "l1"
    table = pd.read_csv(root / "summary" / "table.csv")
    checked = table[table["entry"].notna()]
    assert len(checked) == 2 and set(checked["verdict"]) <= {"pass", "fail"}
    assert set(checked["task"]) == {"2/24", "2/70"}
    assert checked["claim_over_eager"].notna().all()
    # CUDA-L1 made its claims on other shapes than the pin's
    assert set(checked["reference_vs_pinned"]) == {"differs"}
    for _, row in checked.iterrows():
        assert row["status_over_eager"] in ("reproduces", "does not reproduce", "fails check")
    # the records without code, or whose code is the text 'None', are listed, not checked
    assert table.loc[table["verdict"] == "not checked", "task"].tolist() == ["2/2"]
