"""tools/audit_reference.py: a finished audit's files, its wall report and a manifest that
verifies; an audit that has not run to its end is named before anything is copied."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import pytest

from kbfuse.results.manifest import verify_manifest

ROOT = Path(__file__).resolve().parents[1]
SURVEY = ROOT / "results" / "reference" / "h200" / "survey"


def tool():
    spec = importlib.util.spec_from_file_location(
        "audit_reference", ROOT / "tools/audit_reference.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def results(tmp_path):
    """A finished run's results: the survey reference's pin, contract and fingerprint, and a
    two-entry audit."""
    results = tmp_path / "results"
    for rel in ("env/fingerprint.json", "kernelbench/checkout.json", "kernelbench/contract.json"):
        (results / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(SURVEY / rel, results / rel)
    audit = results / "audit" / "tiny"
    (audit / "summary").mkdir(parents=True)
    (audit / "entries.json").write_text('{"entries": []}')
    for name in ("table.csv", "table.md", "tallies.csv", "tallies.md", "claims.png"):
        (audit / "summary" / name).write_text(name)
    mode = audit / "verdicts" / "kernelbench-defaults"
    mode.mkdir(parents=True)
    for entry, verdict in (("l2_t1_aa", "pass"), ("l2_t2_bb", "fail")):
        record = {"verdict": verdict, "phases_s": {"compare": 2.0}, "timing": None}
        (mode / f"{entry}.json").write_text(json.dumps(record))
    (audit / "candidates").mkdir()
    (audit / "candidates" / "l2_t1_aa.py").write_text("# the corpus's code")
    return results


def test_the_reference_keeps_the_verdicts_summary_and_wall_and_verifies(results, tmp_path):
    out = tmp_path / "reference"
    log = tmp_path / "run.log"
    log.write_text("[Thu Dec  3 06:09:31 2026]\n[Thu Dec  3 06:19:31 2026]\n")
    assert tool().main(["--results", str(results), "--name", "tiny", "--out", str(out),
                        "--snakemake-log", str(log)]) == 0  # fmt: skip
    report = verify_manifest(out, out / "manifest.json", ignore=["manifest.json"])
    # the index, 5 summary files, 2 verdicts, pin, contract, fingerprint, the wall report
    assert report["ok"] and report["checked"] == 13
    assert report["pin"]["commit"] == "423217d9fda91e0c2d67e4a43bf62f96f6d104f1"
    wall = json.loads((out / "audit/tiny/wall.json").read_text())
    assert wall["checks"] == 2 and wall["phases_s"]["compare"] == 4.0
    assert wall["run_wall_s"] == 600.0
    assert "2 checks (fail 1, pass 1) in 600 s" in (out / "audit/tiny/wall.md").read_text()
    assert not (out / "audit/tiny/candidates").exists()  # the corpus's code stays out


def test_an_unfinished_audit_is_named_and_nothing_is_written(results, tmp_path, capsys):
    (results / "audit/tiny/summary/claims.png").unlink()
    out = tmp_path / "reference"
    assert tool().main(["--results", str(results), "--name", "tiny", "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert "claims.png is missing: run `snakemake audit results/env/fingerprint.json`" in err
    assert not out.exists()
