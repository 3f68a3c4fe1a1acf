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
import torch
from conftest import copy_workflow, snakemake, write_test_config
from kbrepo import git

from kbfuse.io import read_json, sha256_file
from kbfuse.tasks.kernelbench import LOCAL_MIRROR, recorded_url
from kbfuse.workflow.jobs import CPU_WITHOUT_ARCH

PIN_TARGETS = ("results/kernelbench/pin.json",)


GPU_VISIBLE = torch.cuda.is_available()  # as test_no_gpu decides it


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
    """A workflow copy with KernelBench pinned from the test repository at its own path."""
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


# --------------------------------------------------------------------------- messages


def output_of(proc: subprocess.CompletedProcess) -> str:
    return proc.stdout + proc.stderr


def test_the_cpu_target_without_an_architecture_says_why_it_compiles_nothing(pinned):
    workdir, kb = pinned
    config = write_test_config(workdir, *kb)
    for dry in ([], ["-n"]):
        args = [*dry, "--cores", "1", "cpu", "--configfile", str(config), "--config", "arch=auto"]
        out = output_of(snakemake(workdir, *args))
        assert out.count(CPU_WITHOUT_ARCH) == 1, out
        assert CPU_WITHOUT_ARCH.startswith("kbfuse: the cpu target compiles no kernel")
        assert "--config arch=sm_90" in CPU_WITHOUT_ARCH
    # Named architecture, or another target: no such line.
    out = output_of(snakemake(workdir, "-n", "--cores", "1", "cpu", "--configfile", str(config)))
    assert "compiles no kernel" not in out
    assert "rule compile_variant:" in out
    args = ["-n", "--cores", "1", "results/kernelbench/pin.json", "--configfile", str(config)]
    out = output_of(snakemake(workdir, *args, "--config", "arch=auto"))
    assert "compiles no kernel" not in out


def test_a_failing_job_says_its_message_once_without_a_traceback(tmp_path, kb_repo):
    workdir = copy_workflow(tmp_path / "wf")
    absent = "0123456789abcdef0123456789abcdef01234567"
    config = write_test_config(workdir, kb_repo[0], absent)
    args = ["--cores", "1", "results/kernelbench/checkout.json", "--configfile", str(config)]
    proc = snakemake(workdir, *args, check=False)
    out = output_of(proc)
    assert proc.returncode == 1
    message = f"kernelbench.commit {absent} is not in the repository"
    assert out.count(message) == 1, out
    assert f"kbfuse: kernelbench_checkout failed: {message}" in proc.stderr
    assert "Traceback" not in out
    assert "Error in rule kernelbench_checkout" in out
    assert "Shell command" not in out
    log = (workdir / "results/logs/kernelbench/checkout.log").read_text()
    assert log.count(message) == 1 and "Traceback" not in log
    assert not (workdir / "results/kernelbench/checkout").exists()


@pytest.mark.skipif(
    GPU_VISIBLE, reason="a CUDA GPU is visible: the no-GPU failure cannot be provoked here"
)
def test_a_gpu_job_without_a_gpu_says_so_once(tmp_path, kb_repo):
    workdir = copy_workflow(tmp_path / "wf")
    config = write_test_config(workdir, *kb_repo)
    args = ["--cores", "1", "results/env/fingerprint.json", "--configfile", str(config)]
    proc = snakemake(workdir, *args, check=False)
    out = output_of(proc)
    assert proc.returncode == 1
    assert out.count("needs a CUDA GPU, but the CUDA driver sees none") == 1, out
    assert "kbfuse: env failed: stage 'env' needs a CUDA GPU" in proc.stderr
    assert "Traceback" not in out
    assert "Shell command" not in out


def test_a_held_lock_is_one_clear_message(pinned):
    """Snakemake's own message, without a traceback, naming the way out (--unlock)."""
    workdir, kb = pinned
    config = write_test_config(workdir, *kb)
    locks = workdir / ".snakemake" / "locks"
    locks.mkdir(parents=True, exist_ok=True)
    (locks / "0.output.lock").write_text("results/kernelbench/pin.json\n")
    try:
        args = ["--cores", "1", "cpu", "--configfile", str(config), "-R", "kernelbench_pin"]
        proc = snakemake(workdir, *args, check=False)
    finally:
        (locks / "0.output.lock").unlink()
    out = output_of(proc)
    assert proc.returncode == 1
    assert out.count("Directory cannot be locked") == 1
    assert "the --unlock argument" in out
    assert "Traceback" not in out
    assert jobs_planned(out) == []


def test_a_mirror_named_dot_git_leaves_no_spelling_of_its_path_in_the_log(kb_repo, tmp_path):
    """git prints "From file:///srv/KernelBench" for /srv/KernelBench.git: that is hidden too
    (the H200 reference's checkout log once kept it)."""
    from kbfuse.tasks.kernelbench import pin_kernelbench

    url, commit = kb_repo
    mirror = tmp_path / "mirrors" / "KernelBench.git"
    subprocess.run(["git", "clone", "-q", "--bare", url, str(mirror)], check=True)
    log = tmp_path / "checkout.log"
    pin_kernelbench(str(mirror), commit, 2, [53], tmp_path / "checkout", tmp_path / "pin.json", log)
    text = log.read_text()
    assert "From local mirror" in text
    assert str(tmp_path / "mirrors") not in text
    assert read_json(tmp_path / "pin.json")["url"] == LOCAL_MIRROR
