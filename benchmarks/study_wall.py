"""Where a finished study's wall time went: seconds per stage, the stages that hold the GPU
alone, the run's wall time and parallelism.

Reads the jobs' Snakemake benchmark files (results/benchmarks/<stage>/...tsv, the survey's
left out: benchmarks/survey_wall.py reports those) and optionally the Snakemake run log for
the run's wall time (kbfuse.results.jobtimes). No GPU needed: it only reads files.

    python benchmarks/study_wall.py [--results results] [--snakemake-log PATH]
        [--json PATH] [--markdown PATH]
"""

from __future__ import annotations

import argparse
import sys

from kbfuse.errors import KbfuseError
from kbfuse.results.jobtimes import study_markdown, study_wall
from kbfuse.results.reports import emit_report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", default="results", help="results directory (%(default)s)")
    parser.add_argument("--snakemake-log", help="the run's .snakemake/log/*.snakemake.log")
    parser.add_argument("--json", help="also write the report as JSON here")
    parser.add_argument("--markdown", help="also write the table as Markdown here")
    args = parser.parse_args(argv)
    try:
        report = study_wall(args.results, args.snakemake_log)
    except (KbfuseError, OSError) as exc:
        print(f"study_wall: {exc}", file=sys.stderr)
        return 1
    emit_report(report, study_markdown(report), args.json, args.markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
