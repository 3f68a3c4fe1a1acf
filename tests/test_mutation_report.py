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


EARLIER = """
[[runs]]
date = "2026-12-01"
mutmut = "3.8.1"
commit = "bbbbbbb"
about = "Measured under the flat name kbfuse.bundle."

[runs.modules."results.bundle"]
scored = 548
killed = 536
survived = 11
timeout = 1

[runs.modules."timing.gate"]
scored = 217
killed = 217

[[runs]]
date = "2026-11-30"
mutmut = "3.8.1"
commit = "aaaaaaa"

[runs.modules."checks.numerics"]
scored = 492
killed = 488
survived = 4

[runs.modules."checks.verify"]
scored = 389
killed = 386
survived = 3
gpu_only = 122
"""


def test_earlier_figures_only_for_modules_not_in_this_run(tmp_path, monkeypatch):
    monkeypatch.setattr(report, "PREVIOUS", tmp_path / "previous.toml")
    report.PREVIOUS.write_text(EARLIER)
    runs = report.previous_runs({"checks.numerics", "timing.gate"})
    assert [run["commit"] for run, _ in runs] == ["bbbbbbb", "aaaaaaa"]
    latest, first = (counts for _, counts in runs)
    assert latest == {"results.bundle": Counter(scored=548, killed=536, survived=11, timeout=1)}
    assert first == {
        "checks.verify": Counter(scored=389, killed=386, survived=3, **{"gpu-only": 122})
    }
    assert report.previous_runs({"results.bundle", "timing.gate"})[0][0]["commit"] == "aaaaaaa"
    section = "\n".join(report.previous_section({"checks.numerics"}))
    assert "| checks.verify | 389 | 386 | 3 | 0 | 0 | 99.2% | 122 | 0 |" in section
    assert "| results.bundle | 548 | 536 | 11 | 0 | 1 | 97.8% | 0 | 0 |" in section
    assert "| timing.gate | 217 | 217 | 0 | 0 | 0 | 100.0% | 0 | 0 |" in section
    assert "| checks.numerics |" not in section
    assert "on the code of commit bbbbbbb. Measured under the flat name kbfuse.bundle" in section
    assert (
        report.previous_section(
            {"results.bundle", "timing.gate", "checks.numerics", "checks.verify"}
        )
        == []
    )


def test_the_earlier_runs_file_names_a_run_for_every_module_not_run_today():
    """What docs/mutation.md shows apart: each earlier run names its commit and what it ran."""
    for run in tomllib.loads(report.PREVIOUS.read_text())["runs"]:
        assert re.fullmatch(r"[0-9a-f]{7}", run["commit"]), run
        assert run["about"].strip() and run["modules"], run["commit"]


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


def test_decorated_functions_are_named_as_not_mutated(tmp_path):
    """mutmut does not mutate a decorated function: the report names each one, so that a
    function no mutant checks is never counted as tested."""
    assert report.not_mutated(["workflow.deps"]) == [
        "workflow.deps._imports_of",
        "workflow.deps.module_closure",
    ]
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "mod.py").write_text(
        "import functools\n"
        "@functools.cache\ndef cached(): pass\n"
        "def plain(): pass\n"
        "class C:\n"
        "    @staticmethod\n    def made(): pass\n"
        "    @property\n    def size(self): pass\n"
        "    @staticmethod\n    @functools.cache\n    def both(): pass\n"
    )
    assert report.not_mutated(["sub.mod"], tmp_path) == [
        "sub.mod.cached",
        "sub.mod.C.size",
        "sub.mod.C.both",
    ]
    assert report.not_mutated(["errors"]) == []
