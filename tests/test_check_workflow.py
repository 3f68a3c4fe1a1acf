"""kbfuse check as Snakemake jobs (workflow/rules/check.smk) and as `kbfuse check`, on the CPU
fixture: one job per candidate file, its task from the file's kbfuse-task line, the task file
from the pinned checkout of the test KernelBench repository; settings and task lines checked
before any job; the summary table and plot; the command's exit status."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml
from conftest import copy_workflow, snakemake, write_test_config
from contracts import contract_record

from kbfuse.candidates.summary import write_summary
from kbfuse.io import write_json
from kbfuse.workflow.cli import main

FIXTURE = Path(__file__).parent / "candidates" / "cpu"
SMALL = {
    "official_trials": 2,
    "seeds": [0],
    "distributions": ["uniform"],
    "baselines": ["eager"],
    "time_limit_s": 120,
    "timing": {"warmup": 1, "rounds": 2, "invocations_per_pair": 1},
}


def _overlay(workdir: Path, kb_repo, **check) -> Path:
    return write_test_config(workdir, *kb_repo, check={"folder": "candidates", **SMALL, **check})


@pytest.fixture(scope="module")
def check_run(tmp_path_factory, kb_repo):
    workdir = copy_workflow(tmp_path_factory.mktemp("check-run"))
    folder = workdir / "candidates"
    folder.mkdir()
    for name in ("good", "wrong"):
        shutil.copy(FIXTURE / f"{name}.py", folder / f"{name}.py")
    overlay = _overlay(workdir, kb_repo)
    snakemake(workdir, "--cores", "1", "check", "--configfile", str(overlay))
    return workdir, overlay


def test_one_verdict_per_candidate_with_the_task_of_its_line(check_run, kb_repo):
    workdir, _ = check_run
    good = json.loads((workdir / "results/check/good.json").read_text())
    wrong = json.loads((workdir / "results/check/wrong.json").read_text())
    assert good["verdict"] == "pass" and wrong["verdict"] == "fail"
    assert good["task"]["task"] == 53 and good["task"]["file"].startswith("53_")
    assert good["task"]["commit"] == kb_repo[1]  # the pinned commit, read from the checkout
    assert good["settings"]["official_trials"] == 2
    # the job's GPU lock, held for the candidate, was handed to it alone before its guards
    assert "kbfuse check: the GPU alone" in good["processes"]["candidate"]["log_tail"]
    assert (workdir / "results/logs/check/good.candidate.log").is_file()
    assert (workdir / "results/logs/check/good.reference.log").is_file()


def test_the_summary_lists_every_verdict(check_run):
    workdir, _ = check_run
    table = pd.read_csv(workdir / "results/check/summary/table.csv")
    assert list(table["candidate"]) == ["good.py", "wrong.py"]
    assert list(table["verdict"]) == ["pass", "fail"]
    assert table.loc[1, "failed_checks"].split()[0] == "official"
    assert table.loc[0, "official_passed"] == "2/2"
    assert "| good.py " in (workdir / "results/check/summary/table.md").read_text()
    png = (workdir / "results/check/summary/speedup.png").read_bytes()
    assert png.startswith(b"\x89PNG")


def test_a_new_candidate_runs_alone(check_run):
    workdir, overlay = check_run
    shutil.copy(FIXTURE / "lazy.py", workdir / "candidates" / "lazy.py")
    try:
        dry = snakemake(workdir, "-n", "--cores", "1", "check", "--configfile", str(overlay))
    finally:
        (workdir / "candidates" / "lazy.py").unlink()
    assert dry.stdout.count("rule check_candidate:") == 1
    assert "results/check/lazy.json" in dry.stdout
    assert "results/check/good.json" not in dry.stdout.split("rule check_summary")[0]


def test_settings_are_checked_before_any_job(tmp_path, kb_repo):
    workdir = copy_workflow(tmp_path / "wf")
    (workdir / "candidates").mkdir()
    overlay = _overlay(workdir, kb_repo, seeds=[])
    proc = snakemake(workdir, "-n", "check", "--configfile", str(overlay), check=False)
    assert proc.returncode != 0
    assert "config key check.seeds: [] is invalid: [] should be non-empty" in proc.stderr
    assert not (workdir / "results").exists()


def test_bad_check_values_are_refused_by_key(tmp_path, kb_repo):
    workdir = copy_workflow(tmp_path / "wf")
    overlay = _overlay(workdir, kb_repo, distributions=["uniform", "uniform"], timing={"rounds": 0})
    proc = snakemake(workdir, "-n", "check", "--configfile", str(overlay), check=False)
    assert proc.returncode != 0
    assert "config key check.timing.rounds: 0 is invalid" in proc.stderr
    overlay = _overlay(workdir, kb_repo, witness_cache="")
    proc = snakemake(workdir, "-n", "check", "--configfile", str(overlay), check=False)
    assert "config key check.witness_cache: '' is invalid" in proc.stderr


def test_a_candidate_without_a_task_line_is_named_before_any_job(tmp_path, kb_repo):
    workdir = copy_workflow(tmp_path / "wf")
    (workdir / "candidates").mkdir()
    (workdir / "candidates" / "anon.py").write_text("class ModelNew: pass\n")
    overlay = _overlay(workdir, kb_repo)
    proc = snakemake(workdir, "-n", "check", "--configfile", str(overlay), check=False)
    assert proc.returncode != 0
    assert "anon.py names no task: put a line '# kbfuse-task: 2/53'" in proc.stderr


def test_verdicts_join_the_manifest_only_when_asked(tmp_path, kb_repo):
    workdir = copy_workflow(tmp_path / "wf")
    (workdir / "candidates").mkdir()
    shutil.copy(FIXTURE / "good.py", workdir / "candidates" / "good.py")
    plain = _overlay(workdir, kb_repo)
    dry = snakemake(workdir, "-n", "manifest", "--configfile", str(plain)).stdout
    assert "results/check/good.json" not in dry
    asked = _overlay(workdir, kb_repo, in_manifest=True)
    dry = snakemake(workdir, "-n", "manifest", "--configfile", str(asked)).stdout
    assert "results/check/good.json" in dry and "results/check/summary/table.csv" in dry


def test_cli_check_exit_status_follows_the_verdict(tmp_path, capsys):
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump({"check": SMALL}))
    task = FIXTURE / "task53_small.py"
    contract = tmp_path / "contract.json"
    write_json(contract, contract_record(None))
    common = ["--task-file", str(task), "--config", str(config), "--device", "cpu"]
    common += ["--contract", str(contract)]
    out = tmp_path / "good.json"
    assert main(["check", str(FIXTURE / "good.py"), *common, "--out", str(out)]) == 0
    assert "good.py: pass (task 2/53)" in capsys.readouterr().out
    bad = tmp_path / "wrong.json"
    assert (
        main(["check", str(FIXTURE / "wrong.py"), "--task", "2/53", *common, "--out", str(bad)])
        == 1
    )
    printed = capsys.readouterr().out
    assert "wrong.py: fail (task 2/53)" in printed and "  failed official: 2/2" in printed
    assert json.loads(out.read_text())["verdict"] == "pass"


def test_cli_check_without_a_contract_names_where_it_looked(tmp_path, capsys):
    task, out = FIXTURE / "task53_small.py", tmp_path / "v.json"
    args = ["check", str(FIXTURE / "good.py"), "--task-file", str(task), "--out", str(out)]
    assert main([*args, "--kernelbench", str(tmp_path / "nowhere")]) == 1
    err = capsys.readouterr().err
    assert f"KernelBench checkout {tmp_path / 'nowhere'} has none of" in err
    assert "kbfuse reads the official check from the pinned evaluator's source" in err
    assert not out.exists()


def test_cli_check_names_a_bad_task_and_writes_nothing(tmp_path, capsys):
    out = tmp_path / "v.json"
    code = main(["check", str(FIXTURE / "good.py"), "--task", "53", "--out", str(out)])
    assert code == 1
    assert "kbfuse check: --task is '53': write LEVEL/TASK" in capsys.readouterr().err
    assert not out.exists()


def test_summary_over_records_written_by_hand(tmp_path, check_run):
    workdir, _ = check_run
    paths = sorted((workdir / "results/check").glob("*.json"))
    written = write_summary(paths, tmp_path / "s")
    assert [p.name for p in written] == ["table.csv", "table.md", "speedup.png"]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"kind": "check_candidate"}))
    with pytest.raises(ValueError, match=r"bad\.json: field <top level>: 'schema_version'"):
        write_summary([bad], tmp_path / "s2")


def test_the_generated_corpus_is_up_to_date():
    tool = Path(__file__).parent.parent / "tools" / "make_check_candidates.py"
    proc = subprocess.run([sys.executable, str(tool), "--check"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout


def test_kernelbench_eval_table_puts_both_verdicts_side_by_side(tmp_path, check_run):
    import importlib.util

    tool = Path(__file__).parent.parent / "tools" / "kernelbench_eval.py"
    spec = importlib.util.spec_from_file_location("kernelbench_eval_tool", tool)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    workdir, _ = check_run
    entry = {
        "candidate": "good.py",
        "task": 53,
        "static": {"valid": False, "errors": ["no CUDA kernel found"], "warnings": []},
        "result": {
            "compiled": True,
            "correctness": True,
            "runtime": 10.0,
            "ref_runtime": 150.0,
            "metadata": {"excessive_speedup": True},
        },
    }
    cells = module.row(entry, workdir / "results" / "check")
    assert cells["kernelbench_correct"] is True and cells["kernelbench_speedup"] == 15.0
    assert cells["kernelbench_flags"] == "excessive_speedup"
    assert cells["static_errors"] == "no CUDA kernel found"
    assert cells["kbfuse_verdict"] == "pass"
    table = module.markdown([cells])
    assert table.splitlines()[0].startswith("| candidate | task | kernelbench_compiled")
    assert "| good.py | 2/53 | True | True | 15.0 |" in table
