"""Tests that can fail: every `pytest.raises` names the message it expects.

A bare `pytest.raises(KbfuseError)` passes on any error of that type, including one raised
for a reason the test did not mean; `match=` pins the message. The lead's files
(test_timing_stats.py, test_exhaustive.py, test_gpu_*.py) are checked in their own review.
"""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent
EXEMPT = ("test_timing_stats.py", "test_exhaustive.py", "test_gpu_*.py")


def _checked_files() -> list[Path]:
    files = sorted(TESTS.glob("*.py"))
    return [f for f in files if not any(f.match(pattern) for pattern in EXEMPT)]


def _is_pytest_raises(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "raises"
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id == "pytest"
    )


def raises_without_match(path: Path) -> list[str]:
    """'file:line' of every pytest.raises(...) call in `path` without a match= keyword."""
    tree = ast.parse(path.read_text(), filename=str(path))
    return [
        f"{path.name}:{node.lineno}"
        for node in ast.walk(tree)
        if _is_pytest_raises(node) and not any(k.arg == "match" for k in node.keywords)
    ]


def test_the_checker_finds_a_bare_raises(tmp_path):
    sample = tmp_path / "test_sample.py"
    sample.write_text(
        "import pytest\n"
        "def test_a():\n"
        "    with pytest.raises(ValueError):\n"
        "        pass\n"
        "    with pytest.raises(ValueError, match='x'):\n"
        "        pass\n"
    )
    assert raises_without_match(sample) == ["test_sample.py:3"]


def test_every_pytest_raises_names_its_message():
    files = _checked_files()
    assert len(files) > 30  # the checker sees the suite, not an empty folder
    bare = [hit for path in files for hit in raises_without_match(path)]
    assert bare == []
