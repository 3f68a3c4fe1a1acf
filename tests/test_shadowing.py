"""Issue 13: a workflow job runs the checkout's own kbfuse, whatever else is installed.

Snakemake's script preamble appends the script's folder to `sys.path`, after site-packages,
so a kbfuse installed from another clone would shadow the checkout's src/ in every job: an
edit to src/kbfuse reruns the job (the module is an input) but runs the other clone's code.
Here an interpreter whose site-packages puts a second copy of kbfuse first runs a workflow
job; both copies record every import of theirs in a marker file, and only the checkout's may
appear there.
"""

from __future__ import annotations

import os
import shutil
import site
import subprocess
import sys
from pathlib import Path

from conftest import ROOT, copy_workflow, write_test_config

MARKER_CODE = """
import os as _os
with open(_os.environ["KBFUSE_TEST_MARKER"], "a") as _fh:
    _fh.write(__file__ + "\\n")
"""


def with_marker(package: Path) -> Path:
    """`package`'s __init__ then appends its own path to $KBFUSE_TEST_MARKER on import."""
    init = package / "__init__.py"
    init.write_text(init.read_text() + MARKER_CODE)
    return init


def shadowing_python(tmp_path: Path, shadow_root: Path) -> Path:
    """An interpreter (a throw-away venv) whose path has `shadow_root` before this venv's
    site-packages, as a kbfuse installed from another clone would be."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    venv_site = subprocess.run(
        [str(python), "-c", "import site; print(site.getsitepackages()[0])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    lines = [str(shadow_root)]
    lines += [f"import site; site.addsitedir({d!r})" for d in site.getsitepackages()]
    (Path(venv_site) / "kbfuse-shadow.pth").write_text("\n".join(lines) + "\n")
    return python


def test_a_job_imports_the_checkouts_kbfuse_not_an_installed_one(tmp_path, kb_repo):
    workdir = copy_workflow(tmp_path / "wf")
    config = write_test_config(workdir, *kb_repo)
    ours = with_marker(workdir / "src" / "kbfuse")
    shadow_root = tmp_path / "other-clone"
    shutil.copytree(ROOT / "src" / "kbfuse", shadow_root / "kbfuse")
    theirs = with_marker(shadow_root / "kbfuse")
    python = shadowing_python(tmp_path, shadow_root)
    marker = tmp_path / "imports.txt"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["KBFUSE_TEST_MARKER"] = str(marker)

    # The set-up does shadow: outside the workflow, this interpreter imports the other copy.
    probe = [str(python), "-c", "import kbfuse"]
    subprocess.run(probe, cwd=tmp_path, env=env, check=True)
    assert marker.read_text().splitlines() == [str(theirs)]
    marker.unlink()

    target = "results/kernelbench/checkout.json"
    argv = [str(python), "-m", "snakemake", "--cores", "1", target, "--configfile", str(config)]
    proc = subprocess.run(argv, cwd=workdir, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "rule kernelbench_checkout:" in proc.stdout + proc.stderr
    assert (workdir / target).is_file()
    # Snakemake's own process (parsing the Snakefile) and the job's both imported ours.
    imports = marker.read_text().splitlines()
    assert len(imports) == 2
    assert set(imports) == {str(ours)}


def test_the_checkouts_src_goes_first_once_on_the_jobs_path(monkeypatch, tmp_path):
    from kbfuse.workflow.jobs import put_first_on_jobs_path

    src, other = str(tmp_path / "src"), str(tmp_path / "other")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([other, src, ""]))
    put_first_on_jobs_path(src)
    assert os.environ["PYTHONPATH"] == os.pathsep.join([src, other])
    monkeypatch.delenv("PYTHONPATH")
    put_first_on_jobs_path(tmp_path / "src")
    assert os.environ["PYTHONPATH"] == src
