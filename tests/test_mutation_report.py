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
    run, counts = report.previous_figures(["numerics", "measure"])
    assert run["commit"] == "8bdcf32"
    assert "numerics" not in counts and set(counts) == {"verify", "deps", "cudacache"}
    assert counts["verify"]["gpu-only"] == 122
    section = "\n".join(report.previous_section(["numerics", "measure"]))
    assert "| verify | 389 | 386 | 3 | 0 | 0 | 99.2% | 122 | 0 |" in section
    assert report.previous_section(list(report.MODULES)) == []


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
