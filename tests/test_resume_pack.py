"""tools/resume-pack.sh: a returned results archive made into `resume/results.tar.gz`, the
tracked pack the next device call resumes from: no file of KernelBench's, of the repository's
own reference or of the witness cache in it, and the paths asked for left out, so that their
jobs run again, as are an audit's checks refused on that machine."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from survey_kbrepo import make_survey_repo

from kbfuse.tasks.kernelbench import pin_kernelbench

ROOT = Path(__file__).resolve().parents[1]
TOOL = ROOT / "tools" / "resume-pack.sh"
VERDICTS = "results/audit/l1/verdicts/kernelbench-defaults"
REFUSED = f"{VERDICTS}/l2_t91_2c842d97.json"
CHECKED = f"{VERDICTS}/l2_t10_f2252269.json"


@pytest.fixture(scope="module")
def returned(tmp_path_factory):
    """The archive a device call returns: results (a KernelBench checkout, the reference and
    the witness cache among them) and .snakemake."""
    root = tmp_path_factory.mktemp("resume")
    url, commit = make_survey_repo(root / "kb")
    work = root / "work"
    work.mkdir()
    made = root / "made"
    record = made / "results/kernelbench/checkout.json"
    pin_kernelbench(url, commit, 2, [53, 1], made / "results/kernelbench/checkout", record)
    archive = root / "results.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(record, "results/kernelbench/checkout.json")
        for path, text in {
            "results/survey/strict/tasks/53.json": "{}",
            "results/survey/strict/tasks/1.json": "{}",
            ".snakemake/metadata/x": "{}",
            "results/reference/h200/gpu.txt": "tracked in git",
            "results/check/witness-cache/w/w.so": "built again on demand",
            "results/kernelbench/checkout/KernelBench/level2/53_x.py": "KernelBench's",
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
    archive = work / "resume" / "results.tar.gz"
    return archive.read_bytes() if archive.exists() else None


def test_the_pack_holds_no_kernelbench_reference_or_cache_file_and_left_out_paths_go(returned):
    work, archive, _ = returned
    done = _pack(work, str(archive), "results/survey/strict/tasks/1.json")
    assert done.returncode == 0, done.stderr
    assert "left out: results/survey/strict/tasks/1.json" in done.stdout
    with tarfile.open(work / "resume" / "results.tar.gz") as tar:
        names = set(tar.getnames())
    assert "results/kernelbench/checkout.json" in names  # the pin record stays
    assert not [n for n in names if n.startswith("results/kernelbench/checkout/")]
    assert not [n for n in names if n.startswith("results/reference")]
    assert not [n for n in names if n.startswith("results/check/witness-cache")]
    assert "results/survey/strict/tasks/53.json" in names
    assert "results/survey/strict/tasks/1.json" not in names
    assert ".snakemake/metadata/x" in names
    assert not (work / "resume" / "results.tar.gz.tmp").exists()


def test_a_path_the_archive_lacks_is_refused_and_nothing_is_written(returned):
    work, archive, _ = returned
    before = _resume_archive(work)
    done = _pack(work, str(archive), "results/survey/strict/tasks/7.json")
    assert done.returncode == 1
    assert "has no results/survey/strict/tasks/7.json" in done.stderr
    assert _resume_archive(work) == before


def test_an_archive_without_a_pin_record_is_refused_and_nothing_is_written(tmp_path):
    archive = tmp_path / "results.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        info = tarfile.TarInfo("results/survey/strict/tasks/53.json")
        info.size = 2
        tar.addfile(info, io.BytesIO(b"{}"))
    done = _pack(tmp_path, str(archive))
    assert done.returncode == 1
    assert "has no results/kernelbench/checkout.json" in done.stderr
    assert not (tmp_path / "resume").exists()


def test_an_audit_check_refused_on_that_machine_is_left_out_and_a_verdict_stays(returned):
    work, archive, _ = returned
    done = _pack(work, str(archive))
    assert done.returncode == 0, done.stderr
    assert f"left out (refused on that machine, checked again): {REFUSED}" in done.stdout
    with tarfile.open(work / "resume" / "results.tar.gz") as tar:
        names = set(tar.getnames())
    assert REFUSED not in names
    assert CHECKED in names
    assert "results/survey/strict/tasks/1.json" in names
