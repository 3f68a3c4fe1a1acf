"""tools/resume-unpack.sh: a resume archive unpacked once per machine, its files' times set to
now, so that a resumed Snakemake run redoes only the jobs whose outputs the archive lacks, even
when a source file the records depend on has changed since (snakemake/snakemake#2328)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TOOL = ROOT / "tools" / "resume-unpack.sh"
RESUME_TRIGGERS = ["--rerun-triggers", "params", "input", "software-env"]

SNAKEFILE = """\
rule all:
    input:
        expand("results/{task}.txt", task=["a", "b"]),


rule record:
    input:
        "src/code.py",
    output:
        "results/{task}.txt",
    shell:
        "cat {input} > {output}"
"""


def _snakemake(work: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "snakemake", "--cores", "1", *args],
        cwd=work,
        capture_output=True,
        text=True,
    )


def _planned(work: Path) -> set[str]:
    """The outputs of the jobs a dry run of the resumed run would run."""
    done = _snakemake(work, "--dry-run", "all", *RESUME_TRIGGERS)
    assert done.returncode == 0, done.stderr
    log = done.stdout + done.stderr
    return {m.group(1) for m in re.finditer(r"^\s+output: (\S+)$", log, re.MULTILINE)}


def _unpack(work: Path, archive: Path, marker: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(TOOL), str(archive), str(marker)], cwd=work, capture_output=True, text=True
    )


@pytest.fixture
def returned(tmp_path):
    """A run on one machine (two records) packed without record b, as resume-pack.sh leaves a
    path out; then a fresh working tree on another machine, its source changed since."""
    first = tmp_path / "first"
    (first / "src").mkdir(parents=True)
    (first / "Snakefile").write_text(SNAKEFILE)
    (first / "src" / "code.py").write_text("print('made by the first commit')\n")
    done = _snakemake(first, "all")
    assert done.returncode == 0, done.stderr
    made = time.time() - 3600  # an hour before this call, on the machine that ended
    os.utime(first / "results" / "a.txt", (made, made))
    archive = tmp_path / "results.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(first / "results" / "a.txt", "results/a.txt")
        tar.add(first / ".snakemake", ".snakemake")
    fresh = tmp_path / "fresh"
    (fresh / "src").mkdir(parents=True)
    shutil.copy(first / "Snakefile", fresh / "Snakefile")
    (fresh / "src" / "code.py").write_text("print('changed by a later commit')\n")
    copied = time.time() - 60  # the working tree is copied at the call's start
    os.utime(fresh / "src" / "code.py", (copied, copied))
    return fresh, archive, tmp_path / "marker"


def test_a_resumed_run_redoes_only_the_records_the_archive_lacks(returned):
    work, archive, marker = returned
    done = _unpack(work, archive, marker)
    assert done.returncode == 0, done.stderr
    assert "unpacked" in done.stdout
    assert (work / "results" / "a.txt").read_text() == "print('made by the first commit')\n"
    assert _planned(work) == {"results/b.txt"}


def test_a_working_tree_written_within_the_same_second_is_still_older(returned):
    """The files' one time is now to the nanosecond: a source file written a moment before,
    within the same second, must not look newer than the records (a whole-second time did:
    every record of the changed source would be redone)."""
    work, archive, marker = returned
    while time.time() % 1 > 0.2:  # early in a second, so the unpacking most likely ends in it
        time.sleep(0.01)
    written = time.time()
    os.utime(work / "src" / "code.py", (written, written))
    assert _unpack(work, archive, marker).returncode == 0
    assert _planned(work) == {"results/b.txt"}


def test_plain_unpacking_would_redo_every_record_the_changed_source_made(returned):
    work, archive, _ = returned
    with tarfile.open(archive) as tar:
        tar.extractall(work, filter="data")
    assert _planned(work) == {"results/a.txt", "results/b.txt"}


def test_a_second_call_on_the_same_machine_leaves_the_running_jobs_files_alone(returned):
    work, archive, marker = returned
    assert _unpack(work, archive, marker).returncode == 0
    (work / "results" / "a.txt").write_text("written by the run still going\n")
    done = _unpack(work, archive, marker)
    assert done.returncode == 0, done.stderr
    assert "already unpacked on this machine" in done.stdout
    assert (work / "results" / "a.txt").read_text() == "written by the run still going\n"


def test_an_archive_that_cannot_be_read_stops_it_without_a_marker(returned, tmp_path):
    work, _, marker = returned
    broken = tmp_path / "broken.tar.gz"
    broken.write_bytes(b"not an archive")
    done = _unpack(work, broken, marker)
    assert done.returncode != 0
    assert not marker.exists()


@pytest.fixture
def pinned_pack(tmp_path):
    """A pack as tools/resume-pack.sh makes it: the pin record and a record, no checkout; and a
    fresh working tree carrying the KernelBench repository as .kb/KernelBench.git."""
    from kbrepo import git
    from survey_kbrepo import make_survey_repo

    from kbfuse.tasks.kernelbench import pin_kernelbench

    url, commit = make_survey_repo(tmp_path / "kb")
    made = tmp_path / "made"
    record = made / "results" / "kernelbench" / "checkout.json"
    pin_kernelbench(url, commit, 2, [53, 1], made / "results" / "kernelbench" / "checkout", record)
    (made / "results" / "survey.json").write_text("{}")
    archive = tmp_path / "pack.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(record, "results/kernelbench/checkout.json")
        tar.add(made / "results" / "survey.json", "results/survey.json")
    work = tmp_path / "work"
    (work / ".kb").mkdir(parents=True)
    git(tmp_path, "clone", "-q", "--bare", url, str(work / ".kb" / "KernelBench.git"))
    return work, archive, json.loads(record.read_text())


def test_the_checkout_is_made_again_at_the_pin_with_the_packs_time(pinned_pack, tmp_path):
    work, archive, record = pinned_pack
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    done = subprocess.run(
        ["bash", str(TOOL), str(archive), str(tmp_path / "marker")],
        cwd=work, env=env, capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    checkout = work / "results" / "kernelbench" / "checkout"
    task = checkout / record["tasks"]["53"]["path"]
    assert task.is_file()
    git_head = ["git", "-C", str(checkout), "rev-parse", "HEAD"]
    head = subprocess.run(git_head, capture_output=True, text=True).stdout.strip()
    assert head == record["commit"]
    # the pack's record is kept as it was, and every file has the unpacking's one time
    pinned = work / "results" / "kernelbench" / "checkout.json"
    assert json.loads(pinned.read_text()) == record
    times = {p.stat().st_mtime for p in (task, checkout, pinned, work / "results" / "survey.json")}
    assert len(times) == 1


def test_without_the_carried_kernelbench_it_says_what_to_carry_and_unpacks_nothing(
    pinned_pack, tmp_path
):
    work, archive, _ = pinned_pack
    shutil.rmtree(work / ".kb")
    done = _unpack(work, archive, tmp_path / "marker")
    assert done.returncode == 1
    assert "no .kb/KernelBench.git" in done.stderr and "carry .kb" in done.stderr
    assert not (work / "results").exists()
    assert not (tmp_path / "marker").exists()
