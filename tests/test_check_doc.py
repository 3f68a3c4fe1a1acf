"""docs/check.md's command examples: `--task-file` says where the task's file is, not which
task it is, so the example names the task too, and the message the doc quotes for a candidate
without a task is the one the command prints (issue 26: the example used to fail)."""

from __future__ import annotations

import re
from pathlib import Path

from kbfuse.workflow.cli import main

ROOT = Path(__file__).resolve().parents[1]
DOC = (ROOT / "docs/check.md").read_text()
TASK = ROOT / "tests/candidates/cpu/task53_small.py"


def test_every_task_file_example_names_its_task():
    examples = [line for line in DOC.splitlines() if line.startswith("kbfuse check ")]
    with_file = [line for line in examples if "--task-file" in line]
    assert with_file
    for line in with_file:
        assert re.search(r"--task \d+/\d+ ", line), line


def test_without_a_task_the_command_stops_with_the_message_the_doc_quotes(tmp_path, capsys):
    candidate = tmp_path / "my_kernel.py"
    good = (ROOT / "tests/candidates/cpu/good.py").read_text().splitlines()
    candidate.write_text("\n".join(line for line in good if "kbfuse-task" not in line) + "\n")
    out = tmp_path / "v.json"
    args = ["check", str(candidate), "--task-file", str(TASK), "--device", "cpu", "--out", str(out)]
    assert main(args) == 1
    err = capsys.readouterr().err
    quoted = re.search(r'"(my_kernel\.py names no task: [^"]+)"', " ".join(DOC.split())).group(1)
    assert f"{candidate} names no task: " + quoted.partition("names no task: ")[2] in err
    assert not out.exists()
