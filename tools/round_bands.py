"""Split one timed block's rounds into two bands by their level and show each implementation
in both (kbfuse.results.rounds). No GPU needed: it only reads a run's records.

    python tools/round_bands.py [--results results/reference/h200] TASK BLOCK

BLOCK as in the summary's position_effect table: full/graph, tail/events, small/tail/graph,
ftz_cost/nvrtc-cubin, ... docs/findings.md reads the H200 reference's task-81 small-shape tail
with `python tools/round_bands.py 81 small/tail/graph`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from kbfuse.errors import KbfuseError
from kbfuse.results.rounds import bands_markdown, read_block, two_bands

DEFAULT = Path(__file__).resolve().parents[1] / "results/reference/h200"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=DEFAULT, help="a run's results folder")
    parser.add_argument("task", type=int)
    parser.add_argument("block")
    args = parser.parse_args(argv)
    try:
        bands = two_bands(read_block(args.results, args.task, args.block))
    except (KbfuseError, OSError) as exc:
        print(f"round_bands: {exc}", file=sys.stderr)
        return 1
    sys.stdout.write(bands_markdown(args.task, args.block, bands))
    return 0


if __name__ == "__main__":
    sys.exit(main())
