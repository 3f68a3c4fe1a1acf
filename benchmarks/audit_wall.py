"""Where an audit's wall time went: the checker's phases and the candidates' stages, per check
and summed, and how the spread-sized timing blocks ended.

Reads the audit's verdicts (results/audit/<name>/verdicts/*/*.json; kbfuse.audit.wall says
what each figure is) and optionally the Snakemake run log(s) for the run's wall time. No GPU
needed: it only reads files.

    python benchmarks/audit_wall.py [--audit results/audit/cuda_l1_h100]
        [--snakemake-log PATH ...] [--json PATH] [--markdown PATH]
"""

from __future__ import annotations

import argparse
import sys

from kbfuse.audit.wall import audit_wall, report_markdown
from kbfuse.errors import KbfuseError
from kbfuse.results.reports import emit_report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--audit", default="results/audit/cuda_l1_h100", help="the audit's folder (%(default)s)"
    )
    parser.add_argument(
        "--snakemake-log",
        action="append",
        help="the run's .snakemake/log/*.snakemake.log; again for each piece of a resumed run",
    )
    parser.add_argument("--json", help="also write the report as JSON here")
    parser.add_argument("--markdown", help="also write the tables as Markdown here")
    args = parser.parse_args(argv)
    try:
        report = audit_wall(args.audit, args.snakemake_log)
    except (KbfuseError, OSError) as exc:
        print(f"audit_wall: {exc}", file=sys.stderr)
        return 1
    emit_report(report, report_markdown(report), args.json, args.markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
