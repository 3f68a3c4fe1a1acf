"""How far two runs of one audit agree: the candidates checked in both, their verdicts, failed
checks and findings, and their measured speedups (second / first) per timing method.

Reads two audit folders (results/audit/<name> of two runs, e.g. unpacked from two commits'
resume/results.tar.gz); kbfuse.audit.repeat says what each figure is. No GPU needed.

    python benchmarks/audit_repeat.py FIRST SECOND [--names A B] [--json PATH]
        [--markdown PATH]
"""

from __future__ import annotations

import argparse
import sys

from kbfuse.audit.repeat import audit_repeat, report_markdown
from kbfuse.errors import KbfuseError
from kbfuse.results.reports import emit_report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("first", help="the first run's audit folder")
    parser.add_argument("second", help="the second run's audit folder")
    parser.add_argument(
        "--names", nargs=2, default=("first", "second"), help="the two runs' names in the tables"
    )
    parser.add_argument("--json", help="also write the report as JSON here")
    parser.add_argument("--markdown", help="also write the tables as Markdown here")
    args = parser.parse_args(argv)
    try:
        report = audit_repeat(args.first, args.second)
    except (KbfuseError, OSError) as exc:
        print(f"audit_repeat: {exc}", file=sys.stderr)
        return 1
    emit_report(report, report_markdown(report, *args.names), args.json, args.markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
