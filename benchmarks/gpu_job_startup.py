"""Start-up cost of one GPU job of the workflow, phase by phase, each in fresh processes.

Times, in a fresh Python process per phase and round (medians over --repeats rounds):
interpreter start, `import torch`, `import cupy`, `import snakemake` (the `script:`
preamble), the kbfuse stage modules, CUDA init, loading the pinned KernelBench task and
building its model on the CPU, moving it to the GPU, and Inductor compiling the task's tail
with a cold and then a warm on-disk cache (kbfuse.workflow.startup). GPU phases are listed as not
measured where torch sees no GPU.

    python benchmarks/gpu_job_startup.py --checkout results/kernelbench/checkout \\
        --pin results/kernelbench/tasks/53.json [--task 53] [--repeats 3] \\
        [--phases import_torch,cuda_init] [--json PATH] [--markdown PATH]
"""

from __future__ import annotations

import argparse
import sys

from kbfuse.errors import KbfuseError
from kbfuse.results.reports import emit_report
from kbfuse.workflow.startup import PHASE_NAMES, measure, report_markdown


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--checkout",
        default="results/kernelbench/checkout",
        help="KernelBench checkout (default: %(default)s)",
    )
    parser.add_argument(
        "--pin",
        default="results/kernelbench/pin.json",
        help="pin record: results/kernelbench/pin.json or results/kernelbench/tasks/{task}.json "
        "(default: %(default)s)",
    )
    parser.add_argument("--task", type=int, default=53, help="task (default: %(default)s)")
    parser.add_argument("--repeats", type=int, default=3, help="rounds (default: %(default)s)")
    parser.add_argument(
        "--phases", help="comma-separated subset of: " + ", ".join(PHASE_NAMES) + " (default: all)"
    )
    parser.add_argument("--json", help="also write the report as JSON here")
    parser.add_argument("--markdown", help="also write the table as Markdown here")
    parser.add_argument("--quiet", action="store_true", help="no per-child progress lines")
    args = parser.parse_args(argv)
    phases = [p.strip() for p in args.phases.split(",") if p.strip()] if args.phases else None

    def progress(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    try:
        report = measure(
            args.checkout,
            args.pin,
            task=args.task,
            repeats=args.repeats,
            phases=phases,
            progress=None if args.quiet else progress,
        )
    except KbfuseError as exc:
        print(f"gpu_job_startup: {exc}", file=sys.stderr)
        return 1
    emit_report(report, report_markdown(report), args.json, args.markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
