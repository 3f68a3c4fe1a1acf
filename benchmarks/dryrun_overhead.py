"""Snakemake's own overhead: a no-op dry-run of the full study against a trivial Snakefile.

Builds, in a temporary directory, the study's workflow wired to a small KernelBench-shaped
repository, runs its CPU part for real, stands in for the GPU outputs with placeholder files
(as tests/test_workflow.py does) so that `snakemake -n all` has nothing to do, and times that
no-op beside the same dry-run of a one-rule Snakefile. Prints medians of N runs and the ratio.
With --study-dir it times instead the real study in that directory (after a full run, so
that nothing is left to do), with the Snakemake arguments given after `--`.

    python benchmarks/dryrun_overhead.py [-n N]
    python benchmarks/dryrun_overhead.py -n 5 --study-dir . -- --config kernelbench="{...}"
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1] / "tests"
sys.path.insert(0, str(TESTS))

from conftest import copy_workflow, snakemake, write_test_config  # noqa: E402
from kbrepo import make_kernelbench_repo  # noqa: E402
from test_workflow import _stand_in_for_gpu_outputs, planned_jobs  # noqa: E402

TRIVIAL = """rule all:
    input:
        "a.txt",


rule a:
    output:
        "a.txt",
    shell:
        "touch {output}"
"""


def timed(cmd: list[str], cwd: Path, env: dict, n: int) -> list[float]:
    out = []
    for _ in range(n):
        start = time.perf_counter()
        proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
        out.append(time.perf_counter() - start)
        assert "Nothing to be done" in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    return out


def time_trivial(root: Path, env: dict, n: int) -> list[float]:
    trivial = root / "trivial"
    trivial.mkdir()
    (trivial / "Snakefile").write_text(TRIVIAL)
    snake = [sys.executable, "-m", "snakemake", "--cores", "1"]
    subprocess.run(snake, cwd=trivial, env=env, check=True, capture_output=True)
    return timed([*snake, "--dry-run"], trivial, env, n)


def test_copy(root: Path, n: int) -> tuple[list[float], list[float], str]:
    url, commit = make_kernelbench_repo(root / "kernelbench")
    study = copy_workflow(root / "study")
    overlay = write_test_config(study, url, commit)
    snakemake(study, "--cores", "2", "cpu", "--configfile", str(overlay))
    _stand_in_for_gpu_outputs(study, overlay)
    jobs = len(planned_jobs(study, "all", "--configfile", str(overlay), "--forceall"))
    assert planned_jobs(study, "all", "--configfile", str(overlay)) == set()
    env = dict(os.environ, PYTHONPATH=str(study / "src"))
    snake = [sys.executable, "-m", "snakemake", "--dry-run", "--cores", "1"]
    t_study = timed([*snake, "all", "--configfile", str(overlay)], study, env, n)
    return t_study, time_trivial(root, env, n), f"test copy, {jobs} jobs"


def real_study(study: Path, args: list[str], root: Path, n: int):
    env = dict(os.environ)
    snake = [sys.executable, "-m", "snakemake", "--dry-run", "--cores", "1", "all", *args]
    t_study = timed(snake, study, env, n)
    return t_study, time_trivial(root, env, n), f"study in {study}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=7, help="runs of each dry-run (median)")
    parser.add_argument("--study-dir", type=Path, help="a study that has run: time it instead")
    parser.add_argument("snakemake_args", nargs="*", help="after --: Snakemake arguments")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        if args.study_dir:
            t_study, t_trivial, what = real_study(
                args.study_dir, args.snakemake_args, Path(tmp), args.n
            )
        else:
            t_study, t_trivial, what = test_copy(Path(tmp), args.n)
    med_s, med_t = statistics.median(t_study), statistics.median(t_trivial)
    print(f"no-op dry-run, full study ({what}): median {med_s:.2f} s over {args.n}")
    print(f"dry-run, one-rule Snakefile: median {med_t:.2f} s over {args.n}")
    print(f"ratio: {med_s / med_t:.2f} (target <= 2)")


if __name__ == "__main__":
    main()
