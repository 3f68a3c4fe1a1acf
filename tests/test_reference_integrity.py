"""Issue 5: the committed H200 reference run (results/reference/h200) is intact and checkable.

The bundle verifies with the `kbfuse` command; every file the manifest lists matches its
sha256 in the tree, and a change to any one of them (in a copy) is caught; every record of a
stage that compiles or loads device code says the CUDA compute cache was isolated (issue 7);
and the summary refuses a result whose provenance no longer matches its artifact.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from conftest import ROOT

from kbfuse.errors import KbfuseError
from kbfuse.io import read_json, sha256_file, write_json
from kbfuse.results.bundle import MANIFEST_MEMBER
from kbfuse.results.manifest import verify_manifest
from kbfuse.results.study import check_provenance, load_results
from kbfuse.results.summary import build_tables

REF = ROOT / "results/reference/h200"
BUNDLE = REF / "bundle/kbfuse-results.tar.gz"
MANIFEST = read_json(REF / "manifest.json")
LISTED = sorted(MANIFEST["files"])
CONFIG = MANIFEST["config"]
# Stages whose job compiles or loads device code (docs/contracts.md: "cuda_cache").
CUDA_STAGES = ("compile", "verify", "correctness", "timing", "controls", "env")
# Files in the reference tree that are not results of the study (so not in the manifest).
# survey/*: the reference survey, a run of its own with its own manifest (test_survey_reference)
NOT_LISTED = ("manifest.json", "bundle/*", "logs/*", "benchmarks/*", "kernelbench/checkout.json",
              "kernelbench/tasks/*", "gpu.txt", "phases.txt", "survey/*",
              "fused2/*")  # fmt: skip


def kbfuse_command() -> list[str]:
    script = Path(sys.executable).with_name("kbfuse")
    return [str(script)] if script.exists() else [sys.executable, "-m", "kbfuse.workflow.cli"]


def test_reference_bundle_verifies_and_names_the_gpu():
    proc = subprocess.run(
        [*kbfuse_command(), "verify-bundle", str(BUNDLE)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    gpu = MANIFEST["fingerprint"]["gpu"]["name"]
    assert gpu == "NVIDIA H200"
    assert f"produced on: GPU {gpu}, driver " in proc.stdout
    assert f"files listed in manifest: {len(LISTED)}" in proc.stdout
    assert "OK: every file matches the manifest" in proc.stdout
    assert MANIFEST["kernelbench_pin"]["commit"] in proc.stdout
    # The bundle carries the same manifest as the committed tree.
    with tarfile.open(BUNDLE, "r:gz") as tar:
        inside = tar.extractfile(MANIFEST_MEMBER).read()
    assert inside == (REF / "manifest.json").read_bytes()


def test_every_listed_file_matches_its_sha256():
    # the H200 run of 2026-12-01 (docs/device-runs.md) and its official contract, read from the
    # pin later (tools/reference_report.py --aggregates --kernelbench)
    assert len(LISTED) == 121
    report = verify_manifest(REF, REF / "manifest.json", ignore=NOT_LISTED)
    assert report["ok"], report
    assert report["checked"] == len(LISTED)
    assert report["changed"] == report["missing"] == report["extra"] == []
    assert report["manifest_problems"] == []
    for rel in LISTED:  # the same, by hand
        assert sha256_file(REF / rel) == MANIFEST["files"][rel]["sha256"], rel


@pytest.fixture(scope="module")
def ref_copy(tmp_path_factory) -> Path:
    """The manifest and every file it lists, copied."""
    root = tmp_path_factory.mktemp("reference")
    for rel in [*LISTED, "manifest.json"]:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REF / rel, root / rel)
    return root


def test_any_one_changed_or_missing_file_is_detected(ref_copy):
    def check():
        return verify_manifest(ref_copy, ref_copy / "manifest.json", ignore=["manifest.json"])

    assert check()["ok"]
    caught = 0
    for rel in LISTED:
        path = ref_copy / rel
        original = path.read_bytes()
        try:
            # One bit flipped in the middle: same size, so only the sha256 can tell.
            flipped = bytearray(original)
            flipped[len(flipped) // 2] ^= 0x01
            path.write_bytes(bytes(flipped))
            report = check()
            assert not report["ok"]
            assert [c["path"] for c in report["changed"]] == [rel]
            assert report["changed"][0]["actual_bytes"] == report["changed"][0]["expected_bytes"]
            assert report["missing"] == report["extra"] == []
            path.unlink()
            report = check()
            assert not report["ok"] and report["missing"] == [rel] and report["changed"] == []
            caught += 2
        finally:
            path.write_bytes(original)
    assert caught == 2 * len(LISTED)
    assert check()["ok"]


def _cuda_records() -> list[str]:
    return sorted(
        p.relative_to(REF).as_posix()
        for stage in CUDA_STAGES
        for p in (REF / stage).rglob("*.json")
    )


def test_every_device_stage_record_says_the_cuda_cache_was_isolated():
    records = _cuda_records()
    # per variant: compile + verify + one correctness per task; per task: baselines, timing,
    # controls; then witness81 + env
    variants, tasks = len(CONFIG["variants"]), len(CONFIG["tasks"])
    assert len(records) == variants * (2 + tasks) + 3 * tasks + 2 == 66
    assert set(records) <= set(LISTED)
    for rel in records:
        cache = read_json(REF / rel).get("cuda_cache")
        assert isinstance(cache, dict), f"{rel} has no cuda_cache record"
        assert cache["isolated"] is True, rel
        assert cache["CUDA_CACHE_DISABLE"] == "1", rel
        assert cache["CUDA_CACHE_PATH"] == "private-empty", rel


def test_reference_summary_builds_from_the_committed_results():
    tables = build_tables(REF, CONFIG)
    assert len(tables["correctness"]) == len(CONFIG["tasks"]) * len(CONFIG["variants"]) == 33


CORRECTNESS = sorted(
    rel for rel in LISTED if rel.startswith("correctness/") and not rel.endswith("baselines.json")
)


def test_summary_refuses_a_correctness_file_with_a_foreign_artifact(tmp_path, ref_copy):
    """End to end, on one file: build_tables names the file, the field and both hashes."""
    rel = CORRECTNESS[0]
    root = tmp_path / "results"
    shutil.copytree(ref_copy, root)
    data = read_json(root / rel)
    recorded = data["provenance"]["artifact_sha256"]
    data["provenance"]["artifact_sha256"] = "0" * 64
    write_json(root / rel, data)
    variant, task = Path(rel).stem, int(Path(rel).parent.name)
    assert recorded == read_json(root / f"compile/{variant}/meta.json")["artifact_sha256"]
    with pytest.raises(KbfuseError, match="provenance.artifact_sha256") as info:
        build_tables(root, {**CONFIG, "tasks": [task]})
    message = str(info.value)
    assert str(root / rel) in message
    assert "0" * 64 in message and recorded in message


@pytest.fixture(scope="module")
def loaded():
    """The reference's results as the summary reads them (provenance checked once)."""
    return load_results(REF, CONFIG)


@pytest.mark.parametrize("rel", CORRECTNESS)
def test_provenance_refuses_each_correctness_file_with_a_foreign_artifact(loaded, rel):
    """Every one of the 33 correctness records is checked against its variant's artifact (the
    check build_tables runs after reading, here on the records read once)."""
    assert len(CORRECTNESS) == 33
    variant, task = Path(rel).stem, int(Path(rel).parent.name)
    provenance = loaded.correctness[(task, variant)]["provenance"]
    recorded = provenance["artifact_sha256"]
    assert recorded == loaded.compile_meta[variant]["artifact_sha256"]
    provenance["artifact_sha256"] = "0" * 64
    try:
        with pytest.raises(KbfuseError, match="provenance.artifact_sha256") as info:
            check_provenance(loaded)
    finally:
        provenance["artifact_sha256"] = recorded
    message = str(info.value)
    assert str(REF / rel) in message
    assert "0" * 64 in message and recorded in message
