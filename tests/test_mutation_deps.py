"""kbfuse.workflow.deps: the module closure follows real imports, every form of them, and no
others."""

from __future__ import annotations

import ast
import os
from pathlib import Path

import pytest

from kbfuse.workflow import deps

MODULES = {
    "top": "import kbfuse.alpha\nfrom kbfuse import beta\nfrom kbfuse.gamma import thing\n",
    "alpha": "from . import delta\nimport os\n",
    "beta": "from .epsilon import value\nimport numpy as np\n",
    "gamma": "thing = 1\n",
    "delta": "def f():\n    from kbfuse import zeta  # an import inside a function counts\n",
    "epsilon": "value = 2\nfrom kbfuse.top import nothing  # a cycle back to the start\n",
    "zeta": "import kbfuse\n",  # the package alone names no module
    "unused": "import kbfuse.top\n",  # imports top, but nothing imports it
    "names": "from kbfuse.gamma import missing_name\nfrom kbfuse import not_a_module\n",
}


@pytest.fixture
def src(tmp_path) -> Path:
    for name, text in MODULES.items():
        (tmp_path / f"{name}.py").write_text(text)
    return tmp_path


def test_closure_follows_every_import_form(src):
    assert deps.module_closure("top", src) == (
        "alpha",
        "beta",
        "delta",
        "epsilon",
        "gamma",
        "top",
        "zeta",
    )


def test_closure_of_a_leaf_is_itself(src):
    assert deps.module_closure("gamma", src) == ("gamma",)
    assert deps.module_closure("zeta", src) == ("zeta",)


def test_a_name_imported_from_a_module_is_not_a_module(src):
    assert deps.module_closure("names", src) == ("gamma", "names")


def test_imported_modules_of_one_file(src):
    # "gamma.thing" could be a module of a subpackage gamma: the closure looks and skips it
    assert deps._imported_modules(src / "top.py") == {"alpha", "beta", "gamma", "gamma.thing"}
    assert deps._imported_modules(src / "alpha.py") == {"delta"}
    assert deps._imported_modules(src / "beta.py") == {"epsilon"}
    assert deps._imported_modules(src / "zeta.py") == set()
    assert deps._imported_modules(src / "names.py") == {
        "gamma",
        "gamma.missing_name",
        "not_a_module",
    }


SCANNED = {
    # a parenthesised list over lines, a backslash continuation, an import in a function
    "lists": (
        "from kbfuse.alpha import (\n    a,\n    b,\n)\nimport os, \\\n    kbfuse.beta\n"
        "def f():\n    import kbfuse.gamma as g\n"
    ),
    # a docstring line that reads as the start of an import but does not parse on its own:
    # the whole module is parsed instead, so its real imports are all found
    "prose": '"""Helpers.\n\nfrom the parent, in order\n"""\nfrom kbfuse import delta\n',
    # a comment's ")" ends the match early: the whole module is parsed
    "comment": "from kbfuse.epsilon import (\n    value,  # see (b)\n    other,\n)\n",
    # a string line that does parse as an import adds a module: more reruns, never fewer
    "program": 'CHILD = """\nfrom kbfuse.zeta import run\n"""\n',
}


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("lists", {"alpha", "alpha.a", "alpha.b", "beta", "gamma"}),
        ("prose", {"delta"}),
        ("comment", {"epsilon", "epsilon.value", "epsilon.other"}),
        ("program", {"zeta", "zeta.run"}),
    ],
)
def test_import_lines_are_found_in_every_layout(tmp_path, name, expected):
    path = tmp_path / f"{name}.py"
    path.write_text(SCANNED[name])
    assert deps._imported_modules(path) == expected


def _parsed_imports(path: Path) -> set[str]:
    """The imports a parse of the whole module finds (what the line scan must match)."""
    return {
        ast.dump(node)
        for node in deps._statements(ast.parse(path.read_text()).body)
        if isinstance(node, ast.Import | ast.ImportFrom)
    }


def test_the_line_scan_finds_what_a_whole_parse_finds_in_every_kbfuse_module():
    extra = {}
    for path in sorted(deps.SRC.rglob("*.py")):
        scanned = {
            ast.dump(node)
            for node in deps._import_nodes(path.read_text(), str(path))
            if isinstance(node, ast.Import | ast.ImportFrom)
        }
        parsed = _parsed_imports(path)
        assert parsed <= scanned, path
        if scanned - parsed:
            extra[path.relative_to(deps.SRC).as_posix()] = len(scanned - parsed)
    # the only extra lines are the imports of the child programs the startup benchmark runs
    assert extra == {"workflow/startup.py": 5}


def test_an_unknown_module_is_refused(src):
    with pytest.raises(FileNotFoundError, match="no kbfuse module 'absent' at .*absent.py"):
        deps.module_closure("absent", src)


def test_the_real_verify_closure_follows_its_imports():
    closure = deps.module_closure("checks.verify")
    assert {
        "checks.verify",
        "compilation.cudacache",
        "errors",
        "io",
        "tasks.kernelbench",
        "compilation.launch",
        "checks.numerics",
    } <= set(closure)
    assert {"compilation.routes", "tasks.tails"} <= set(closure)
    assert "results.summary" not in closure and "timing.timing" not in closure
    assert list(closure) == sorted(closure)


def test_a_module_of_a_subpackage_brings_the_subpackage_init():
    closure = deps.module_closure("timing.measure")
    assert closure == ("errors", "timing.__init__", "timing.measure")
    assert deps.module_files("timing.measure")[1] == "src/kbfuse/timing/__init__.py"
    with pytest.raises(
        FileNotFoundError, match=r"no kbfuse module 'checks.absent' at .*checks/absent.py"
    ):
        deps.module_closure("checks.absent")


def test_module_files_are_the_union_of_closures_as_workflow_paths():
    names = sorted(set(deps.module_closure("errors")) | set(deps.module_closure("faults")))
    assert len(names) > len(deps.module_closure("faults"))  # errors adds a module of its own
    assert deps.module_files("errors", "faults") == [f"src/kbfuse/{name}.py" for name in names]
    assert deps.module_files("errors", root="x") == ["x/errors.py"]


def test_module_files_name_the_schemas_the_records_module_reads():
    files = deps.module_files("results.summary")
    assert "src/kbfuse/results/records.py" in files
    schemas = [f for f in files if f.startswith("src/kbfuse/schemas/")]
    assert "src/kbfuse/schemas/timing.schema.json" in schemas
    assert len(schemas) == len(list((deps.SRC / "schemas").glob("*.json")))
    assert not [f for f in deps.module_files("errors") if f.endswith(".json")]


def _edit(path: Path, text: str, mtime_ns: int) -> None:
    """Write `text` to `path` and set its modification time to `mtime_ns`."""
    path.write_text(text)
    os.utime(path, ns=(mtime_ns, mtime_ns))


@pytest.mark.parametrize(
    ("edited", "later_ns"),
    [
        ("from kbfuse import c\n", 1_000_000_000),  # same size, a later time
        ("from kbfuse import c  # and a comment\n", 0),  # another size, the same time
    ],
)
def test_an_edit_is_parsed_again_when_its_time_or_only_its_size_changes(tmp_path, edited, later_ns):
    """A file's version is its modification time and its size: either alone tells an edit."""
    (tmp_path / "first.py").write_text("from kbfuse import b\n")
    (tmp_path / "c.py").write_text("y = 2\n")
    b = tmp_path / "b.py"
    b.write_text("from kbfuse import d\n")
    (tmp_path / "d.py").write_text("x = 1\n")
    mtime_ns = b.stat().st_mtime_ns
    assert deps.module_closure("first", tmp_path) == ("b", "d", "first")
    _edit(b, edited, mtime_ns + later_ns)
    assert (b.stat().st_size == len("from kbfuse import d\n")) is (later_ns != 0)
    (tmp_path / "second.py").write_text("from kbfuse import b\n")  # closures are cached by name
    assert deps.module_closure("second", tmp_path) == ("b", "c", "second")


def test_each_version_of_a_file_is_parsed_once(tmp_path):
    (tmp_path / "a.py").write_text("from kbfuse import b\n")
    (tmp_path / "b.py").write_text("x = 1\n")
    before = deps._imports_of.cache_info()
    assert deps.module_closure("a", tmp_path) == ("a", "b")
    stat = (tmp_path / "b.py").stat()
    stamp = (stat.st_mtime_ns, stat.st_size)
    assert deps._imports_of(tmp_path / "b.py", stamp) == frozenset()
    assert deps._imports_of(tmp_path / "a.py", stamp) == frozenset({"b"})  # a's text, b's stamp
    after = deps._imports_of.cache_info()
    assert (after.misses - before.misses, after.hits - before.hits) == (3, 1)
