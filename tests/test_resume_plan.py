"""tools/resume-plan.sh: the jobs a resumed device run would do, planned on the development
machine from a clone of HEAD with the tracked pack unpacked into it. On a small workflow whose
commit since the pack lists one more input: the default triggers plan only the record the pack
lacks; asking for the set of inputs too plans both (session 26's trap, seen before any device
time is spent)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

SNAKEFILE = """\
rule all:
    input:
        expand("results/{{task}}.txt", task=["a", "b"]),


rule record:
    input:
        {inputs},
    output:
        "results/{{task}}.txt",
    shell:
        "cat {{input}} > {{output}}"
"""


def git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True)


@pytest.fixture
def repo(tmp_path):
    """A checkout whose pack holds record a, made when the rule had one input; the commit
    since adds a second input to the rule (as a new module every job lists)."""
    first = tmp_path / "first"
    (first / "src").mkdir(parents=True)
    (first / "Snakefile").write_text(SNAKEFILE.format(inputs='"src/code.py"'))
    (first / "src" / "code.py").write_text("print('code')\n")
    done = subprocess.run(
        [sys.executable, "-m", "snakemake", "--cores", "1", "results/a.txt"],
        cwd=first,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    work = tmp_path / "repo"
    (work / "tools").mkdir(parents=True)
    (work / "resume").mkdir()
    with tarfile.open(work / "resume" / "results.tar.gz", "w:gz") as pack:
        pack.add(first / "results", "results")
        pack.add(first / ".snakemake", ".snakemake")
    shutil.copytree(first / "src", work / "src")
    (work / "src" / "more.py").write_text("print('a module added since')\n")
    (work / "Snakefile").write_text(SNAKEFILE.format(inputs='"src/code.py", "src/more.py"'))
    for tool in ("resume-plan.sh", "resume-unpack.sh", "device-settings.sh"):
        shutil.copy(ROOT / "tools" / tool, work / "tools" / tool)
    git(work, "init", "-q")
    git(work, "add", ".")
    git(work, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "since")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    python = bin_dir / "python3"  # this interpreter (a symlink would lose its venv)
    python.write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
    python.chmod(0o755)
    return work, bin_dir


def plan(work: Path, bin_dir: Path, **env: str) -> subprocess.CompletedProcess:
    environment = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", **env}
    return subprocess.run(
        ["bash", "tools/resume-plan.sh", "all"],
        cwd=work,
        env=environment,
        capture_output=True,
        text=True,
        timeout=300,
    )


def counts(stdout: str) -> dict[str, int]:
    table = stdout.split("reasons:")[0].splitlines()[3:]  # below the header and its rule
    rows = " ".join(table).split()
    return dict(zip(rows[::2], map(int, rows[1::2]), strict=True))


def test_the_default_triggers_plan_only_what_the_pack_lacks(repo):
    work, bin_dir = repo
    done = plan(work, bin_dir)
    assert done.returncode == 0, done.stderr
    assert counts(done.stdout) == {"all": 1, "record": 1, "total": 2}
    assert "      1 reason: Missing output files" in done.stdout
    assert "unpacked resume/results.tar.gz" in done.stderr
    assert not (work / "results").exists()  # planned in a clone, this checkout untouched


def test_the_set_of_inputs_asked_for_plans_the_packs_record_again(repo):
    work, bin_dir = repo
    done = plan(work, bin_dir, RESUME_RERUN_TRIGGERS="params input software-env")
    assert done.returncode == 0, done.stderr
    assert counts(done.stdout) == {"all": 1, "record": 2, "total": 3}
    assert "reason: Set of input files has changed since last execution" in done.stdout


def test_without_a_pack_it_says_so(repo):
    work, bin_dir = repo
    git(work, "rm", "-q", "resume/results.tar.gz")
    done = plan(work, bin_dir)
    assert done.returncode == 1
    assert done.stderr == "no resume/results.tar.gz here: nothing to resume\n"
