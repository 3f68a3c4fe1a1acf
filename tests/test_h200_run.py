"""tools/h200-run.sh, the one command of a device call, run on the CPU with its outside world
stubbed: `python3 -m pip/snakemake/pytest/kbfuse.workflow.cli` and `nvidia-smi` record their
arguments instead of running. Each run is in a bubblewrap sandbox with a /tmp of its own (the
script keeps its install marker, background runs and return folder in /tmp, as on the device
machine). What is checked: the commands each mode starts, in order, with the settings the
environment gives them, the background runs waited for and reported with their exit status,
the returned archive, and the install skipped on a warm machine."""

from __future__ import annotations

import lzma
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PIN = "4e6d5c3b" * 5  # as config.yaml names a commit: hex, read as a string

PYTHON_STUB = """#!/bin/bash
# python3 on the device machine, stubbed: these modules record their arguments, one call a line
case "$1 $2" in
  "-m pip" | "-m pytest" | "-m snakemake" | "-m kbfuse.workflow.cli")
    printf '%s\\t' "$@" >> {log}
    echo >> {log}
    [ "$2" = kbfuse.workflow.cli ] && {{ [ "$4" = --mb ] && echo 2048 || echo "scratch: stub"; }}
    [ "$2" = snakemake ] && exit "${{STUB_SNAKEMAKE_RC:-0}}"
    exit 0 ;;
esac
exec {python} "$@"
"""


@pytest.fixture
def device(tmp_path):
    """A working tree as the device machine gets it (the script, the config, a carried wheel
    and corpus) and stubs first on PATH."""
    work = tmp_path / "repo"
    (work / "tools").mkdir(parents=True)
    (work / "config").mkdir()
    for tool in ("h200-run.sh", "device-settings.sh"):
        shutil.copy(ROOT / "tools" / tool, work / "tools")
    (work / "config" / "config.yaml").write_text(f"kernelbench:\n  commit: {PIN}\n")
    (work / ".whl").mkdir()
    (work / ".whl" / "stub-1.0-py3-none-any.whl").write_bytes(b"")
    (work / ".corpus").mkdir()
    (work / ".corpus" / "cuda_l1_h100.json.xz").write_bytes(lzma.compress(b"[]"))
    stubs = tmp_path / "bin"
    stubs.mkdir()
    log = tmp_path / "calls.log"
    python = stubs / "python3"
    python.write_text(PYTHON_STUB.format(log=log, python=sys.executable))
    smi = stubs / "nvidia-smi"
    smi.write_text("#!/bin/bash\necho 'name, driver_version'\necho 'NVIDIA H200 (stub), 0'\n")
    for stub in (python, smi):
        stub.chmod(0o755)
    return tmp_path


def run(root: Path, commands: str, **env: str) -> subprocess.CompletedProcess:
    """`commands` (bash) in the working tree, in a sandbox whose /tmp is its own."""
    if shutil.which("bwrap") is None:
        pytest.fail("bubblewrap is needed (apt-get install bubblewrap; .ci/run installs it)")
    setting = [f"{k}={v}" for k, v in {"OUT": str(root / "return"), **env}.items()]
    sandbox = ["bwrap", "--bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp"]
    # this interpreter and this checkout (kbfuse installed from it) may lie in /tmp too, as
    # in CI's fresh clone: seen again above the sandbox's own /tmp
    for folder in (Path(sys.prefix), ROOT):
        sandbox += ["--ro-bind", str(folder), str(folder)]
    sandbox += ["--bind", str(root), str(root), "--chdir", str(root / "repo"), "--"]
    path = f"{root / 'bin'}:/usr/bin:/bin"
    command = [*sandbox, "env", f"PATH={path}", *setting, "bash", "-c", commands]
    return subprocess.run(command, capture_output=True, text=True, timeout=300)


def calls(root: Path) -> list[list[str]]:
    lines = (root / "calls.log").read_text().splitlines()
    return [line.rstrip("\t").split("\t") for line in lines]


def returned(root: Path, name: str) -> str:
    with tarfile.open(root / "return" / "out.tar.gz") as archive:
        return archive.extractfile(f"./{name}").read().decode()


def test_a_background_audit_then_the_survey_and_the_wait(device):
    done = run(
        device,
        "bash tools/h200-run.sh bg-audit,wait",
        RESUME_PACK="",
        AUDIT_SCRATCH="/tmp",
        AUDIT_JOBS="12",
        AUDIT_SPREAD="0.02",
        AUDIT_THEN_SURVEY="survey={level: 3}",
        WAIT_UNTIL="120",
    )
    assert done.returncode == 0, done.stderr
    work = device / "repo"
    kb = f"kernelbench={{url: {work}/.kb/KernelBench.git, commit: {PIN}}}"
    cores = str(len(os.sched_getaffinity(0)))  # nproc
    assert calls(device) == [
        ["-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
         "--no-cache-dir", "--upgrade", "--target", "/tmp/site", ".whl/stub-1.0-py3-none-any.whl"],
        ["-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "-e", "."],
        ["-m", "kbfuse.workflow.cli", "scratch"],
        ["-m", "kbfuse.workflow.cli", "scratch", "--mb"],
        ["-m", "snakemake", "--cores", cores, "--keep-going", "audit",
         "results/env/fingerprint.json", "--resources", "gpu=1", "gpu_jobs=12", "scratch_mb=2048",
         "--config", kb,
         "audit={corpus: /tmp/corpus/cuda_l1_h100.json, mapping: cuda_l1, name: cuda_l1_h100}",
         "check={timing: {spread: 0.02}}"],
        ["-m", "snakemake", "--cores", cores, "--keep-going", "survey",
         "results/env/fingerprint.json", "--config", kb, "survey={level: 3}"],
    ]  # fmt: skip
    phases = returned(device, "phases.txt")
    assert "background audit: " in phases and ", rc 0" in phases
    assert "NVIDIA H200 (stub)" in returned(device, "gpu.txt")
    log = returned(device, "background/audit.log")
    assert "audit (rc 0), then the survey: survey={level: 3}" in log


def test_a_failed_audit_is_reported_and_the_survey_still_runs(device):
    done = run(
        device,
        "bash tools/h200-run.sh bg-audit,wait",
        RESUME_PACK="",
        AUDIT_THEN_SURVEY="survey={level: 3}",
        STUB_SNAKEMAKE_RC="1",
        WAIT_UNTIL="120",
    )
    assert done.returncode == 0, done.stderr  # the call itself went through
    snakemake = [c[2:6] for c in calls(device) if c[1] == "snakemake"]
    assert [c[-1] for c in snakemake] == ["audit", "survey"]
    assert "audit (rc 1), then the survey" in returned(device, "background/audit.log")
    phases = returned(device, "phases.txt")
    assert "background audit: " in phases and ", rc 1" in phases


def test_chosen_gpu_tests_in_the_background_and_a_warm_machines_second_call(device):
    tests = "tests/test_gpu_audit.py::test_the_summary_files tests/test_gpu_check.py"
    done = run(
        device,
        "bash tools/h200-run.sh bg-tests,wait && bash tools/h200-run.sh wait",
        RESUME_PACK="",
        BG_TESTS=tests,
        WAIT_UNTIL="120",
    )
    assert done.returncode == 0, done.stderr
    made = calls(device)
    assert [c[1] for c in made] == ["pip", "pip", "pytest"]  # installed once: the second call
    assert made[2] == ["-m", "pytest", "-m", "gpu", "-p", "no:cacheprovider", "-rA",
                       "--durations=20", *tests.split()]  # fmt: skip
    # the second call's archive: the warm machine's install kept, the tests' run reported
    phases = returned(device, "phases.txt")
    assert "install: already there (warm machine)" in phases
    assert "background tests: " in phases and ", rc 0" in phases


def test_a_resumed_audit_compares_params_and_software_not_the_set_of_inputs(device):
    """Every job lists the code it runs, so comparing the set of inputs would redo every
    finished verdict after a commit that adds a module (session 26 lost a call so). The
    pack's verdict is unpacked and the resumed run passes the two triggers; the variable
    can still ask for the third."""
    work = device / "repo"
    shutil.copy(ROOT / "tools" / "resume-unpack.sh", work / "tools")
    staged = device / "staged"
    verdict = staged / "results" / "audit" / "c" / "verdicts" / "m" / "l2_t1_x.json"
    verdict.parent.mkdir(parents=True)
    verdict.write_text("{}")
    (work / "resume").mkdir()
    with tarfile.open(work / "resume" / "results.tar.gz", "w:gz") as pack:
        pack.add(staged / "results", arcname="results")
    for extra, triggers in (
        ({}, ["params", "software-env"]),
        (
            {"RESUME_RERUN_TRIGGERS": "params input software-env"},
            ["params", "input", "software-env"],
        ),
    ):
        (device / "calls.log").unlink(missing_ok=True)
        done = run(device, "bash tools/h200-run.sh bg-audit,wait", WAIT_UNTIL="60", **extra)
        assert done.returncode == 0, done.stderr
        audit = next(c for c in calls(device) if c[:2] == ["-m", "snakemake"])
        at = audit.index("--rerun-triggers")
        assert audit[at + 1 : at + 1 + len(triggers)] == triggers
        assert audit[at + 1 + len(triggers)] == "--resources"
        phases = returned(device, "phases.txt")
        assert (
            "resumed from resume/results.tar.gz (tools/resume-pack.sh): 1 audit verdicts" in phases
        )
        assert (work / verdict.relative_to(staged)).exists()
