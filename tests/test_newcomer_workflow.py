"""Issue 13: what a newcomer meets first, run on a copy of the workflow.

- The pinned commit, not the KernelBench URL, decides reruns: another mirror, path or
  file:// URL of the same repository reruns and deletes nothing; another commit reruns the
  pin. Records name the URL only when it is a network URL.
- Messages come once and without a traceback: a GPU job on a machine without a GPU, the
  `cpu` target without an architecture, a held lock; no "Shell command: None".
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
from conftest import snakemake, write_test_config
from kbrepo import git

from kbfuse.io import read_json, sha256_file
from kbfuse.kernelbench import LOCAL_MIRROR, recorded_url

PIN_TARGETS = ("cpu",)


def result_hashes(workdir: Path) -> dict[str, str]:
    """sha256 of every file under results/ except logs (rewritten by any job that runs)."""
    return {
        p.relative_to(workdir).as_posix(): sha256_file(p)
        for p in (workdir / "results").rglob("*")
        if p.is_file() and "logs" not in p.relative_to(workdir).parts
    }


def jobs_planned(out: str) -> list[str]:
    return re.findall(r"^(?:local)?rule (\w+):$", out, re.MULTILINE)


@pytest.fixture(scope="module")
def pinned(tmp_path_factory, kb_repo):
    """A workflow copy after `snakemake cpu` against the test repository at its own path."""
    from conftest import copy_workflow

    workdir = copy_workflow(tmp_path_factory.mktemp("newcomer") / "wf")
    config = write_test_config(workdir, *kb_repo)
    snakemake(workdir, "--cores", "2", *PIN_TARGETS, "--configfile", str(config))
    return workdir, kb_repo


def other_spellings(tmp_path: Path, url: str) -> dict[str, str]:
    """The same repository as a bare mirror at another path, and as a file:// URL."""
    mirror = tmp_path / "elsewhere" / "KernelBench.git"
    subprocess.run(["git", "clone", "-q", "--mirror", url, str(mirror)], check=True)
    return {"mirror": str(mirror), "file-url": mirror.as_uri(), "same-as-uri": Path(url).as_uri()}


def test_the_checkout_records_no_local_path(pinned):
    workdir, (url, commit) = pinned
    for name in ("checkout.json", "pin.json", "tasks/53.json"):
        record = read_json(workdir / "results/kernelbench" / name)
        assert record["url"] == LOCAL_MIRROR
        assert record["commit"] == commit
    log = (workdir / "results/logs/kernelbench/checkout.log").read_text()
    assert "ls-remote" in log
    assert url not in log


def test_another_url_of_the_same_commit_reruns_and_deletes_nothing(pinned, tmp_path):
    workdir, (url, commit) = pinned
    before = result_hashes(workdir)
    assert "results/kernelbench/checkout.json" in before
    for name, other in other_spellings(tmp_path, url).items():
        config = write_test_config(workdir, other, commit)
        dry = snakemake(workdir, "-n", "--cores", "1", *PIN_TARGETS, "--configfile", str(config))
        out = dry.stdout + dry.stderr
        assert jobs_planned(out) == [], (name, out)
        assert "Nothing to be done" in out, name
    # And a real run (the last spelling) runs, deletes and rewrites nothing.
    real = snakemake(workdir, "--cores", "1", *PIN_TARGETS, "--configfile", str(config))
    assert jobs_planned(real.stdout + real.stderr) == []
    assert result_hashes(workdir) == before
    assert (workdir / "results/kernelbench/checkout/.git").is_dir()


def test_another_commit_reruns_the_pin(pinned):
    workdir, (url, commit) = pinned
    tip = git(Path(url), "rev-parse", "main")
    assert tip != commit
    config = write_test_config(workdir, url, tip)
    dry = snakemake(workdir, "-n", "--cores", "1", *PIN_TARGETS, "--configfile", str(config))
    out = dry.stdout + dry.stderr
    planned = jobs_planned(out)
    assert planned.count("kernelbench_checkout") == 1
    assert planned.count("kernelbench_task") == 3
    assert planned.count("kernelbench_pin") == 1
    assert "Params have changed since last execution" in out
    assert not [rule for rule in planned if rule.startswith("compile")]  # kernels don't read it


@pytest.mark.parametrize(
    ("url", "recorded"),
    [
        ("https://github.com/ScalingIntelligence/KernelBench", None),
        ("https://github.com/ScalingIntelligence/KernelBench.git", None),
        ("https://x-token:s3cret@github.com/o/KernelBench", "https://github.com/o/KernelBench"),
        ("https://ghp_abc@github.com:8443/o/KernelBench", "https://github.com:8443/o/KernelBench"),
        ("ssh://git:pw@host.example/o/kb.git", "ssh://git@host.example/o/kb.git"),
        ("git://host.example/kb.git", None),
        ("git@github.com:ScalingIntelligence/KernelBench.git", None),
        ("/srv/mirrors/KernelBench", LOCAL_MIRROR),
        ("file:///srv/mirrors/KernelBench", LOCAL_MIRROR),
        ("../KernelBench", LOCAL_MIRROR),
        ("KernelBench", LOCAL_MIRROR),
        ("http://localhost:8080/kb.git", LOCAL_MIRROR),
        ("http://127.0.0.1/kb.git", LOCAL_MIRROR),
        ("C:/mirrors/KernelBench", LOCAL_MIRROR),
    ],
)
def test_recorded_url_keeps_network_urls_without_credentials(url, recorded):
    assert recorded_url(url) == (url if recorded is None else recorded)
