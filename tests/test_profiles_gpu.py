"""Every rule that shares the GPU on one machine (`gpu_jobs=1`) asks the Slurm profile for a
GPU of its own: on a cluster each job is its own sbatch, and `gpu_jobs` means nothing there."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def _rules_declaring(resource: str) -> set[str]:
    found = set()
    for path in (ROOT / "workflow/rules").glob("*.smk"):
        for block in re.split(r"^(?=rule )", path.read_text(), flags=re.M):
            name = re.match(r"rule (\w+):", block)
            if name and re.search(rf"^\s+{resource}=1,$", block, flags=re.M):
                found.add(name.group(1))
    return found


def test_every_gpu_sharing_rule_gets_a_gpu_on_slurm():
    sharing = _rules_declaring("gpu_jobs")
    assert sharing == {
        "audit_candidate",
        "check_candidate",
        "correctness_baselines",
        "correctness_variants",
        "survey_task",
        "verify_variants",
    }
    resources = yaml.safe_load((ROOT / "profiles/slurm/config.yaml").read_text())
    assert {rule: resources["set-resources"][rule].get("gpu") for rule in sharing} == dict.fromkeys(
        sharing, 1
    )
