"""Switching the pin to a KernelBench whose evaluator has another tolerance changes every judge
at once: the workflow's contract record is read from the new pin, and the jobs that judge with
it rerun with its tolerance (here the direction witness, a CPU job; the study's correctness and
controls, the survey and the check read the same record)."""

from __future__ import annotations

import json

from conftest import copy_workflow, snakemake, write_test_config
from kbrepo import commit_files, evaluator_files, make_kernelbench_repo

TARGETS = ("results/kernelbench/contract.json", "results/protocol/direction_witness.json")


def test_a_pin_with_another_tolerance_changes_the_judges(tmp_path):
    url, pinned = make_kernelbench_repo(tmp_path / "kb")
    evaluator = "src/kernelbench/eval.py"
    v01 = {evaluator: evaluator_files(tolerance="1e-2")[evaluator]}
    older = commit_files(tmp_path / "kb", v01, "An evaluator with v0.1's tolerance")
    workdir = copy_workflow(tmp_path / "wf")
    read = {}
    for commit in (pinned, older, pinned):
        overlay = write_test_config(workdir, url, commit)
        snakemake(workdir, "--cores", "1", *TARGETS, "--configfile", str(overlay))
        contract, witness = (json.loads((workdir / t).read_text()) for t in TARGETS)
        assert contract["commit"] == commit
        assert (witness["atol"], witness["rtol"]) == (contract["atol"], contract["rtol"])
        read[commit] = contract["atol"]
    assert read == {pinned: 1e-4, older: 1e-2}
