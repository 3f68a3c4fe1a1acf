"""Issue 5 on the GPU: SIGKILL a GPU stage mid-run; the rerun completes and classifies alike."""

from __future__ import annotations

import pytest
import yaml
from conftest import copy_workflow, write_test_config
from interrupt import kill_at, snakemake_run

from kbfuse.io import read_json

pytestmark = pytest.mark.gpu

TARGET = "results/correctness/81/nvrtc-ptx-noftz.json"


def _workflow(root, kb_repo):
    workdir = copy_workflow(root)
    overlay = write_test_config(workdir, *kb_repo, tasks=[81], arch="auto", seeds=[0, 1])
    cfg = yaml.safe_load(overlay.read_text())
    cfg["variants"] = {
        "nvrtc-ptx-noftz": {
            "route": "nvrtc-ptx",
            "options": ["--std=c++11", "--fmad=false", "--ftz=false"],
        }
    }
    overlay.write_text(yaml.safe_dump(cfg))
    return workdir, overlay


def _classification(path):
    record = read_json(path)
    return (
        record["passed"],
        record["failing_checks"],
        [(c["name"], c["official_pass"], c["bit_equal"]) for c in record["cases"]],
    )


def test_killed_correctness_job_reruns_to_the_same_classification(tmp_path, kb_repo):
    clean, clean_cfg = _workflow(tmp_path / "clean", kb_repo)
    snakemake_run(clean, TARGET, "--configfile", str(clean_cfg))

    cut, cut_cfg = _workflow(tmp_path / "cut", kb_repo)
    kill_at(cut, "correctness:seed1/*", tmp_path / "marker", TARGET, "--configfile", str(cut_cfg))
    assert not (cut / TARGET).exists(), "a killed job left its result behind"
    snakemake_run(cut, TARGET, "--configfile", str(cut_cfg))
    assert _classification(cut / TARGET) == _classification(clean / TARGET)
