"""benchmarks/gpu_job_startup.py and kbfuse.workflow.startup: phases timed for real in fresh
processes.

The CPU phases (interpreter, imports, loading a task and building its model on the CPU) run
here against the small KernelBench-shaped repository; the GPU phases (CUDA init, moving the
model, Inductor with a cold and a warm cache) are listed as not measured without a GPU and
measured by the `gpu` test on the GPU machine.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from kbfuse.errors import KbfuseError
from kbfuse.io import read_json, write_json
from kbfuse.tasks.kernelbench import pin_kernelbench
from kbfuse.workflow import startup

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks/gpu_job_startup.py"
CPU_PHASES = (
    "interpreter",
    "import_torch",
    "import_snakemake",
    "import_kbfuse",
    "load_task",
    "build_model_cpu",
)
GPU_PHASES = ("cuda_init", "model_to_cuda", "inductor_cold", "inductor_warm")
HAS_CUPY = importlib.util.find_spec("cupy") is not None


@pytest.fixture(scope="module")
def pinned(kb_repo, tmp_path_factory) -> tuple[Path, Path]:
    """(checkout, pin.json) of the test repository, pinned as the workflow does."""
    root = tmp_path_factory.mktemp("startup")
    pin_kernelbench(*kb_repo, 2, [53, 81, 95], root / "checkout", root / "pin.json")
    return root / "checkout", root / "pin.json"


@pytest.fixture(scope="module")
def cpu_report(pinned) -> dict:
    return startup.measure(*pinned, task=53, repeats=2, gpu=False)


def by_phase(report: dict) -> dict[str, dict]:
    return {row["phase"]: row for row in report["phases"]}


def test_every_phase_has_a_row(cpu_report):
    assert [row["phase"] for row in cpu_report["phases"]] == list(startup.PHASE_NAMES)
    expected = """interpreter import_torch import_cupy import_snakemake import_kbfuse cuda_init
        load_task build_model_cpu model_to_cuda inductor_cold inductor_warm"""
    assert list(startup.PHASE_NAMES) == expected.split()
    assert cpu_report["kind"] == "gpu_job_startup" and cpu_report["gpu"] is False


def test_cpu_phases_measured(cpu_report):
    rows = by_phase(cpu_report)
    for name in CPU_PHASES:
        row = rows[name]
        assert row["measured"] and row["note"] is None, row
        assert row["repeats"] == len(row["samples_s"]) == 2
        assert all(s > 0 for s in row["samples_s"])
        assert row["min_s"] <= row["median_s"] <= row["max_s"]
    # importing torch costs far more than starting the interpreter, and every child's wall
    # time holds its timed phases
    assert rows["import_torch"]["median_s"] > 5 * rows["interpreter"]["median_s"]
    children = cpu_report["children"]
    assert children["import_torch"]["median_s"] > rows["import_torch"]["median_s"]
    model = rows["load_task"]["samples_s"][0] + rows["build_model_cpu"]["samples_s"][0]
    assert children["model"]["samples_s"][0] > model
    assert set(children) == {*CPU_PHASES[:4], "model"}


def test_gpu_phases_not_measured_without_gpu(cpu_report):
    rows = by_phase(cpu_report)
    for name in GPU_PHASES:
        assert rows[name]["measured"] is False and rows[name]["note"] == startup.NO_GPU
        assert "median_s" not in rows[name] and rows[name]["repeats"] == 0
    assert cpu_report["inductor_cold_over_warm"] is None
    if not HAS_CUPY:
        assert rows["import_cupy"]["note"] == "not measured: cupy is not installed"


def test_startup_sum(cpu_report):
    rows = by_phase(cpu_report)
    summed = cpu_report["startup_phases_summed"]
    expected = [*CPU_PHASES[:2], *(["import_cupy"] if HAS_CUPY else []), *CPU_PHASES[2:]]
    assert summed == expected
    assert cpu_report["startup_sum_s"] == pytest.approx(sum(rows[p]["median_s"] for p in summed))
    assert cpu_report["startup_phases_missing"] == [
        *([] if HAS_CUPY else ["import_cupy"]),
        "cuda_init",
        "model_to_cuda",
    ]
    text = startup.report_markdown(cpu_report)
    assert f"{cpu_report['startup_sum_s']:.2f} s per GPU job" in text
    assert "| cuda_init | CUDA init" in text and "| — | — | — | not measured: no GPU |" in text
    assert text.count("\n| ") == 1 + len(startup.PHASE_NAMES)  # header + one row per phase


def test_child_programs_are_python():
    children = {p.child for p in startup.PHASES} - {"interpreter"}
    for child in children:
        for gpu in (False, True):
            compile(startup.child_program(child, gpu), f"<{child}>", "exec")
    assert "model_to_cuda" not in startup.child_program("model", gpu=False)
    assert "model_to_cuda" in startup.child_program("model", gpu=True)


def test_gpu_child_without_gpu_fails_clearly(pinned):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    with pytest.raises(KbfuseError, match="needs a CUDA GPU, but the CUDA driver sees none"):
        startup.measure(*pinned, repeats=1, phases=["cuda_init"], gpu=True)
    assert startup.gpu_available(startup.child_env()) is False


def test_task_pin_and_bad_arguments(pinned, tmp_path):
    checkout, pin = pinned
    record = read_json(pin)
    record["tasks"] = {
        "81": record["tasks"]["81"]
    }  # the shape of results/kernelbench/tasks/81.json
    write_json(tmp_path / "81.json", record)
    report = startup.measure(
        checkout, tmp_path / "81.json", task=81, repeats=1, phases=["load_task"]
    )
    assert by_phase(report)["load_task"]["median_s"] > 0
    with pytest.raises(KbfuseError, match=r"task 53 is not in the pin record .*\['81'\]"):
        startup.measure(checkout, tmp_path / "81.json", task=53)
    with pytest.raises(KbfuseError, match="does not exist"):
        startup.measure(checkout, tmp_path / "missing.json")
    with pytest.raises(KbfuseError, match="unknown phase"):
        startup.measure(checkout, pin, phases=["import_numpy"])
    with pytest.raises(KbfuseError, match="inductor_warm needs inductor_cold"):
        startup.measure(checkout, pin, phases=["inductor_warm"])
    with pytest.raises(KbfuseError, match="repeats"):
        startup.measure(checkout, pin, repeats=0)
    with pytest.raises(KbfuseError, match="not a directory"):
        startup.measure(tmp_path / "nowhere", pin)


def test_script_writes_json_and_markdown(pinned, tmp_path):
    checkout, pin = pinned
    out_json, out_md = tmp_path / "startup.json", tmp_path / "startup.md"
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--checkout", str(checkout), "--pin", str(pin)]
        + ["--task", "95", "--repeats", "1", "--phases", "interpreter,build_model_cpu"]
        + ["--json", str(out_json), "--markdown", str(out_md), "--quiet"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert proc.stdout == out_md.read_text()
    data = read_json(out_json)
    assert data["task"] == 95 and data["repeats"] == 1
    # no selected phase needs the GPU: torch is not asked for one (a process of its own)
    assert data["gpu"] is None and "GPU: not asked, no GPU phase selected" in proc.stdout
    assert [r["phase"] for r in data["phases"]] == ["interpreter", "build_model_cpu"]
    assert all(r["measured"] and r["median_s"] > 0 for r in data["phases"])
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--checkout", str(checkout), "--pin", str(pin)]
        + ["--phases", "nonsense"],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 1 and "unknown phase(s) ['nonsense']" in proc.stderr


@pytest.mark.gpu
def test_gpu_phases_on_the_gpu(pinned):
    # the CPU-only phases are covered above; here what needs the GPU (and CuPy, if installed)
    phases = ["import_cupy", "cuda_init", "load_task", "build_model_cpu", *GPU_PHASES[1:]]
    report = startup.measure(*pinned, task=53, repeats=2, phases=phases)
    rows = by_phase(report)
    assert report["gpu"] is True
    for name in phases if HAS_CUPY else phases[1:]:
        assert rows[name]["measured"] and rows[name]["repeats"] == 2, rows[name]
        assert all(s > 0 for s in rows[name]["samples_s"])
    # a cold cache compiles the tail's Triton kernel; a warm one loads it from disk
    cold, warm = rows["inductor_cold"], rows["inductor_warm"]
    assert cold["median_s"] > warm["median_s"]
    assert all(c > w for c, w in zip(cold["samples_s"], warm["samples_s"], strict=True))
    assert report["inductor_cold_over_warm"] == pytest.approx(cold["median_s"] / warm["median_s"])
    text = startup.report_markdown(report)
    assert "Inductor tail compile: cold cache" in text and "not measured: no GPU" not in text
