"""The fused tails against the copy-bandwidth floor and Inductor, from the timing jobs' output.

For each task with a timing file (results/timing/{task}.json, the workflow's `timing` rule)
prints every implementation's CUDA-graph tail median, the tail's bytes moved, the copy floor
(bytes at the measured device-to-device copy bandwidth, results/env/fingerprint.json), the %
of that floor reached and the ratio to Inductor's median, and whether each variant of the
`fast` kernel meets the targets (<= 1.00 x Inductor, >= 85 % of the floor). No GPU needed:
it only reads result files (kbfuse.timing.roofline, a view over kbfuse.results.summary's
timing_tail table).

    python benchmarks/tail_roofline.py [--results results] [--task 53 ...]
        [--json PATH] [--markdown PATH]
    python benchmarks/tail_roofline.py --results results/reference/h200   # the committed run
"""

from __future__ import annotations

import argparse
import sys

from kbfuse.errors import KbfuseError
from kbfuse.results.reports import emit_report
from kbfuse.timing.roofline import TARGET_KERNELS, report_markdown, roofline


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--results", default="results", help="results directory (default: %(default)s)"
    )
    parser.add_argument(
        "--task",
        type=int,
        action="append",
        help="only this task (repeatable; default: every timing file)",
    )
    parser.add_argument(
        "--target-kernel",
        action="append",
        help="kernel whose variants are checked against the targets (repeatable; default: "
        + ", ".join(TARGET_KERNELS)
        + ")",
    )
    parser.add_argument("--json", help="also write the report as JSON here")
    parser.add_argument("--markdown", help="also write the table as Markdown here")
    args = parser.parse_args(argv)
    try:
        report = roofline(args.results, args.task, args.target_kernel or TARGET_KERNELS)
    except KbfuseError as exc:
        print(f"tail_roofline: {exc}", file=sys.stderr)
        return 1
    emit_report(report, report_markdown(report), args.json, args.markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
