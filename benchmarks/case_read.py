"""A check's case read by its parent: mapped (as now) against copied (as before), each with the
case's fingerprint; seconds and their ratio (kbfuse.candidates.readcost says what each figure
is). CPU only.

    python benchmarks/case_read.py [--gib 1] [--repeats 3] [--folder $TMPDIR]
        [--json PATH] [--markdown PATH]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from kbfuse.candidates.readcost import measure, report_markdown
from kbfuse.errors import KbfuseError
from kbfuse.results.reports import emit_report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gib", type=float, default=1.0, help="the case's size (%(default)s)")
    parser.add_argument("--repeats", type=int, default=3, help="times each way (%(default)s)")
    parser.add_argument("--folder", default=tempfile.gettempdir(), help="where to write")
    parser.add_argument("--json", help="also write the report as JSON here")
    parser.add_argument("--markdown", help="also write the table as Markdown here")
    args = parser.parse_args(argv)
    size = int(args.gib * 2**30) // 4 * 4
    try:
        report = measure(size, args.repeats, Path(args.folder))
    except (ValueError, OSError, KbfuseError) as exc:
        print(f"case_read: {exc}", file=sys.stderr)
        return 1
    emit_report(report, report_markdown(report), args.json, args.markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
