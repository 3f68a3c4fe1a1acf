"""Snakemake's own overhead: a no-op dry-run of the full study against a trivial Snakefile.

Builds, in a temporary directory, the study's workflow wired to a small KernelBench-shaped
repository, runs its CPU part for real, stands in for the GPU outputs with placeholder files
(as tests/test_workflow.py does) so that `snakemake -n all` has nothing to do, and times that
no-op beside the same dry-run of a one-rule Snakefile. Prints medians of N runs and the ratio.

    python benchmarks/dryrun_overhead.py [N]
"""

from __future__ import annotations

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


def main(n: int = 7) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        url, commit = make_kernelbench_repo(root / "kernelbench")
        study = copy_workflow(root / "study")
        overlay = write_test_config(study, url, commit)
        snakemake(study, "--cores", "2", "cpu", "--configfile", str(overlay))
        _stand_in_for_gpu_outputs(study, overlay)
        assert planned_jobs(study, "all", "--configfile", str(overlay)) == set()
        trivial = root / "trivial"
        trivial.mkdir()
        (trivial / "Snakefile").write_text(TRIVIAL)
        env = dict(os.environ, PYTHONPATH=str(study / "src"))
        snake = [sys.executable, "-m", "snakemake", "--dry-run", "--cores", "1"]
        subprocess.run(
            [*snake[:3], "--cores", "1"], cwd=trivial, env=env, check=True, capture_output=True
        )
        t_study = timed([*snake, "all", "--configfile", str(overlay)], study, env, n)
        t_trivial = timed(snake, trivial, env, n)
    med_s, med_t = statistics.median(t_study), statistics.median(t_trivial)
    print(f"no-op dry-run, full study (47 jobs): median {med_s:.2f} s over {n}")
    print(f"dry-run, one-rule Snakefile:         median {med_t:.2f} s over {n}")
    print(f"ratio: {med_s / med_t:.2f} (target <= 2)")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 7)
