"""Issue 5: SIGKILL the CPU part of the workflow at five places; every rerun completes,
no partial file is taken for complete, and the results equal an uninterrupted run."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from conftest import ROOT, copy_workflow, write_test_config
from interrupt import kill_at, snakemake_run

from kbfuse.io import read_json, sha256_file

# The two variants the kill points name, one per route: these tests run the CPU part nine
# times, and every other variant would only add compiles of the same kind (test_workflow.py
# and test_toolchains.py compile them all).
VARIANTS = ["nvrtc-cubin-ftz", "nvrtc-ptx-ftz"]
STUDY = {"tasks": [53, 81], "nvrtc_versions": []}


def _stable(workdir):
    """What a run decides: the pin, each artifact and its metadata, the direction witness."""
    out = {"pin": read_json(workdir / "results/kernelbench/pin.json")}
    for v in VARIANTS:
        meta = read_json(workdir / f"results/compile/{v}/meta.json")
        out[v] = (meta["artifact_sha256"], meta["expected_ftz"], meta["ptx_ftz_count"])
        assert sha256_file(workdir / f"results/compile/{v}/tails.bin") == meta["artifact_sha256"]
    witness = read_json(workdir / "results/protocol/direction_witness.json")
    out["witness"] = (witness["a_bits"], witness["b_bits"], witness["allclose_a_b"])
    return out


@pytest.fixture(scope="module")
def reference(tmp_path_factory, kb_repo):
    workdir = copy_workflow(tmp_path_factory.mktemp("uninterrupted"), VARIANTS)
    overlay = write_test_config(workdir, *kb_repo, **STUDY)
    snakemake_run(workdir, "cpu", "--configfile", str(overlay))
    assert sorted(p.name for p in (workdir / "results/compile").iterdir()) == sorted(VARIANTS)
    return _stable(workdir)


POINTS = {
    "mid-clone": "clone:*",
    "mid-compile": "compile:nvrtc-ptx-ftz",
    "mid-write": "write:*nvrtc-cubin-ftz/meta.json",
    "between-jobs": "job-end:kernelbench_pin",
}


@pytest.mark.parametrize("point", POINTS.values(), ids=POINTS.keys())
def test_killed_cpu_run_reruns_to_the_same_results(tmp_path, kb_repo, reference, point):
    workdir = copy_workflow(tmp_path / "wf", VARIANTS)
    overlay = write_test_config(workdir, *kb_repo, **STUDY)
    kill_at(workdir, point, tmp_path / "marker", "cpu", "--configfile", str(overlay))
    leftovers = list((workdir / "results").rglob(".*.tmp"))
    if point.startswith("write"):
        assert leftovers, "the kill should have hit between temp file and rename"
        assert not (workdir / "results/compile/nvrtc-cubin-ftz/meta.json").exists()
    if point.startswith("compile"):  # artifact on disk, metadata not: the job is incomplete
        assert (workdir / "results/compile/nvrtc-ptx-ftz/tails.bin").exists()
        assert not (workdir / "results/compile/nvrtc-ptx-ftz/meta.json").exists()
    snakemake_run(workdir, "cpu", "--configfile", str(overlay))
    assert _stable(workdir) == reference


_SUMMARY = """
import sys, yaml
from kbfuse.results.summary import write_summary
cfg = yaml.safe_load(open(sys.argv[2]))
write_summary(sys.argv[1], cfg, sys.argv[3])
"""


def test_killed_summary_leaves_no_partial_table_and_reruns_identically(tmp_path):
    results = ROOT / "results/reference/h200"
    config = ROOT / "config/config.yaml"
    args = [sys.executable, "-c", _SUMMARY, str(results), str(config)]
    subprocess.run([*args, str(tmp_path / "clean")], check=True, timeout=300)
    marker = tmp_path / "m"
    env = dict(os.environ, KBFUSE_PAUSE_AT="summary:timing_full", KBFUSE_PAUSE_MARKER=str(marker))
    proc = subprocess.Popen([*args, str(tmp_path / "cut")], env=env, start_new_session=True)
    while not marker.exists():
        assert proc.poll() is None
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    written = [p.name for p in (tmp_path / "cut").iterdir()]
    clean = {p.name: p.read_bytes() for p in (tmp_path / "clean").iterdir()}
    # tables are staged in a hidden directory: no table or plot is in place before all are
    assert len(written) == 1 and written[0].startswith(".partial-")
    subprocess.run([*args, str(tmp_path / "cut")], check=True, timeout=300)
    assert {p.name: p.read_bytes() for p in (tmp_path / "cut").iterdir()} == clean
