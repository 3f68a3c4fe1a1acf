"""kbfuse.audit.repeat and benchmarks/audit_repeat.py: two runs of one audit compared, pair by
pair, on verdict folders made here."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

from kbfuse.audit.repeat import audit_repeat, report_markdown
from kbfuse.errors import KbfuseError

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import audit_repeat as script  # noqa: E402


def speedup(eager: float, best: float, baseline: str = "inductor") -> dict:
    return {
        "best_compiled": baseline,
        "over_eager": {"balanced": eager, "median": eager * 1.01},
        "over_best_compiled": {"balanced": best, "median": best},
    }


def verdict(outcome="pass", failed=(), findings=(), **methods) -> dict:
    return {
        "kind": "check_candidate",
        "verdict": outcome,
        "failed_checks": list(failed),
        "findings": list(findings),
        "speedup": methods,
    }


def write(audit: Path, entry: str, record: dict, mode: str = "kernelbench-defaults") -> None:
    path = audit / "verdicts" / mode / f"{entry}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record))


@pytest.fixture
def runs(tmp_path):
    first, second = tmp_path / "s24" / "cuda_l1_h100", tmp_path / "s26" / "cuda_l1_h100"
    timed = {"phases_s": {"reference": 10.0, "candidate": 50.0}, "stage_s": {"build": 20.0}}
    write(first, "l2_t91", {**verdict("fail", ["side_stream"], events=speedup(5.0, 1.1)), **timed})
    again = {"phases_s": {"reference": 5.0, "candidate": 30.0}, "lock_wait_s": {"candidate": 20.0}}
    write(second, "l2_t91", {**verdict("pass", events=speedup(5.5, 1.21)), **again})
    write(first, "l2_t80", verdict(findings=["blind_spot"], events=speedup(500.0, 400.0)))
    write(
        second,
        "l2_t80",
        verdict(findings=["blind_spot"], events=speedup(250.0, 200.0, "torchscript")),
    )
    write(first, "l2_t7", verdict(events=speedup(1.0, 0.9), cold_l2=speedup(2.0, 1.0)))
    write(second, "l2_t7", verdict(events=speedup(1.02, 0.9), cold_l2=speedup(2.0, 1.0)))
    kept = verdict("fail", ["official"], events=speedup(3.0, 3.0))
    write(first, "l2_t1", kept)
    write(second, "l2_t1", kept)  # the same bytes: a resumed run kept it
    write(first, "l2_t2", verdict())
    write(second, "l2_t3", verdict())
    write(second, "l2_t7", verdict(), mode="strict")
    return first, second


def test_pairs_are_compared_and_kept_ones_counted_apart(runs):
    report = audit_repeat(*runs)
    assert report["checked_twice"] == 3
    assert report["kept"] == ["kernelbench-defaults/l2_t1"]
    assert report["only_first"] == ["kernelbench-defaults/l2_t2"]
    assert report["only_second"] == ["kernelbench-defaults/l2_t3", "strict/l2_t7"]
    assert (report["same_verdict"], report["same_failed_checks"], report["same_findings"]) == (
        2,
        2,
        3,
    )
    assert [(r["entry"], r["verdict"], r["failed_checks"]) for r in report["differing"]] == [
        ("l2_t91", ["fail", "pass"], [["side_stream"], []])
    ]
    rows = {r["entry"]: r for r in report["rows"]}
    events = rows["l2_t80"]["speedup"]["events"]
    assert events["over_eager"] == [500.0, 250.0] and events["over_eager_ratio"] == 0.5
    assert events["same_best_compiled"] is False
    assert rows["l2_t91"]["speedup"]["events"]["over_best_compiled_ratio"] == pytest.approx(1.1)
    assert set(rows["l2_t7"]["speedup"]) == {"events", "cold_l2"}


def test_agreement_bands_and_the_geometric_mean(runs):
    stats = audit_repeat(*runs)["speedup_agreement"]
    eager = stats["events"]["over_eager"]  # ratios 1.1, 0.5, 1.02
    assert eager["pairs"] == 3
    assert eager["median_ratio"] == 1.02
    assert eager["geomean_ratio"] == round(math.exp(math.log(1.1 * 0.5 * 1.02) / 3), 4)
    assert eager["median_distance"] == 0.1 and eager["max_distance"] == 1.0  # 0.5: twice off
    assert (eager["within_5pct"], eager["within_10pct"]) == (1, 2)
    assert stats["cold_l2"]["over_eager"] == {
        "pairs": 1,
        "median_ratio": 1.0,
        "geomean_ratio": 1.0,
        "median_distance": 0.0,
        "max_distance": 0.0,
        "within_5pct": 1,
        "within_10pct": 1,
    }
    assert "graph" not in stats


def test_the_markdown_names_the_runs_the_changed_verdict_and_the_farthest(runs):
    text = report_markdown(audit_repeat(*runs), "session 24", "session 26", largest=2)
    assert text.startswith("# The same audit run twice: session 24 and session 26\n")
    assert (
        "3 candidates checked in both runs (1 more kept from the first, not checked again): the"
        " same verdict for 2, the same failed checks for 2, the same findings for 3." in text
    )
    assert (
        "| l2_t91 | kernelbench-defaults | fail (failed: side_stream) | pass (failed: none) |"
        in text
    )
    assert "| events | eager | 3 | 0.825 | 1.020 | 10.0% | 100.0% | 1 | 2 |" in text
    assert text.endswith(
        "| l2_t80 | pass | 500.00x | 250.00x | 0.500 |\n"
        "| l2_t91 | fail/pass | 5.00x | 5.50x | 1.100 |\n"
    )


def test_what_cannot_be_compared_is_named(tmp_path, runs):
    first, second = runs
    with pytest.raises(KbfuseError, match=r"^no verdicts under .*empty$"):
        audit_repeat(first, tmp_path / "empty")
    lone = tmp_path / "lone"
    write(lone, "l2_t1", verdict("fail", ["official"], events=speedup(3.0, 3.0)))
    with pytest.raises(KbfuseError, match=r"^no candidate of .* was checked again in .*lone$"):
        audit_repeat(first, lone)
    write(lone, "l2_t2", {"kind": "check_refused"})
    with pytest.raises(KbfuseError, match=r"l2_t2.json: not a check_candidate verdict$"):
        audit_repeat(first, lone)


def test_the_script_writes_both_reports_and_refuses_with_a_message(runs, tmp_path, capsys):
    first, second = runs
    out_json, out_md = tmp_path / "r.json", tmp_path / "r.md"
    argv = [str(first), str(second), "--names", "a", "b", "--json", str(out_json)]
    assert script.main([*argv, "--markdown", str(out_md)]) == 0
    assert json.loads(out_json.read_text())["checked_twice"] == 3
    assert out_md.read_text().startswith("# The same audit run twice: a and b")
    assert script.main([str(first), str(tmp_path / "none")]) == 1
    assert "audit_repeat: no verdicts under" in capsys.readouterr().err


def test_the_time_of_each_run_is_summed_over_the_pairs(runs):
    report = audit_repeat(*runs)
    assert report["time_s"] == {
        "phases_s": [{"reference": 10.0, "candidate": 50.0}, {"reference": 5.0, "candidate": 30.0}],
        "lock_wait_s": [{}, {"candidate": 20.0}],
        "stage_s": [{"build": 20.0}, {}],
    }
    text = report_markdown(report, "a", "b")
    assert "| phase candidate | 50.0 | 30.0 |" in text
    assert "| of which waiting for the GPU lock: candidate | not recorded | 20.0 |" in text
    assert "| candidate stage (self-reported) build | 20.0 | not recorded |" in text


def test_a_speedup_one_run_lacks_is_left_out_of_the_agreement(tmp_path):
    first, second = tmp_path / "a", tmp_path / "b"
    write(first, "l2_t1", verdict(events=speedup(2.0, 1.0), graph=speedup(2.0, 1.0)))
    write(second, "l2_t1", verdict("fail", ["runtime_error"]))  # timing never ran
    broken = speedup(3.0, 1.5)
    broken["over_best_compiled"] = {"balanced": None}
    write(first, "l2_t2", verdict(events=speedup(3.0, 1.5), cold_l2="not a block"))
    write(second, "l2_t2", verdict(events=broken))
    report = audit_repeat(first, second)
    rows = {r["entry"]: r for r in report["rows"]}
    assert rows["l2_t1"]["speedup"] == {}
    events = rows["l2_t2"]["speedup"]["events"]
    assert events["over_best_compiled"] == [1.5, None]
    assert events["over_best_compiled_ratio"] is None and events["over_eager_ratio"] == 1.0
    assert report["speedup_agreement"] == {
        "events": {
            "over_eager": {
                "pairs": 1,
                "median_ratio": 1.0,
                "geomean_ratio": 1.0,
                "median_distance": 0.0,
                "max_distance": 0.0,
                "within_5pct": 1,
                "within_10pct": 1,
            },
            "over_best_compiled": {"pairs": 0},
        }
    }
    text = report_markdown(report, "a", "b")
    assert "| events | best compiled |" not in text and "| events | eager | 1 |" in text
