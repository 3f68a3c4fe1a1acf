"""Surveys of KernelBench levels other than 2 (`survey.level`), on the CPU, on the
KernelBench-shaped fixture (tests/survey_kbrepo.py holds tasks of levels 1 and 3): where their
files go, the task list and pins of the level, a job's record, the summary with its floor, and
what is refused."""

from __future__ import annotations

import pytest
from survey_kbrepo import LEVEL_TASK_FILES, make_survey_repo
from survey_records import record, write_records

from kbfuse import layout
from kbfuse.errors import KbfuseError
from kbfuse.io import read_json
from kbfuse.results import records
from kbfuse.results.manifest import survey_files
from kbfuse.survey import summary as s
from kbfuse.survey.job import run_survey_task
from kbfuse.survey.settings import survey_settings
from kbfuse.survey.tasks import check_tasks_at_checkout, write_task_list
from kbfuse.tasks.evaluator import write_contract
from kbfuse.tasks.kernelbench import pin_kernelbench, pin_task

SETTINGS = {"device": "cpu", "rounds": 2, "warmup": 1, "invocations_per_pair": 1, "seed": 42,
            "baselines": ["eager", "torchscript"]}  # fmt: skip


@pytest.fixture(scope="module")
def checkout(tmp_path_factory):
    root = tmp_path_factory.mktemp("levels")
    url, commit = make_survey_repo(root / "kb")
    pin_kernelbench(url, commit, 2, [53], root / "checkout", root / "checkout.json")
    write_contract(root / "checkout", root / "checkout.json", root / "contract.json")
    return root, commit


def test_level_2_keeps_its_paths_and_another_level_gets_a_folder_of_its_own():
    assert layout.survey_file("survey_record", 2, numerics="strict", survey_task=1) == (
        "results/survey/strict/tasks/1.json"
    )
    assert layout.survey_file("survey_record", 3, numerics="strict", survey_task=1) == (
        "results/survey/level3/strict/tasks/1.json"
    )
    assert layout.survey_file("survey_summary", 1) == "results/survey/level1/summary"
    assert layout.survey_file("survey_task_list", 3) == "results/survey/level3/task_list.json"
    assert layout.survey_file("survey_cache", 3) == "results/survey/.cache"  # shared
    assert layout.survey_root(3) == "survey/level3" and layout.survey_root(2) == "survey"


def test_task_list_and_pins_of_another_level(checkout, tmp_path):
    root, commit = checkout
    listing = write_task_list(
        root / "checkout", root / "checkout.json", "all", tmp_path / "l3.json", level=3
    )
    assert listing == {"commit": commit, "level": 3, "tasks": {"1": "1_MLP.py"}}
    one = write_task_list(root / "checkout", root / "checkout.json", [19], tmp_path / "l1.json", 1)
    assert one["tasks"] == {"19": "19_ReLU.py"}
    pin = pin_task(root / "checkout", root / "checkout.json", 1, tmp_path / "pin.json", level=3)
    assert pin["level"] == 3 and pin["tasks"]["1"]["path"] == "KernelBench/level3/1_MLP.py"
    with pytest.raises(KbfuseError, match=r"survey.tasks: \[7\] have no task file"):
        write_task_list(root / "checkout", root / "checkout.json", [7], tmp_path / "x.json", 3)


def test_a_level_the_checkout_lacks_is_refused_naming_the_key(checkout):
    root, commit = checkout
    config = {"kernelbench": {"commit": commit}}
    settings = survey_settings({"survey": {"level": 4}})
    with pytest.raises(KbfuseError, match="config key survey.level: 4: .* no folder"):
        check_tasks_at_checkout(settings, root / "checkout", root / "checkout.json", config)
    ok = survey_settings({"survey": {"level": 3, "tasks": [1]}})
    check_tasks_at_checkout(ok, root / "checkout", root / "checkout.json", config)


@pytest.mark.parametrize(("level", "task"), [(1, 19), (3, 1)])
def test_a_job_of_another_level_writes_its_record_and_the_summary_its_floor(
    checkout, tmp_path, level, task
):
    root, _ = checkout
    pin_task(root / "checkout", root / "checkout.json", task, tmp_path / "pin.json", level=level)
    out = tmp_path / "results" / layout.survey_root(level) / "strict" / "tasks" / f"{task}.json"
    run_survey_task(root / "checkout", tmp_path / "pin.json", survey_settings({"survey": SETTINGS}),
                    root / "contract.json", {"strict": out}, print)  # fmt: skip
    rec = records.read_record(out, "survey_task")
    assert (rec["level"], rec["file"]) == (level, LEVEL_TASK_FILES[level][task][0])
    assert rec["baselines"]["torchscript"]["correctness"]["official_pass"] is True
    summary = tmp_path / "summary"
    s.write_survey_summary({"strict": [out]}, root / "checkout", summary)
    row = read_json_rows(summary / "survey_strict.csv")[0]
    # level 1's ReLU reads its input and writes its output: 4 x 16 floats each way
    # level 3's MLP: two hidden ReLUs, each reading a GEMM's output, writing the next's input
    expected = {19: 2 * 4 * 16 * 4, 1: 2 * (2 * 4 * 16 * 4)}[task]
    assert row["floor_bytes"] == expected


def read_json_rows(path):
    import pandas as pd

    return pd.read_csv(path).to_dict("records")


def test_records_of_two_levels_are_not_summarised_together(tmp_path):
    other = record(task=1)
    other["level"] = 3
    paths = write_records(tmp_path / "results", [record(), other])
    with pytest.raises(KbfuseError, match=r"survey records of levels \[2, 3\] in one summary"):
        s.write_survey_summary(paths, None, tmp_path / "o")


def test_the_manifest_lists_every_levels_survey(tmp_path):
    for rel in ("survey/strict/tasks/1.json", "survey/level3/strict/tasks/1.json",
                "survey/level3/summary/survey_strict.csv", "survey/summary/survey_strict.md",
                "survey/level3/pins/1.json", "survey/floors/1.json",
                "survey/level3/floors/1.json"):  # fmt: skip
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("{}")
    assert survey_files(tmp_path) == [
        "survey/floors/1.json",
        "survey/level3/floors/1.json",
        "survey/level3/strict/tasks/1.json",
        "survey/level3/summary/survey_strict.csv",
        "survey/strict/tasks/1.json",
        "survey/summary/survey_strict.md",
    ]


def test_the_anchor_is_read_for_the_surveyed_level(tmp_path):
    from kbfuse.io import write_json
    from kbfuse.survey import anchor

    folder = tmp_path / "results" / "timing" / "H100_Modal"
    entry = {"mean": 2.0, "hardware": "NVIDIA H100 80GB HBM3"}
    for name in anchor.FILES.values():
        write_json(folder / name, {"level2": {}, "level3": {"1_MLP.py": entry}})
    got = anchor.read_anchor(tmp_path, ["1_MLP.py"], level=3)
    assert got["baselines"]["eager"]["1_MLP.py"]["mean_ms"] == 2.0 and got["missing"] == []
    assert read_json(folder / "baseline_time_torch.json")["level3"]
