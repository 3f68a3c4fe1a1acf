"""tools/mutation_report.py: which mutants are scored, and earlier figures kept apart.

The report is what docs/mutation.md says about the tests' strength, so its bookkeeping is
tested like code: timing's GPU driver is not scored, measure's GPU timers are counted apart,
and a module the latest run did not repeat is shown with the earlier run's figures, never
added to the latest score.
"""

from __future__ import annotations

import sys
from collections import Counter

import pytest
from conftest import ROOT

sys.path.insert(0, str(ROOT / "tools"))
import mutation_report as report  # noqa: E402


def test_timing_runs_only_its_gate_and_checks_other_modules_run_whole():
    globs = report.mutant_globs(["timing", "measure"])
    assert "kbfuse.timing.timing.x_gate__mutmut_*" in globs
    assert "kbfuse.timing.timing.x_gate_baselines__mutmut_*" in globs
    assert not any("run_timing" in g or "measure_program" in g for g in globs)
    assert globs[-1] == "kbfuse.timing.measure.*"


def test_tally_counts_gpu_only_and_unscored_functions_apart():
    results = {
        "kbfuse.timing.measure.x_stats__mutmut_1": "killed",
        "kbfuse.timing.measure.x_stats__mutmut_2": "survived",
        "kbfuse.timing.measure.x_time_interleaved__mutmut_1": "survived",
        "kbfuse.timing.timing.x_run_timing__mutmut_1": "survived",
        "kbfuse.timing.timing.x_gate__mutmut_1": "not checked",
    }
    counts = report.tally(results, ["measure", "timing"])
    assert counts["measure"] == Counter(scored=2, killed=1, survived=1, **{"gpu-only": 1})
    assert counts["timing"] == Counter({"not run": 1})
    assert report.survivors(results, ["measure", "timing"]) == [
        "kbfuse.timing.measure.x_stats__mutmut_2"
    ]


def test_earlier_figures_only_for_modules_not_in_this_run():
    runs = report.previous_runs({"numerics", "measure"})
    assert [run["commit"] for run, _ in runs] == ["8bdcf32", "f3227ec"]
    first, second = (counts for _, counts in runs)
    assert set(first) == {"verify", "deps", "cudacache"}
    assert first["verify"]["gpu-only"] == 122
    assert set(second) == {"timing", "config", "routes", "manifest"}
    assert second["timing"] == Counter({"scored": 99, "killed": 99, "not run": 236})
    section = "\n".join(report.previous_section({"numerics", "measure"}))
    assert "| verify | 389 | 386 | 3 | 0 | 0 | 99.2% | 122 | 0 |" in section
    assert "| config | 463 | 412 | 48 | 0 | 3 | 89.0% | 0 | 0 |" in section
    assert report.previous_section(set(report.MODULES)) == []


def test_a_module_run_only_in_part_keeps_its_earlier_figures():
    counts = {
        "config": Counter(scored=60, killed=55, survived=5, **{"not run": 400}),
        "bundle": Counter(scored=10, killed=10),
        "records": Counter(),
    }
    assert report.repeated_in_full(counts) == {"bundle"}


def test_an_unknown_module_is_refused(capsys):
    assert report.main(["timings"]) == 2
    assert "unknown module(s) ['timings']" in capsys.readouterr().err


def test_a_mutant_name_is_split_into_module_and_function():
    assert report.function_of("kbfuse.checks.verify.xǁTask81Witnessǁmeasure__mutmut_3") == (
        "verify",
        "Task81Witness.measure",
    )
    with pytest.raises(ValueError, match=r"^not a mutmut mutant name: 'kbfuse\.x'$"):
        report.function_of("kbfuse.x")
