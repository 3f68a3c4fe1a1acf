"""The `kbfuse` command: verify a result bundle, compare bundles, rebuild a summary.

    kbfuse verify-bundle BUNDLE [--json]
    kbfuse compare BUNDLE BUNDLE [...] --out DIR
    kbfuse summarize RESULTS_DIR --config CONFIG --out DIR

`summarize` is the CPU-only way to rebuild the tables and plots of a finished run (for
example results/reference/h200) from its result files: the same `write_summary` call as the
summary rule, with the config of that run.

Exit status: 0 when everything checks out, 1 when a bundle has changed, missing or extra
files (or a manifest problem), 2 when the input is refused (not a bundle, unsafe member path,
failed verification before a comparison, bad arguments; for `summarize`: a config or result
file that is missing, malformed or stale).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

import yaml

from kbfuse.errors import KbfuseError

EXIT_OK, EXIT_PROBLEMS, EXIT_REFUSED = 0, 1, 2


def _verify(args: argparse.Namespace) -> int:
    from kbfuse.bundle import format_report, verify_bundle

    report = verify_bundle(args.bundle)
    if args.json:
        sys.stdout.write(json.dumps(report, indent=2, sort_keys=True) + "\n")
    else:
        sys.stdout.write(format_report(report))
    return EXIT_OK if report["ok"] else EXIT_PROBLEMS


def _compare(args: argparse.Namespace) -> int:
    from kbfuse.compare import compare_bundles, write_comparison

    tables = compare_bundles(args.bundles)
    for path in write_comparison(tables, args.out):
        sys.stdout.write(f"{path}\n")
    differences = tables["differences"]
    sys.stdout.write(f"{len(differences)} difference(s) between the bundles\n")
    return EXIT_OK


def _summarize(args: argparse.Namespace) -> int:
    from kbfuse.config import validate_schema
    from kbfuse.summary import write_summary

    try:
        with open(args.config) as fh:
            config = yaml.safe_load(fh)
    except OSError as exc:
        raise KbfuseError(f"config file {args.config}: {exc.strerror}") from exc
    except yaml.YAMLError as exc:
        raise KbfuseError(f"config file {args.config} is not valid YAML: {exc}") from exc
    if not isinstance(config, dict):
        raise KbfuseError(f"config file {args.config}: expected a mapping")
    validate_schema(config)  # fills the defaults the workflow fills; kernels are not read
    for path in write_summary(args.results, config, args.out):
        sys.stdout.write(f"{path}\n")
    return EXIT_OK


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kbfuse", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    v = sub.add_parser("verify-bundle", help="check a bundle against the manifest inside it")
    v.add_argument("bundle", help="path to a .tar.gz made by the bundle rule")
    v.add_argument("--json", action="store_true", help="print the report as JSON")
    v.set_defaults(run=_verify)
    c = sub.add_parser("compare", help="put two or more verified bundles side by side")
    c.add_argument("bundles", nargs="+", help="bundle .tar.gz files (at least two)")
    c.add_argument("--out", required=True, help="directory for the comparison tables")
    c.set_defaults(run=_compare)
    s = sub.add_parser("summarize", help="rebuild the summary tables and plots of a finished run")
    s.add_argument("results", help="results directory of the run (the layout of results/)")
    s.add_argument("--config", required=True, help="the config file the run used")
    s.add_argument("--out", required=True, help="directory for the tables and plots")
    s.set_defaults(run=_summarize)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return args.run(args)
    except KbfuseError as exc:
        sys.stderr.write(f"kbfuse {args.command}: {exc}\n")
        return EXIT_REFUSED


if __name__ == "__main__":
    sys.exit(main())
