"""benchmarks/audit_wall.py and kbfuse.audit.wall: an audit's time from its verdicts."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from kbfuse.audit.wall import audit_wall, block_end, report_markdown
from kbfuse.errors import KbfuseError

ROOT = Path(__file__).resolve().parents[1]


def samples(n: int, impls: int) -> dict:
    return {f"impl{i}": {"samples_ms": [1.0] * n} for i in range(impls)}


def verdict(verdict: str, phases: dict | None, stages: dict | None, timing: dict | None) -> dict:
    record = {
        "verdict": verdict,
        "failed_checks": [] if verdict == "pass" else ["official"],
        "settings": {"timing": {"rounds": 20}},
        "timing": timing,
    }
    if phases is not None:
        record["phases_s"] = phases
    if stages is not None:
        record["stage_s"] = stages
    return record


@pytest.fixture
def audit(tmp_path):
    folder = tmp_path / "audit" / "tiny"
    mode = folder / "verdicts" / "kernelbench-defaults"
    mode.mkdir(parents=True)
    phases = {"scratch_wait": 1.0, "reference": 2.0, "candidate": 10.0, "witness": 3.0,
              "compare": 4.0}  # fmt: skip
    stages = {"build": 5.0, "alone_wait": 2.5, "timing": 1.5}
    quiet = {"events": samples(8, 4), "cold_l2": samples(20, 4), "graph": samples(12, 4)}
    in_memory = {"estimated_bytes": 61_844_619_264, "waited_s": 0.0, "filesystem": "tmpfs"}
    waits = {"reference": 0.5, "candidate": 2.5, "witness": 0.0, "compare": 1.0}
    first = {**verdict("pass", phases, stages, quiet), "scratch": in_memory, "lock_wait_s": waits}
    (mode / "l2_t1_aa.json").write_text(json.dumps(first))
    slow = {k: v * 10 for k, v in phases.items()}
    on_disk = {"estimated_bytes": 1_500_000_000, "waited_s": 3.0, "filesystem": "ext4"}
    (mode / "l2_t2_bb.json").write_text(
        json.dumps(verdict("fail", slow, None, None) | {"scratch": on_disk})
    )
    # a verdict written before phases_s and stage_s existed counts, with no seconds
    (mode / "l2_t3_cc.json").write_text(json.dumps(verdict("fail", None, None, None)))
    # a check that did not start (too large for the scratch disk): counted, no seconds
    refused = {"kind": "check_refused", "verdict": "not checked", "why": "needs 77 GB"}
    (mode / "l2_t4_dd.json").write_text(json.dumps(refused))
    return folder


def test_the_phases_and_stages_add_up_over_the_checks(audit):
    report = audit_wall(audit)
    assert report["audit"] == "tiny" and report["checks"] == 4
    assert report["verdicts"] == {"fail": 2, "not checked": 1, "pass": 1}
    assert report["phases_s"] == {"scratch_wait": 11.0, "reference": 22.0, "candidate": 110.0,
                                  "witness": 33.0, "compare": 44.0}  # fmt: skip
    assert report["stage_s"]["build"] == 5.0 and report["stage_s"]["guards"] == 0.0
    # only the first check records its waits for the GPU lock (the others predate them)
    assert report["lock_wait_s"] == {"reference": 0.5, "candidate": 2.5, "witness": 0.0,
                                     "compare": 1.0}  # fmt: skip
    assert report["lock_wait_checks"] == 1
    assert report["run_wall_s"] is None
    # the two-cycle events block, the cold block that ran its 20 rounds, the graph between
    assert report["blocks"] == {"cold_l2: all rounds": 1, "events: two cycles": 1,
                                "graph: between": 1}  # fmt: skip
    # where the cases lay: one check in memory, one on a disk, two that did not say
    assert report["scratch"] == {
        "ext4": {"checks": 1, "gb": 1.5},
        "not recorded": {"checks": 2, "gb": 0.0},
        "tmpfs": {"checks": 1, "gb": 61.84},
    }


def test_the_markdown_puts_the_slowest_check_first(audit):
    text = report_markdown(audit_wall(audit))
    assert "4 checks (fail 2, not checked 1, pass 1)." in text
    assert "| compare | 44.0 | 1.0 |" in text and "| alone_wait | 2.5 |" in text
    assert "| scratch_wait | 11.0 |  |" in text
    assert "of which waiting for the GPU lock (1 of 4 checks record it) |" in text
    slowest = text.split("Slowest 4 checks:")[1].splitlines()
    assert slowest[4].startswith("| l2_t2_bb | fail | 1.5 (ext4) | 10 | 20 | 100 | 30 | 40 |")
    assert "| tmpfs | 1 | 61.8 |" in text and "| not recorded | 2 | 0.0 |" in text


def test_block_end_reads_the_samples_per_implementation():
    assert block_end({"events": samples(6, 3)}, "events", 20) == "two cycles"
    assert block_end({"events": samples(20, 3)}, "events", 20) == "all rounds"
    assert block_end({"events": samples(9, 3)}, "events", 20) == "between"
    assert block_end({"graph_missing": "no graph"}, "graph", 20) is None
    assert block_end(None, "events", 20) is None


def test_a_folder_without_verdicts_or_with_a_foreign_file_is_named(tmp_path, audit):
    with pytest.raises(KbfuseError, match="no verdicts under"):
        audit_wall(tmp_path / "empty")
    (audit / "verdicts" / "strict").mkdir()
    (audit / "verdicts" / "strict" / "x.json").write_text('{"kind": "other"}')
    with pytest.raises(KbfuseError, match="x.json: not a check verdict"):
        audit_wall(audit)


def test_the_script_writes_its_tables_with_the_runs_wall_time(audit, tmp_path, capsys):
    spec = importlib.util.spec_from_file_location("audit_wall", ROOT / "benchmarks/audit_wall.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    log = tmp_path / "run.snakemake.log"
    log.write_text("[Thu Dec  3 06:09:31 2026]\nx\n[Thu Dec  3 06:27:28 2026]\n")
    out = tmp_path / "wall.md"
    assert script.main(["--audit", str(audit), "--snakemake-log", str(log),
                        "--markdown", str(out)]) == 0  # fmt: skip
    assert "in 1077 s of Snakemake wall time." in out.read_text()
    assert script.main(["--audit", str(tmp_path / "none")]) == 1
    assert "audit_wall: no verdicts under" in capsys.readouterr().err
