"""tools/mutation_report.py: which mutants are scored, and earlier figures kept apart.

The report is what docs/mutation.md says about the tests' strength, so its bookkeeping is
tested like code: modules are named with their subpackage, measure's GPU timers are counted
apart, and a module the latest run did not repeat is shown with the earlier run's figures,
never added to the latest score.
"""

from __future__ import annotations

import re
import sys
import tomllib
from collections import Counter

import pytest
from conftest import ROOT

sys.path.insert(0, str(ROOT / "tools"))
import mutation_report as report  # noqa: E402


def test_each_module_runs_whole_under_its_subpackage_name():
    assert report.mutant_globs(["timing.gate", "timing.measure"]) == [
        "kbfuse.timing.gate.*",
        "kbfuse.timing.measure.*",
    ]
    assert report.mutant_globs(report.MODULES)[0] == "kbfuse.checks.numerics.*"


def test_every_scored_module_is_a_file_mutmut_mutates():
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    files = pyproject["tool"]["mutmut"]["only_mutate"]
    assert files == [f"src/kbfuse/{m.replace('.', '/')}.py" for m in report.MODULES]
    assert all((ROOT / f).is_file() for f in files)


def test_every_gpu_only_function_exists_in_its_module():
    for pattern in report.GPU_ONLY:  # subpackage.module.function or subpackage.module.Class.*
        subpackage, module, name = pattern.split(".")[:3]
        source = (ROOT / "src/kbfuse" / subpackage / f"{module}.py").read_text()
        assert re.search(rf"^(class|def) {name}\b", source, re.M), pattern


def test_tally_counts_gpu_only_and_other_modules_apart():
    results = {
        "kbfuse.timing.measure.x_stats__mutmut_1": "killed",
        "kbfuse.timing.measure.x_stats__mutmut_2": "survived",
        "kbfuse.timing.measure.x_time_interleaved__mutmut_1": "survived",
        "kbfuse.timing.gate.x_gate__mutmut_1": "not checked",
        "kbfuse.timing.gate.x_gate__mutmut_2": "timeout",
        "kbfuse.results.bundle.x_pack__mutmut_1": "survived",
    }
    counts = report.tally(results, ["timing.measure", "timing.gate"])
    assert counts["timing.measure"] == Counter(scored=2, killed=1, survived=1, **{"gpu-only": 1})
    assert counts["timing.gate"] == Counter({"not run": 1, "scored": 1, "timeout": 1})
    assert report.survivors(results, ["timing.measure", "timing.gate"]) == [
        "kbfuse.timing.gate.x_gate__mutmut_2",
        "kbfuse.timing.measure.x_stats__mutmut_2",
    ]


def test_earlier_figures_only_for_modules_not_in_this_run():
    runs = report.previous_runs({"checks.numerics", "timing.measure", "results.bundle"})
    assert [run["commit"] for run, _ in runs] == ["9d9d17c", "8bdcf32"]
    latest, first = (counts for _, counts in runs)
    assert set(latest) == {"results.records", "timing.gate", "workflow.deps", "compilation.routes"}
    assert set(first) == {"checks.verify"}
    assert first["checks.verify"]["gpu-only"] == 122
    section = "\n".join(report.previous_section({"checks.numerics"}))
    assert "| checks.verify | 389 | 386 | 3 | 0 | 0 | 99.2% | 122 | 0 |" in section
    assert "| results.bundle | 548 | 536 | 11 | 0 | 1 | 97.8% | 0 | 0 |" in section
    assert "| timing.measure | 215 | 213 | 2 | 0 | 0 | 99.1% | 79 | 6 |" in section
    assert "| checks.numerics |" not in section
    assert "`kbfuse.bundle` for today's `kbfuse.results.bundle`" in section
    assert report.previous_section(set(report.MODULES)) == []


def test_earlier_runs_name_only_scored_modules():
    for run in tomllib.loads(report.PREVIOUS.read_text())["runs"]:
        assert set(run["modules"]) <= set(report.MODULES), run["commit"]


def test_equivalent_mutants_name_modules_of_the_package():
    for name in report.equivalent_reasons():
        module, function = report.function_of(name)
        path = ROOT / "src/kbfuse" / f"{module.replace('.', '/')}.py"
        assert path.is_file(), name


def test_a_module_run_only_in_part_keeps_its_earlier_figures():
    counts = {
        "workflow.config": Counter(scored=60, killed=55, survived=5, **{"not run": 400}),
        "results.bundle": Counter(scored=10, killed=10),
        "results.records": Counter(),
    }
    assert report.repeated_in_full(counts) == {"results.bundle"}


def test_an_unknown_module_is_refused(capsys):
    assert report.main(["bundle"]) == 2
    assert "unknown module(s) ['bundle']" in capsys.readouterr().err


def test_a_mutant_name_is_split_into_module_and_function():
    assert report.function_of("kbfuse.checks.verify.xǁTask81Witnessǁmeasure__mutmut_3") == (
        "checks.verify",
        "Task81Witness.measure",
    )
    assert report.function_of("kbfuse.stage.x_write_all__mutmut_8") == ("stage", "write_all")
    assert report.function_of("kbfuse.results.bundle.x__tarinfo__mutmut_12") == (
        "results.bundle",
        "_tarinfo",
    )
    with pytest.raises(ValueError, match=r"^not a mutmut mutant name: 'kbfuse\.x'$"):
        report.function_of("kbfuse.x")
