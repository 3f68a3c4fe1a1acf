"""Issue 5: bad inputs, through Snakemake in a copy of the workflow.

Each bad input (wrong commit, missing task, unreachable URL, a kernel that does not compile)
must fail with a message that names the problem, leave no output of the failing job, and
start no job downstream of it. The runs use --keep-going, so jobs that do not depend on the
failure still run: "nothing downstream" is then the DAG's doing, not Snakemake stopping early.
The fifth case, a task file edited after pinning, is caught by kbfuse.tasks.kernelbench.load_task,
which every GPU stage calls before it imports a task.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
from conftest import copy_workflow, snakemake, write_test_config
from kbrepo import make_kernelbench_repo

from kbfuse.errors import KbfuseError
from kbfuse.io import sha256_file
from kbfuse.tasks.kernelbench import load_task, read_pin

DATA = Path(__file__).resolve().parent / "data"
PIN = "results/kernelbench/pin.json"
CHECKOUT_OUTPUTS = ("results/kernelbench/checkout", "results/kernelbench/checkout.json")
WRONG_COMMIT = "0123456789abcdef0123456789abcdef01234567"  # well formed, in no repository


def started(out: str, rule: str) -> bool:
    """Whether Snakemake started a job of `rule` (it prints "localrule <rule>:" for each)."""
    return re.search(rf"^(?:local)?rule {rule}:$", out, re.MULTILINE) is not None


def run_failing(workdir: Path, *args: str) -> str:
    proc = snakemake(workdir, "--cores", "1", "--keep-going", *args, check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    assert not list(workdir.glob(".snakemake/incomplete/*")), "a job was left marked incomplete"
    return out


def results_files(workdir: Path) -> set[str]:
    root = workdir / "results"
    return {p.relative_to(workdir).as_posix() for p in root.rglob("*") if p.is_file()}


@pytest.fixture(scope="module")
def repo_without_95(tmp_path_factory) -> tuple[str, str]:
    return make_kernelbench_repo(tmp_path_factory.mktemp("kb-53-81"), tasks=(53, 81))


def _checkout_case(case: str, kb_repo, repo_without_95, tmp_path) -> tuple[dict, list[str]]:
    """(config overlay, words the error must contain) for one bad KernelBench input."""
    url, commit = kb_repo
    if case == "wrong-commit":
        return (
            {"kernelbench": {"url": url, "commit": WRONG_COMMIT}},
            [f"kernelbench.commit {WRONG_COMMIT} is not in the repository", url],
        )
    if case == "missing-task":
        url95, commit95 = repo_without_95
        return (
            {"kernelbench": {"url": url95, "commit": commit95}, "tasks": [53, 81, 95]},
            ["task 95: no file matches KernelBench/level2/95_*.py", f"at commit {commit95}"],
        )
    assert case == "unreachable-url"
    nowhere = str(tmp_path / "no" / "such" / "KernelBench.git")
    return (
        {"kernelbench": {"url": nowhere, "commit": commit}},
        [f"kernelbench.url {nowhere!r} is unreachable or not a git repository"],
    )


@pytest.mark.parametrize("case", ["wrong-commit", "missing-task", "unreachable-url"])
def test_bad_kernelbench_input_stops_the_checkout_and_everything_after_it(
    tmp_path, kb_repo, repo_without_95, case
):
    workdir = copy_workflow(tmp_path / "wf")
    overlay, words = _checkout_case(case, kb_repo, repo_without_95, tmp_path)
    kernelbench = overlay.pop("kernelbench")
    config = write_test_config(workdir, kernelbench["url"], kernelbench["commit"], **overlay)

    out = run_failing(workdir, PIN, "--configfile", str(config))
    for word in words:
        assert word in out, f"{word!r} missing from:\n{out}"
    assert "Error in rule kernelbench_checkout" in out
    log = workdir / "results/logs/kernelbench/checkout.log"
    assert words[0] in log.read_text()
    # No output of the failing job, nothing downstream started or written.
    for path in CHECKOUT_OUTPUTS:
        assert not (workdir / path).exists(), path
    assert started(out, "kernelbench_checkout")
    for rule in ("kernelbench_task", "kernelbench_pin"):
        assert not started(out, rule), rule
    assert results_files(workdir) == {"results/logs/kernelbench/checkout.log"}


def test_kernel_that_does_not_compile_shows_the_compiler_log_and_stops_its_dependents(
    tmp_path, kb_repo
):
    workdir = copy_workflow(tmp_path / "wf")
    shutil.copy(DATA / "broken.cu", workdir / "kernels" / "broken.cu")
    broken = {"route": "nvrtc-ptx", "kernel": "broken", "options": ["--std=c++11"]}
    # The default NVRTC only: its NVRTC 12.9 twins would be five more compiles that --keep-going
    # runs and this case does not look at.
    config = write_test_config(
        workdir, *kb_repo, tasks=[81], variants={"broken": broken}, nvrtc_versions=[]
    )
    # verify_variants depends on every compile (and on the KernelBench pin, which is fine):
    # the pin must be made, the compile must fail, verify must never start.
    out = run_failing(workdir, "results/verify/broken.json", "--configfile", str(config))

    nvrtc_error = 'broken.cu(12): error: expected a ";"'
    assert "Error in rule compile_variant" in out
    assert "failed to compile broken.cu" in out
    assert nvrtc_error in out  # the compiler's own log, in Snakemake's report
    log = (workdir / "results/logs/compile/broken.log").read_text()
    assert nvrtc_error in log and "--- NVRTC log ---" in log
    assert "route: nvrtc-ptx" in log and "requested options: --std=c++11" in log

    compile_dir = workdir / "results/compile/broken"
    assert not compile_dir.exists() or not any(compile_dir.iterdir())
    assert not (workdir / "results/benchmarks/compile/broken.tsv").exists()
    assert started(out, "compile_variant") and not started(out, "verify_variants")
    assert not (workdir / "results/logs/verify/variants.log").exists()
    assert not (workdir / "results/verify").exists()
    # The independent part of the DAG ran to completion (--keep-going).
    assert (workdir / "results/kernelbench/tasks/81.json").is_file()


def test_task_file_changed_after_pinning_is_refused_naming_file_and_hashes(tmp_path, kb_repo):
    workdir = copy_workflow(tmp_path / "wf")
    config = write_test_config(workdir, *kb_repo, tasks=[53, 81])
    # The CPU rules that pin KernelBench (the `cpu` target also compiles, which this
    # case does not need).
    snakemake(workdir, "--cores", "1", PIN, "--configfile", str(config))
    checkout = workdir / "results/kernelbench/checkout"
    pin = read_pin(workdir / "results/kernelbench/tasks/81.json")
    assert load_task(checkout, pin, 81).sha256 == pin["tasks"]["81"]["sha256"]

    (task_file,) = checkout.glob("KernelBench/level2/81_*.py")
    pinned = pin["tasks"]["81"]["sha256"]
    task_file.write_text(task_file.read_text().replace("x / 2.0", "x / 3.0"))
    edited = sha256_file(task_file)
    assert edited != pinned
    with pytest.raises(KbfuseError, match="changed after pinning") as info:
        load_task(checkout, pin, 81)
    message = str(info.value)
    assert str(task_file) in message
    assert "changed after pinning" in message
    assert pinned in message and edited in message
