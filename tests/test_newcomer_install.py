"""README's two quick-start commands, as a newcomer copies them, and what they install.

What can be checked without installing anything: the test command installs torch's CPU
build on its own before the project, in a pinned version that already meets pyproject's torch
requirement (so `pip install -e '.[test]'` keeps it and pulls no CUDA build), in a virtualenv
of its own (a GPU machine's study torch is never replaced), and runs the suite in parallel;
CI runs that line and creates no other virtualenv; the end-to-end tests are marked `slow`
for a quick loop while editing. The measured sizes and times are in
docs/newcomer.md. The documents a newcomer reads name no path of one machine and no file
outside the repository.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]


def bash_blocks(text: str) -> list[str]:
    return [b.split("```", 1)[0].strip() for b in text.split("```bash\n")[1:]]


def readme_command(word: str) -> list[list[str]]:
    """The first README bash block containing `word`, as its `&&`-joined commands."""
    block = next(b for b in bash_blocks((ROOT / "README.md").read_text()) if word in b)
    assert "\n" not in block, "a quick-start command is one line to copy"
    return [shlex.split(part) for part in block.split(" && ")]


def project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def test_test_command_installs_torchs_cpu_build_alone_first():
    venv, torch_step, project_step, pytest_step = readme_command("pytest")
    assert venv == ["python3", "-m", "venv", ".venv-cpu"]
    assert torch_step[:3] == [".venv-cpu/bin/pip", "install", "-q"]
    assert "--no-deps" in torch_step
    index = torch_step[torch_step.index("--extra-index-url") + 1]
    assert index == "https://download.pytorch.org/whl/cpu"
    pin = Requirement(next(a for a in torch_step if a.startswith("torch")))
    assert pin.name == "torch" and str(pin.specifier).startswith("==")
    # pyproject's torch requirement is already met, so the next step keeps the CPU build
    wanted = next(Requirement(r) for r in project()["dependencies"] if r.startswith("torch"))
    assert Version(str(pin.specifier)[2:]) in wanted.specifier
    assert project_step == [".venv-cpu/bin/pip", "install", "-q", "-e", ".[test]"]
    assert pytest_step == [".venv-cpu/bin/python", "-m", "pytest", "-n", "auto"]
    extra = {Requirement(r).name for r in project()["optional-dependencies"]["test"]}
    assert "pytest-xdist" in extra


def test_study_and_tests_use_separate_virtualenvs():
    study = readme_command("snakemake --cores 1 all")
    assert study[0] == ["python3", "-m", "venv", ".venv"]
    assert study[1] == [".venv/bin/pip", "install", "-q", "-e", ".[cuda13,nvrtc12]"]
    ignored = subprocess.run(
        ["git", "check-ignore", ".venv/x", ".venv-cpu/x"], cwd=ROOT, capture_output=True, text=True
    )
    assert ignored.stdout.split() == [".venv/x", ".venv-cpu/x"]


def test_ci_creates_one_virtualenv_with_the_readme_line():
    lines = [
        line
        for line in (ROOT / ".ci/run").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    commands = [line for line in lines if "pip " in line or "venv" in line]
    block = next(b for b in bash_blocks((ROOT / "README.md").read_text()) if "pytest" in b)
    assert commands == [block]


NEWCOMER_FILES = ("README.md", "config/README.md", "docs", "profiles", "envs", ".ci", "tools")
# h200-run.sh works in the GPU machine's own scratch folders, and device-settings.sh names the
# corpus path it gives the audit (among the audit's params, so resume-plan.sh uses it too)
DEVICE_PATHS = ("h200-run.sh", "device-settings.sh")
MACHINE_PATH = re.compile(r"(?<![\w.])/(?:work|root|home|tmp)/|\.\./shared|DESIGN\.md")


def test_documents_name_no_machine_path_and_no_file_outside_the_repository():
    found = []
    for name in NEWCOMER_FILES:
        path = ROOT / name
        for file in [path] if path.is_file() else sorted(path.rglob("*")):
            if not file.is_file() or file.name in DEVICE_PATHS or "__pycache__" in file.parts:
                continue
            for n, line in enumerate(file.read_text().splitlines(), 1):
                if MACHINE_PATH.search(line):
                    found.append(f"{file.relative_to(ROOT)}:{n}: {line.strip()}")
    assert found == []


def collected(*args: str) -> set[str]:
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return {line for line in proc.stdout.splitlines() if "::" in line}


def test_slow_marks_the_end_to_end_tests_and_nothing_else(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(ROOT / "src"))
    slow = collected("-m", "slow", "tests/test_config.py", "tests/test_workflow.py")
    quick = collected(
        "-m", "not gpu and not slow", "tests/test_config.py", "tests/test_workflow.py"
    )
    assert slow and quick and not slow & quick
    workflow = {t for t in slow | quick if t.startswith("tests/test_workflow.py::")}
    assert workflow and workflow <= slow
    # in test_config.py only the tests that run Snakemake in a copy of the workflow are slow
    config_slow = {t for t in slow if t.startswith("tests/test_config.py::")}
    assert config_slow and all("snakemake" in t for t in config_slow)
    assert "tests/test_config.py::test_ci_runs_the_readme_test_command" in quick
