"""tools/resume-pack.sh: a returned results archive made into `.resume/results.tar.gz` for the
next device call, with the KernelBench checkout made again at the pin (its times the pin
record's) and the paths asked for left out, so that their jobs run again, as are an audit's
checks refused on that machine."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from kbrepo import git
from survey_kbrepo import make_survey_repo

from kbfuse.tasks.kernelbench import pin_kernelbench

ROOT = Path(__file__).resolve().parents[1]
TOOL = ROOT / "tools" / "resume-pack.sh"
RECORD_TIME = 1_700_000_000
VERDICTS = "results/audit/l1/verdicts/kernelbench-defaults"
REFUSED = f"{VERDICTS}/l2_t91_2c842d97.json"
CHECKED = f"{VERDICTS}/l2_t10_f2252269.json"


@pytest.fixture(scope="module")
def returned(tmp_path_factory):
    """A checkout of a KernelBench-shaped repository carried as .kb/KernelBench.git, and the
    archive a device call returns: results (without the checkout) and .snakemake."""
    root = tmp_path_factory.mktemp("resume")
    url, commit = make_survey_repo(root / "kb")
    work = root / "work"
    (work / ".kb").mkdir(parents=True)
    git(root, "clone", "-q", "--bare", url, str(work / ".kb" / "KernelBench.git"))
    made = root / "made"
    record = made / "results/kernelbench/checkout.json"
    pin_kernelbench(url, commit, 2, [53, 1], made / "results/kernelbench/checkout", record)
    os.utime(record, (RECORD_TIME, RECORD_TIME))
    archive = root / "results.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(record, "results/kernelbench/checkout.json")
        for path, text in {
            "results/survey/strict/tasks/53.json": "{}",
            "results/survey/strict/tasks/1.json": "{}",
            ".snakemake/metadata/x": "{}",
            REFUSED: json.dumps({"kind": "check_refused", "verdict": "not checked"}),
            CHECKED: json.dumps({"kind": "check_candidate", "verdict": "fail"}),
        }.items():
            data = text.encode()
            info = tarfile.TarInfo(path)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return work, archive, json.loads(record.read_text())


def _pack(work: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    return subprocess.run(
        ["bash", str(TOOL), *args], cwd=work, env=env, capture_output=True, text=True
    )


def _resume_archive(work: Path) -> bytes | None:
    archive = work / ".resume" / "results.tar.gz"
    return archive.read_bytes() if archive.exists() else None


def test_the_checkout_is_made_again_with_the_pin_records_time_and_left_out_paths_go(returned):
    work, archive, record = returned
    done = _pack(work, str(archive), "results/survey/strict/tasks/1.json")
    assert done.returncode == 0, done.stderr
    assert "left out: results/survey/strict/tasks/1.json" in done.stdout
    with tarfile.open(work / ".resume" / "results.tar.gz") as tar:
        members = {m.name: m for m in tar.getmembers()}
    task = "results/kernelbench/checkout/" + record["tasks"]["53"]["path"]
    assert task in members and members[task].mtime == RECORD_TIME
    assert members["results/kernelbench/checkout"].mtime == RECORD_TIME
    assert "results/survey/strict/tasks/53.json" in members
    assert "results/survey/strict/tasks/1.json" not in members
    assert ".snakemake/metadata/x" in members
    assert not (work / ".resume" / "results.tar.gz.tmp").exists()


def test_a_path_the_archive_lacks_is_refused_and_nothing_is_written(returned):
    work, archive, _ = returned
    before = _resume_archive(work)
    done = _pack(work, str(archive), "results/survey/strict/tasks/7.json")
    assert done.returncode == 1
    assert "has no results/survey/strict/tasks/7.json" in done.stderr
    assert _resume_archive(work) == before


def test_without_the_carried_kernelbench_it_says_what_to_run(returned, tmp_path):
    _, archive, _ = returned
    done = _pack(tmp_path, str(archive))
    assert done.returncode == 1
    assert "no .kb/KernelBench.git: run tools/device-carry.sh" in done.stderr


def test_an_audit_check_refused_on_that_machine_is_left_out_and_a_verdict_stays(returned):
    work, archive, _ = returned
    done = _pack(work, str(archive))
    assert done.returncode == 0, done.stderr
    assert f"left out (refused on that machine, checked again): {REFUSED}" in done.stdout
    with tarfile.open(work / ".resume" / "results.tar.gz") as tar:
        names = set(tar.getnames())
    assert REFUSED not in names
    assert CHECKED in names
    assert "results/survey/strict/tasks/1.json" in names
