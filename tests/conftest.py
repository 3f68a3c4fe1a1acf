"""Shared fixtures (a throw-away copy of the workflow, a small KernelBench-shaped repo) and
the suite's skip accounting.

Skips are never silent: a test that cannot run here is skipped by a marker or condition
whose reason is printed (-ra), and with KBFUSE_CHECK_SKIPS=1 (set by CI) the session fails
when the tests skipped differ from tests/expected_skips.txt, naming the difference. Tests
marked `nvcc` are skipped, and so counted, where no working nvcc is found; tests marked `slurm`
where tools/slurm-local.sh cannot start a cluster (Slurm, munge or MariaDB not installed).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))

# The suite starts hundreds of Python processes (Snakemake, its jobs, the checks' children)
# that import kbfuse. Where PYTHONDONTWRITEBYTECODE is set (some CI images set it), each of
# them compiled every module it imported again: about 20 of the suite's 230 s on two cores.
# The tests write bytecode caches (__pycache__, ignored by git) and their children read them;
# candidate processes still write none (kbfuse.candidates.sandbox).
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False

from kbrepo import make_kernelbench_repo  # noqa: E402

# Rules whose jobs run on the GPU (compile_variant too, for CuPy's route or arch: auto): those
# that time or measure the device hold it alone (`gpu=1`); those that only compute share it
# (`gpu_jobs=1`), never beside a timing job (kbfuse.workflow.gpulock).
ALONE_GPU_RULES = {"env_fingerprint", "timing", "controls", "witness81"}
SHARED_GPU_RULES = {"verify_variants", "correctness_variants", "correctness_baselines"}
GPU_RULES = ALONE_GPU_RULES | SHARED_GPU_RULES

WORKFLOW_FILES = ("Snakefile", "workflow", "config", "kernels", "src", "profiles", "envs")

# Modules whose tests run Snakemake or a kbfuse child process end to end (seconds to tens of
# seconds each); with every test that copies the workflow they are marked `slow`, so that
# `pytest -m "not gpu and not slow"` is a quick loop while editing. CI runs them all.
SLOW_MODULES = {
    "test_audit_workflow",
    "test_bad_inputs",
    "test_check_candidates",
    "test_check_escapes",
    "test_check_hostile",
    "test_check_workflow",
    "test_concurrency",
    "test_gpu_job_startup",
    "test_interruption",
    "test_newcomer_cluster",
    "test_newcomer_report",
    "test_no_gpu",
    "test_reference_summary",
    "test_report",
    "test_slurm",
    "test_snakefork",
    "test_workflow",
}


def _is_slow(item) -> bool:
    copies = "workflow_copy" in getattr(item, "fixturenames", ())
    return _module_name(item) in SLOW_MODULES or copies


def pytest_collection_modifyitems(config, items):
    for item in items:
        if _is_slow(item):
            item.add_marker(pytest.mark.slow)
    _deselect_multigpu(config, items)
    _skip_without_nvcc(items)
    _skip_without_slurm(items)
    items.sort(key=_module_rank(items))


def _deselect_multigpu(config, items) -> None:
    """Tests marked `multigpu` (two GPUs or more) run only when the -m expression names them:
    `pytest -m gpu` on a one-GPU machine leaves them out rather than skipping them."""
    if "multigpu" in (config.getoption("markexpr") or ""):
        return
    chosen, left_out = [], []
    for item in items:
        (chosen if item.get_closest_marker("multigpu") is None else left_out).append(item)
    if left_out:
        config.hook.pytest_deselected(items=left_out)
        items[:] = chosen


# --------------------------------------------------------------------------- distribution
#
# README's command is `pytest -n auto`. The suite's time is its child processes' (Snakemake
# and its jobs, candidates, compiles), and a test waits for them about a fifth of its wall time
# (locks, polls, the time limits it tests), so `auto` starts half as many workers again as there
# are cores: the waits of one overlap the work of the others (docs/newcomer.md has the figures).
# Work goes out a file at a time (`--dist loadfile`): a module's fixtures (a workflow run, a set
# of checked candidates) are then built once, not once on each worker that gets one of its
# tests. The files go out in the order below, longest first, so that no long file starts last
# and keeps one worker busy after the others have finished. An explicit -n or --dist wins.

# The longest files on two cores, longest first (docs/newcomer.md's run); then the other
# modules marked slow, then the rest, each group in collection order.
LONGEST_FIRST = (
    "test_slurm",
    "test_interruption",
    "test_survey_workflow",
    "test_check_hostile",
    "test_check_candidates",
    "test_check_escapes",
    "test_check_workflow",
    "test_concurrency",
    "test_reference_integrity",
    "test_newcomer_workflow",
    "test_workflow",
)


def _module_name(item) -> str:
    return getattr(getattr(item, "module", None), "__name__", "")


def _module_rank(items):
    """Sort key of an item: its module's place in LONGEST_FIRST, then slow modules, then the
    rest (a module's items stay together and in their order: the sort is stable)."""
    slow = {_module_name(item) for item in items if item.get_closest_marker("slow")}

    def rank(item) -> int:
        name = _module_name(item)
        if name in LONGEST_FIRST:
            return LONGEST_FIRST.index(name)
        return len(LONGEST_FIRST) + (0 if name in slow else 1)

    return rank


# More workers than this only wait for the longest file (about a minute alone), while each
# one imports torch and collects every test.
MAX_AUTO_WORKERS = 8


def auto_workers(cores: int) -> int:
    """Workers for `cores` cores: half as many again (at least one more), at most
    MAX_AUTO_WORKERS."""
    return min(cores + max(1, cores // 2), MAX_AUTO_WORKERS)


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist, absent under -p no:xdist
def pytest_xdist_auto_num_workers(config):
    """Workers for `-n auto`: auto_workers of the cores this process may use.
    PYTEST_XDIST_AUTO_NUM_WORKERS, where set, decides, as in pytest-xdist."""
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None  # pytest-xdist's own hook reads it
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return auto_workers(cores or 1)


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config):
    """`-n N` without --dist: whole files to each worker, in collection order (see above)."""
    option = config.option
    if getattr(option, "numprocesses", None) and option.dist == "no" and not option.distload:
        # (numprocesses exists only where pytest-xdist is loaded)
        option.dist = "loadfile"
        option.loadscopereorder = False


# Every job the tests start takes the GPU lock (kbfuse.workflow.gpulock); by default its files
# are in the system's temporary folder, shared with any other test run or workflow on the
# machine, where one could make the other wait. Each test process gets a folder of its own.
os.environ.setdefault("KBFUSE_GPU_LOCK_DIR", tempfile.mkdtemp(prefix="kbfuse-test-locks-"))

# As the session found them: torch.compile run in this process (in a test or a module fixture)
# writes Inductor's default cache folder into os.environ["TORCHINDUCTOR_CACHE_DIR"], and a later
# test's Snakemake jobs inherited it and compiled there instead of the survey's shared cache.
COMPILE_CACHE_VARIABLES = {
    key: os.environ.get(key) for key in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")
}


@pytest.fixture(autouse=True)
def _compile_cache_variables_restored():
    yield
    for key, value in COMPILE_CACHE_VARIABLES.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@pytest.fixture(scope="session")
def kb_repo(tmp_path_factory) -> tuple[str, str]:
    """(url, commit) of a small KernelBench-shaped git repository."""
    return make_kernelbench_repo(tmp_path_factory.mktemp("kernelbench"))


def copy_workflow(dest: Path, variants: list[str] | None = None) -> Path:
    """A copy of the workflow in `dest`; with `variants`, its config/config.yaml keeps only
    those (a config overlay can add variants to the mapping but not remove any)."""
    dest.mkdir(parents=True, exist_ok=True)
    for name in WORKFLOW_FILES:
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(
                src, dest / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info")
            )
        else:
            shutil.copy2(src, dest / name)
    if variants is not None:
        study = dest / "config" / "config.yaml"
        config = yaml.safe_load(study.read_text())
        config["variants"] = {v: config["variants"][v] for v in variants}
        study.write_text(yaml.safe_dump(config, sort_keys=False))
    return dest


def json_paths(node, prefix=()):
    """Every path (tuple of keys and indexes) into a JSON value, the value itself first."""
    yield prefix
    if isinstance(node, dict):
        for key, value in node.items():
            yield from json_paths(value, (*prefix, key))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from json_paths(value, (*prefix, index))


def write_test_config(workdir: Path, url: str, commit: str, **overrides) -> Path:
    """A config overlay pointing at the test KernelBench repo, compiling for sm_90 on the CPU."""
    cfg = {"kernelbench": {"url": url, "commit": commit}, "arch": "sm_90", **overrides}
    path = workdir / "test-config.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def snakemake(
    workdir: Path,
    *args: str,
    check: bool = True,
    env: dict | None = None,
    timeout: float = 600,
) -> subprocess.CompletedProcess:
    """Run snakemake in `workdir`, the copied workflow's own kbfuse sources first on the path
    (a process of its own, forked from one that has imported Snakemake: tests/snakefork.py)."""
    import snakefork  # here: a copy of this conftest without its neighbours still loads

    env = dict(os.environ if env is None else env)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(workdir / "src"), env.get("PYTHONPATH")]))
    proc = snakefork.run(args, cwd=workdir, env=env, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(
            f"snakemake {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
        )
    return proc


@pytest.fixture
def workflow_copy(tmp_path, kb_repo) -> tuple[Path, Path]:
    """(workdir, config overlay) of a fresh copy of the workflow wired to the test repo."""
    workdir = copy_workflow(tmp_path / "wf")
    return workdir, write_test_config(workdir, *kb_repo)


_COMPILE_IN_CHILD = """
import json, sys
from kbfuse.compilation.compile import compile_variant
a = json.loads(sys.argv[1])
compile_variant(a["source"], a["variant"], a["spec"], a["arch"], artifact=a["artifact"],
                meta=a["meta"], log=a["log"])
"""


def compile_in_child(out: Path, source, variant: str, spec: dict, arch: str = "auto"):
    """(artifact, meta path) of `source` compiled by kbfuse.compilation.compile into `out`, in a
    child
    process with an isolated CUDA compute cache: a test process that has already started CUDA
    cannot isolate its own cache any more (kbfuse.compilation.cudacache), and the cache's key
    ignores
    --ftz, so compiles must not see an earlier one."""
    from kbfuse.compilation import cudacache

    out.mkdir(parents=True, exist_ok=True)
    args = {
        "source": str(source),
        "variant": variant,
        "spec": spec,
        "arch": arch,
        "artifact": str(out / "tails.bin"),
        "meta": str(out / "meta.json"),
        "log": str(out / "compile.log"),
    }
    env = cudacache.isolated_env(out / "scratch")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "src"), env.get("PYTHONPATH")]))
    proc = subprocess.run(
        [sys.executable, "-c", _COMPILE_IN_CHILD, json.dumps(args)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, f"compiling {variant} failed:\n{proc.stdout}\n{proc.stderr}"
    return out / "tails.bin", out / "meta.json"


@pytest.fixture(scope="module")
def isolated_process(tmp_path_factory):
    """Isolate this process's CUDA caches once, before its first compile, as every workflow job
    does: with a driver present, NVRTC's cubins pass through the CUDA compute cache, whose key
    ignores --ftz (docs/findings.md, "Hidden compiler settings"). For modules that compile
    in-process (`pytestmark = pytest.mark.usefixtures("isolated_process")`); the environment
    is restored at the end of the module."""
    from kbfuse.compilation import cudacache
    from kbfuse.errors import KbfuseError

    saved = dict(os.environ)
    if not cudacache.current_setting()["isolated"]:
        try:
            cudacache.isolate(tmp_path_factory.mktemp("cudacache"))
        except KbfuseError as exc:
            pytest.skip(f"run this module in a process of its own: {exc}")
    yield
    os.environ.clear()
    os.environ.update(saved)


# --------------------------------------------------------------------------- skip accounting

EXPECTED_SKIPS = Path(__file__).resolve().parent / "expected_skips.txt"
CHECK_SKIPS_VARIABLE = "KBFUSE_CHECK_SKIPS"
_skipped: set[str] = set()


def read_expected_skips(path: Path = EXPECTED_SKIPS) -> set[str]:
    """Node ids listed in `path`, one a line; blank lines and '#' comments ignored."""
    lines = (line.split("#", 1)[0].strip() for line in path.read_text().splitlines())
    return {line for line in lines if line}


def skip_problems(expected: set[str], skipped: set[str]) -> list[str]:
    """Lines naming every test skipped unexpectedly or expected to skip but run; [] if none."""
    if expected == skipped:
        return []
    problems = [f"{len(skipped)} tests skipped, {len(expected)} expected ({EXPECTED_SKIPS.name})"]
    problems += [f"skipped, not expected: {nodeid}" for nodeid in sorted(skipped - expected)]
    problems += [f"expected to skip, did not: {nodeid}" for nodeid in sorted(expected - skipped)]
    return problems


def _skip_without_nvcc(items) -> None:
    """Tests marked `nvcc` skip (and are counted) where no working nvcc is found."""
    nvcc_tests = [item for item in items if item.get_closest_marker("nvcc")]
    if not nvcc_tests:
        return
    from kbfuse.compilation.compile import find_nvcc
    from kbfuse.errors import KbfuseError

    try:
        find_nvcc()
    except KbfuseError as exc:
        for item in nvcc_tests:
            item.add_marker(pytest.mark.skip(reason=f"no working nvcc: {exc}"))


def _skip_without_slurm(items) -> None:
    """Tests marked `slurm` skip (and are counted) where no test cluster can start, with the
    script's reason (what is missing and the apt-get line that installs it)."""
    slurm_tests = [item for item in items if item.get_closest_marker("slurm")]
    if not slurm_tests:
        return
    import slurmcluster

    reason = slurmcluster.missing()
    if reason:
        for item in slurm_tests:
            item.add_marker(pytest.mark.skip(reason=reason))


def pytest_runtest_logreport(report):
    if report.skipped and not hasattr(report, "wasxfail"):
        _skipped.add(report.nodeid)


def pytest_sessionfinish(session, exitstatus):
    if os.environ.get(CHECK_SKIPS_VARIABLE) != "1" or hasattr(session.config, "workerinput"):
        return  # only the whole suite, on the controller, is checked
    problems = skip_problems(read_expected_skips(), _skipped)
    if problems:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        for line in ["skip count check failed:", *problems]:
            reporter.write_line(line, red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
