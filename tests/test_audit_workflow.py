"""`snakemake audit` on a tiny corpus in CUDA-L1's format (tests/data/audit/cuda_l1_tiny.json,
CPU task code of the test KernelBench repository's task 53): one check job per entry, named
after its content; a second run does nothing; a changed entry reruns only its own check, a
changed claim only the summary; the audit: block, the corpus and its mapping checked before
any job; the outputs join the manifest only when asked. And `kbfuse audit` without Snakemake:
the same verdicts, and a second run that checks nothing again."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest
import yaml
from conftest import copy_workflow, snakemake, write_test_config
from contracts import contract_record

from kbfuse.io import write_json
from kbfuse.workflow.cli import main

DATA = Path(__file__).parent / "data" / "audit"
SMALL = {
    "official_trials": 2,
    "seeds": [0],
    "distributions": ["uniform"],
    "baselines": ["eager", "torchscript"],
    "time_limit_s": 120,
    "timing": {"warmup": 1, "rounds": 3, "invocations_per_pair": 1},
}
ROOT = "results/audit/tiny"
MODE = "kernelbench-defaults"  # the mode of the fixture's claims


def _overlay(workdir: Path, kb_repo, **audit) -> Path:
    block = {"corpus": "corpus/tiny.json", "mapping": "cuda_l1", **audit}
    return write_test_config(workdir, *kb_repo, check=SMALL, audit=block)


def _records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _write_records(path: Path, records: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


@pytest.fixture(scope="module")
def audit_run(tmp_path_factory, kb_repo):
    workdir = copy_workflow(tmp_path_factory.mktemp("audit-run"))
    (workdir / "corpus").mkdir()
    shutil.copy(DATA / "cuda_l1_tiny.json", workdir / "corpus" / "tiny.json")
    overlay = _overlay(workdir, kb_repo)
    snakemake(workdir, "--cores", "1", "audit", "--configfile", str(overlay))
    return workdir, overlay


def _names(workdir: Path) -> list[str]:
    return sorted(p.stem for p in (workdir / ROOT / "candidates").glob("*.py"))


def test_one_content_named_verdict_per_entry_with_code(audit_run):
    workdir, _ = audit_run
    names = _names(workdir)
    assert len(names) == 3 and all(n.startswith("l2_t53_") for n in names)
    verdicts = {
        n: json.loads((workdir / ROOT / "verdicts" / MODE / f"{n}.json").read_text()) for n in names
    }
    assert sorted(v["verdict"] for v in verdicts.values()) == ["fail", "fail", "pass"]
    for name, record in verdicts.items():  # the pinned task file, read from the checkout
        assert record["task"]["file"].startswith("53_") and record["task"]["commit"]
        assert (workdir / f"results/logs/audit/tiny/{MODE}/{name}.candidate.log").is_file()
        assert record["settings"]["numerics"] == MODE
    text = (workdir / ROOT / "candidates" / f"{names[0]}.py").read_text()
    assert text.startswith("# kbfuse-task: 2/53\n")


def test_each_check_job_declared_the_scratch_it_reserves(audit_run):
    """Not known while the checkout was still to be made: Snakemake evaluated each check's
    `scratch_mb` again when it was ready (the pinned CPU task's 4 cases, plus 512 MiB)."""
    workdir, overlay = audit_run
    (log,) = (workdir / ".snakemake" / "log").glob("*.snakemake.log")
    jobs = log.read_text().split("rule audit_candidate:")[1:]
    assert len(jobs) == 3
    assert all("scratch_mb=513" in job.split("\n\n")[0] for job in jobs)
    # capped by the run's own budget (a check that could never fit still runs, to be refused)
    args = ["-n", "--cores", "1", "audit", "--forcerun", "audit_candidate"]
    dry = snakemake(workdir, *args, "--resources", "scratch_mb=100", "--configfile", str(overlay))
    planned = dry.stdout.split("rule audit_candidate:")[1:]
    assert len(planned) == 3 and all("scratch_mb=100" in job for job in planned)


def test_the_summary_puts_claims_beside_measured(audit_run):
    workdir, _ = audit_run
    table = pd.read_csv(workdir / ROOT / "summary" / "table.csv")
    assert list(table["source"]) == [f"tiny.json line {n}" for n in (1, 2, 3, 4)]
    assert list(table["outcome"][1:]) == [
        "fails: wrong values",
        "fails: caching",
        "not checked: the corpus holds no candidate code for it",
    ]
    assert table.loc[0, "verdict"] == "pass"
    assert list(table["claim_over_eager"][:3]) == [1.05, 3.1, 80.0]
    assert list(table["status_over_eager"][1:]) == ["fails check", "fails check", "not checked"]
    # the corpus's reference is the CPU task file, the pinned one the test repository's
    assert set(table["reference_vs_pinned"][:3]) == {"differs"}
    assert table.loc[0, "method"] == "wall" and table.loc[0, "measured_over_eager"] > 0
    tallies = pd.read_csv(workdir / ROOT / "summary" / "tallies.csv")
    outcome = tallies[tallies["group"] == "outcome"].set_index("kind")["count"]
    assert outcome["fails: caching"] == 1 and outcome["not checked"] == 1
    markdown = (workdir / ROOT / "summary" / "table.md").read_text()
    assert "claims made in numerics mode `kernelbench-defaults`" in markdown
    assert (workdir / ROOT / "summary" / "claims.png").stat().st_size > 10_000


def test_a_second_run_does_nothing(audit_run):
    workdir, overlay = audit_run
    dry = snakemake(workdir, "-n", "--cores", "1", "audit", "--configfile", str(overlay))
    assert "Nothing to be done" in dry.stdout + dry.stderr


def test_a_changed_entry_reruns_only_its_check_and_the_summary(audit_run):
    workdir, overlay = audit_run
    corpus = workdir / "corpus" / "tiny.json"
    before = corpus.read_text()
    records = _records(corpus)
    records[1]["custom_code"] += "\n# changed\n"
    records[2]["score_default"] = 81.0  # a claim: the summary only
    _write_records(corpus, records)
    try:
        dry = snakemake(workdir, "-n", "--cores", "1", "audit", "--configfile", str(overlay))
    finally:
        corpus.write_text(before)
    assert dry.stdout.count("rule audit_candidate:") == 1
    assert dry.stdout.count("rule audit_summary:") == 1
    assert len(_names(workdir)) == 4  # the changed entry's file beside the old one's
    checked = {p.stem for p in (workdir / ROOT / "verdicts" / MODE).glob("*")}
    new = sorted(set(_names(workdir)) - checked)
    assert f"{ROOT}/verdicts/{MODE}/{new[0]}.json" in dry.stdout


def test_judging_against_the_corpus_references_names_entries_anew(tmp_path, kb_repo):
    workdir = copy_workflow(tmp_path / "wf")
    (workdir / "corpus").mkdir()
    shutil.copy(DATA / "cuda_l1_tiny.json", workdir / "corpus" / "tiny.json")
    overlay = _overlay(workdir, kb_repo, references="corpus", name="own")
    dry = snakemake(workdir, "-n", "--cores", "1", "audit", "--configfile", str(overlay))
    tasks = sorted((workdir / "results/audit/own/tasks").glob("*.py"))
    assert len(tasks) == 3 and dry.stdout.count("rule audit_candidate:") == 3
    assert (
        tasks[0].read_text()
        == (Path(__file__).parent / "candidates/cpu/task53_small.py").read_text()
    )


@pytest.mark.parametrize(
    ("audit", "message"),
    [
        ({"references": "mine"}, "config key audit.references: 'mine' is invalid"),
        ({"limit": 0}, "config key audit.limit: 0 is invalid"),
        ({"tasks": [53, 53]}, "config key audit.tasks: [53, 53] is invalid"),
        ({"mapping": "cuda_l2"}, "mapping 'cuda_l2' is neither a packaged mapping (cuda_l1)"),
        ({"corpus": "corpus/none.json"}, "corpus corpus/none.json does not exist"),
        ({"mapping": None}, "corpus corpus/tiny.json is a file: name the mapping"),
        ({"mapping": "bad.yaml"}, "mapping bad.yaml: numerics is 'fast'; known"),
        ({"numerics": ["strict"]}, "audit.numerics is ['strict']: it must include"),
    ],
)
def test_a_bad_audit_is_named_before_any_job(tmp_path, kb_repo, audit, message):
    workdir = copy_workflow(tmp_path / "wf")
    (workdir / "corpus").mkdir()
    shutil.copy(DATA / "cuda_l1_tiny.json", workdir / "corpus" / "tiny.json")
    mapping = yaml.safe_load((workdir / "src/kbfuse/audit/mappings/cuda_l1.yaml").read_text())
    (workdir / "bad.yaml").write_text(yaml.safe_dump({**mapping, "numerics": "fast"}))
    overlay = _overlay(workdir, kb_repo, **audit)
    proc = snakemake(workdir, "-n", "audit", "--configfile", str(overlay), check=False)
    assert proc.returncode != 0
    assert message in proc.stderr
    assert not (workdir / "results").exists()


def test_the_audit_target_without_a_corpus_says_what_to_set(tmp_path, kb_repo):
    workdir = copy_workflow(tmp_path / "wf")
    overlay = write_test_config(workdir, *kb_repo)
    proc = snakemake(workdir, "-n", "audit", "--configfile", str(overlay), check=False)
    assert proc.returncode != 0
    assert "snakemake audit needs the config key audit.corpus" in proc.stderr + proc.stdout


def test_the_audit_joins_the_manifest_only_when_asked(audit_run, kb_repo):
    workdir, overlay = audit_run
    dry = snakemake(workdir, "-n", "manifest", "--configfile", str(overlay)).stdout
    assert f"{ROOT}/summary/table.csv" not in dry
    asked = _overlay(workdir, kb_repo, in_manifest=True)
    try:
        dry = snakemake(workdir, "-n", "manifest", "--configfile", str(asked)).stdout
    finally:
        _overlay(workdir, kb_repo)
    assert f"{ROOT}/summary/table.csv" in dry and f"{ROOT}/summary/claims.png" in dry
    manifest_job = dry.split("rule manifest:")[1].split("\n\n")[0]
    assert f"{ROOT}/entries.json" in manifest_job and f"{ROOT}/verdicts/" in manifest_job


def _cli_against_the_corpus(tmp_path: Path, out: Path) -> list[str]:
    """`kbfuse audit` on the tiny corpus against its own references, on the CPU, with the
    small check settings and a contract of its own, writing to `out`."""
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump({"check": SMALL}))
    contract = tmp_path / "contract.json"
    write_json(contract, contract_record(None))
    args = ["audit", str(DATA / "cuda_l1_tiny.json"), "--mapping", "cuda_l1", "--references"]
    args += ["corpus", "--contract", str(contract), "--config", str(config), "--device", "cpu"]
    return args + ["--out", str(out), "--kernelbench", str(tmp_path / "none")]


def test_cli_audit_checks_each_entry_once(tmp_path, capsys):
    out = tmp_path / "audit"
    args = _cli_against_the_corpus(tmp_path, out)
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert printed.count(": pass") == 1 and printed.count(": fail") == 2
    table = pd.read_csv(out / "summary" / "table.csv")
    assert list(table["verdict"]) == ["pass", "fail", "fail", "not checked"]
    assert set(table["reference_vs_pinned"][:3]) == {"not compared"}
    assert main(args) == 0  # resumed: every verdict is there
    assert capsys.readouterr().out.count("verdict there, not checked again") == 3


def test_cli_audit_names_a_bad_corpus_and_writes_nothing(tmp_path, capsys):
    corpus = tmp_path / "c.json"
    corpus.write_text('{"level_id": 2, "task_id": "53", "custom_code": "", "ref_code": ""}\n')
    out = tmp_path / "audit"
    assert main(["audit", str(corpus), "--mapping", "cuda_l1", "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert "kbfuse audit: c.json line 1: task_id is '53': it must be an integer >= 1" in err
    assert not out.exists()


def _cli_at_the_pin(tmp_path: Path, kb_repo) -> tuple[list[str], Path]:
    """`kbfuse audit` of the tiny corpus's first entry at the test repository's pin, on the
    CPU with the small check settings: its arguments and its output folder."""
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump({"check": SMALL}))
    out = tmp_path / "audit"
    args = ["audit", str(DATA / "cuda_l1_tiny.json"), "--mapping", "cuda_l1", "--limit", "1"]
    args += ["--kernelbench", kb_repo[0], "--config", str(config), "--device", "cpu"]
    return [*args, "--out", str(out)], out


def test_cli_audit_at_the_pin_reads_the_checkout(tmp_path, capsys, kb_repo):
    args, out = _cli_at_the_pin(tmp_path, kb_repo)
    assert main(args) == 0
    table = pd.read_csv(out / "summary" / "table.csv")
    assert list(table["verdict"]) == ["pass", "not checked"]
    assert table.loc[0, "reference_vs_pinned"] == "differs"  # the CPU task file is not the pin's
    record = json.loads(next((out / "verdicts" / MODE).glob("*.json")).read_text())
    assert record["task"]["file"].startswith("53_") and record["task"]["commit"]


def test_cli_audit_of_chosen_tasks(tmp_path, capsys, kb_repo):
    args, out = _cli_at_the_pin(tmp_path, kb_repo)
    # task 1's record is a level-1 one (left out by the mapping), task 53's are the three
    # with code and the one without; --limit 1 counts among them
    assert main([*args, "--task", "53", "--task", "1"]) == 0
    index = json.loads((out / "entries.json").read_text())
    assert index["corpus"]["tasks"] == [53, 1]
    table = pd.read_csv(out / "summary" / "table.csv")
    assert list(table["verdict"]) == ["pass", "not checked"]
    assert "tasks [53, 1] only" in (out / "summary" / "table.md").read_text()
    assert main([*args, "--task", "0", "--out", str(tmp_path / "other")]) == 1
    assert "audit.tasks is [0]: a list of distinct task numbers" in capsys.readouterr().err
    assert not (tmp_path / "other").exists()


def test_cli_audit_names_a_missing_task_file_and_writes_nothing(tmp_path, capsys):
    contract = tmp_path / "contract.json"
    write_json(contract, contract_record(None))
    out = tmp_path / "audit"
    args = ["audit", str(DATA / "cuda_l1_tiny.json"), "--mapping", "cuda_l1", "--out", str(out)]
    args += ["--contract", str(contract), "--kernelbench", str(tmp_path)]
    assert main(args) == 1
    assert "kbfuse audit: task 2/53: 0 files match" in capsys.readouterr().err
    assert not out.exists()


def test_strict_fp32_is_measured_beside_the_claims_mode_when_asked(tmp_path, kb_repo):
    workdir = copy_workflow(tmp_path / "wf")
    (workdir / "corpus").mkdir()
    shutil.copy(DATA / "cuda_l1_tiny.json", workdir / "corpus" / "tiny.json")
    overlay = _overlay(workdir, kb_repo, numerics=["kernelbench-defaults", "strict"])
    dry = snakemake(workdir, "-n", "--cores", "1", "audit", "--configfile", str(overlay))
    assert dry.stdout.count("rule audit_candidate:") == 6
    outputs = [line for line in dry.stdout.splitlines() if line.strip().startswith("output:")]
    assert sum(f"{ROOT}/verdicts/strict/" in line for line in outputs) == 3


def test_cli_audit_in_two_modes(tmp_path, capsys):
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump({"check": SMALL}))
    contract = tmp_path / "contract.json"
    write_json(contract, contract_record(None))
    out = tmp_path / "audit"
    args = ["audit", str(DATA / "cuda_l1_tiny.json"), "--mapping", "cuda_l1", "--limit", "1"]
    args += ["--references", "corpus", "--contract", str(contract), "--config", str(config)]
    args += ["--device", "cpu", "--out", str(out), "--kernelbench", str(tmp_path / "none")]
    assert main([*args, "--numerics", "strict", "--numerics", "kernelbench-defaults"]) == 0
    assert "(strict): pass" in capsys.readouterr().out
    record = json.loads(next((out / "verdicts" / "strict").glob("*.json")).read_text())
    assert record["settings"]["numerics"] == "strict"
    table = pd.read_csv(out / "summary" / "table.csv")
    assert table.loc[0, "numerics"] == MODE and table.loc[0, "strict_verdict"] == "pass"


def test_cli_audit_goes_on_past_an_entry_the_checker_cannot_judge(tmp_path, capsys, monkeypatch):
    from kbfuse.candidates import check
    from kbfuse.errors import KbfuseError

    real = check.check_candidate
    calls = []

    def first_fails(candidate, *args, **kwargs):
        calls.append(candidate)
        if len(calls) == 1:
            raise KbfuseError("the reference process failed (a harness problem)")
        return real(candidate, *args, **kwargs)

    monkeypatch.setattr(check, "check_candidate", first_fails)
    out = tmp_path / "audit"
    args = _cli_against_the_corpus(tmp_path, out)
    assert main(args) == 1  # an entry without a verdict, the summary written all the same
    captured = capsys.readouterr()
    assert "no verdict: the reference process failed (a harness problem)" in captured.err
    assert "kbfuse audit: 1 entries left without a verdict (above): l2_t" in captured.err
    assert len(calls) == 3 and "2 of 3 verdicts there" in captured.out
    table = pd.read_csv(out / "summary" / "table.csv")
    assert list(table["verdict"]) == ["no verdict", "fail", "fail", "not checked"]
    # summarising again checks nothing and needs neither a contract nor a config
    summary = ["audit", str(DATA / "cuda_l1_tiny.json"), "--mapping", "cuda_l1"]
    summary += ["--references", "corpus", "--out", str(out), "--summary-only"]
    assert main(summary) == 0
    assert len(calls) == 3 and "2 of 3 verdicts there" in capsys.readouterr().out
    assert list(pd.read_csv(out / "summary" / "table.csv")["verdict"])[:3] == [
        "no verdict", "fail", "fail"
    ]  # fmt: skip


def test_cli_audit_records_an_entry_too_large_for_the_scratch_disk(
    tmp_path, capsys, monkeypatch, kb_repo
):
    """At the pin the checker knows each task's bytes: on a machine whose scratch disk could
    never hold an entry's cases, that entry is `not checked` (a check_refused record where its
    verdict would be) and the audit goes on to its summary, exit 0."""
    from kbfuse.candidates import check, diskbudget

    monkeypatch.setattr(diskbudget, "free_bytes", lambda path: (1 << 30) + 100_000_000)
    monkeypatch.setattr(check, "run_child", lambda *a, **k: pytest.fail("a child ran"))
    args, out = _cli_at_the_pin(tmp_path, kb_repo)
    assert main(args) == 0
    assert ": not checked" in capsys.readouterr().out
    (path,) = (out / "verdicts" / MODE).glob("*.json")
    assert json.loads(path.read_text())["kind"] == "check_refused"
    table = pd.read_csv(out / "summary" / "table.csv")
    assert list(table["verdict"]) == ["not checked", "not checked"]
    assert table.loc[0, "outcome"].startswith("not checked: needs 0.5 GB of scratch disk")
    assert main(args) == 0  # resumed: the record stands for its verdict
    assert "verdict there, not checked again" in capsys.readouterr().out
