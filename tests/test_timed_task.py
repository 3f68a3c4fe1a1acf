"""kbfuse.timing.gate.TimedTask.of_job reads a timing or controls job's inputs and params by the
names their rules give them."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

from kbfuse.timing.gate import TimedTask

ROOT = Path(__file__).resolve().parents[1]


def test_a_timing_job_becomes_its_timed_task():
    job = SimpleNamespace(
        wildcards=SimpleNamespace(task="81"),
        params=SimpleNamespace(
            artifacts={"v": ("a.bin", "m.json")},
            correctness={"v": "c.json"},
            baselines=["eager", "inductor"],
        ),
        input=SimpleNamespace(baselines="b.json", checkout="kb", pin="pin.json"),
    )
    assert TimedTask.of_job(job) == TimedTask(
        task=81,
        variants={"v": ("a.bin", "m.json")},
        correctness={"v": "c.json"},
        baselines_record="b.json",
        checkout="kb",
        pin_path="pin.json",
        baselines=["eager", "inductor"],
    )


def test_both_rules_name_what_of_job_reads():
    common = (ROOT / "workflow/rules/common.smk").read_text()
    for rule in ("timing", "controls"):
        text = (ROOT / f"workflow/rules/{rule}.smk").read_text()
        block = text.split(f"rule {rule}:")[1].split("\nrule ")[0]
        for param in ("artifacts", "correctness", "baselines"):
            assert re.search(rf"^\s+{param}=", block.split("params:")[1], re.M), (rule, param)
        inputs = common.split(f"def {rule}_inputs(wildcards):")[1].split("\ndef ")[0]
        assert '"baselines": layout.record("correctness_baselines"' in inputs, rule
    tasks = common.split("def task_inputs(wildcards):")[1].split("\ndef ")[0]
    assert '"checkout"' in tasks and '"pin"' in tasks
