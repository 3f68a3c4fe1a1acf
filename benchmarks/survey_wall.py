"""Where a finished survey's wall time went: start-up, compiles and timing, per job and in all.

Reads the survey jobs' Snakemake benchmark files (results/benchmarks/survey/{task}.tsv; for
another level survey/level<N>/{task}.tsv), their logs and records (kbfuse.survey.wall says how
each phase is measured), and optionally the Snakemake run log for the run's wall time. No GPU
needed: it only reads files.

    python benchmarks/survey_wall.py [--results results] [--level 2] [--snakemake-log PATH]
        [--snakemake-log PATH ...] [--json PATH] [--markdown PATH]
"""

from __future__ import annotations

import argparse
import sys

from kbfuse.errors import KbfuseError
from kbfuse.results.reports import emit_report
from kbfuse.survey.wall import report_markdown, survey_wall


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", default="results", help="results directory (%(default)s)")
    parser.add_argument(
        "--snakemake-log",
        action="append",
        help="the run's .snakemake/log/*.snakemake.log; again for each piece of a resumed run",
    )
    parser.add_argument("--level", type=int, default=2, help="KernelBench level (%(default)s)")
    parser.add_argument("--json", help="also write the report as JSON here")
    parser.add_argument("--markdown", help="also write the tables as Markdown here")
    args = parser.parse_args(argv)
    try:
        report = survey_wall(args.results, args.snakemake_log, args.level)
    except (KbfuseError, OSError) as exc:
        print(f"survey_wall: {exc}", file=sys.stderr)
        return 1
    emit_report(report, report_markdown(report), args.json, args.markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
