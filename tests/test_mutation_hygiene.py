"""Tests that can fail: every `pytest.raises` names its message, and no skip is silent.

A bare `pytest.raises(KbfuseError)` passes on any error of that type, including one raised
for a reason the test did not mean; `match=` pins the message. Every test file is checked,
the GPU tests' too.
Skips are counted: with KBFUSE_CHECK_SKIPS=1 a session whose skipped tests differ from
tests/expected_skips.txt fails (conftest.py).
"""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

from conftest import read_expected_skips, skip_problems

TESTS = Path(__file__).resolve().parent


def _checked_files() -> list[Path]:
    return sorted(TESTS.glob("*.py"))


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


def test_skip_problems_name_both_directions():
    assert skip_problems({"a", "b"}, {"b", "a"}) == []
    assert skip_problems({"a"}, {"b"}) == [
        "1 tests skipped, 1 expected (expected_skips.txt)",
        "skipped, not expected: b",
        "expected to skip, did not: a",
    ]


def test_expected_skips_name_collected_tests():
    expected = read_expected_skips()
    for nodeid in expected:
        path, _, name = nodeid.partition("::")
        assert (TESTS.parent / path).is_file() and name, nodeid
    assert expected == set()  # CI runs every CPU test (see the file's comment)


_SAMPLE = """
import pytest

def test_runs():
    assert True

@pytest.mark.skipif(True, reason="a condition this machine meets")
def test_skipped():
    assert False
"""


def _run_sample(tmp_path: Path, expected: str, check: str) -> subprocess.CompletedProcess:
    for name in ("conftest.py", "kbrepo.py"):
        shutil.copy(TESTS / name, tmp_path / name)
    (tmp_path / "test_sample.py").write_text(_SAMPLE)
    (tmp_path / "expected_skips.txt").write_text(expected)
    env = {**os.environ, "KBFUSE_CHECK_SKIPS": check}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "not gpu", "."],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_an_unexpected_skip_fails_the_session(tmp_path):
    proc = _run_sample(tmp_path, "# nothing expected\n", check="1")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "1 passed, 1 skipped" in proc.stdout
    assert "skip count check failed:" in proc.stdout
    assert "skipped, not expected: test_sample.py::test_skipped" in proc.stdout


def test_an_expected_skip_passes_and_the_check_is_off_by_default(tmp_path):
    listed = _run_sample(tmp_path, "test_sample.py::test_skipped  # by design\n", check="1")
    assert listed.returncode == 0, listed.stdout + listed.stderr
    unlisted = _run_sample(tmp_path, "", check="0")
    assert unlisted.returncode == 0, unlisted.stdout + unlisted.stderr
    assert "skip count check" not in unlisted.stdout


def _collected(*marker: str) -> list[str]:
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
         *marker, str(TESTS / "test_gpu_devices.py")],
        capture_output=True, text=True, cwd=TESTS.parent, check=False,
    ).stdout  # fmt: skip
    return sorted(line.split("::")[1] for line in out.splitlines() if "::" in line)


def test_multigpu_tests_run_only_when_asked_for():
    # `pytest -m gpu` on the one-GPU machine leaves the two-GPU tests out instead of skipping
    # them (a skip there would hide whether anything else skipped)
    two = ["test_jobs_spread_over_every_gpu", "test_two_timing_jobs_time_on_two_gpus_at_once"]
    gpu = _collected("-m", "gpu")
    assert len(gpu) == 4 and not set(two) & set(gpu)
    assert _collected("-m", "multigpu") == two
    assert _collected() == []  # the CPU suite's own -m 'not gpu'
