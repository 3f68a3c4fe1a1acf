"""The `kbfuse` command: verify a result bundle, compare bundles, rebuild a summary.

    kbfuse verify-bundle BUNDLE|FOLDER [--ignore GLOB ...] [--json]
    kbfuse compare BUNDLE BUNDLE [...] --out DIR [--label LABEL ...]
    kbfuse summarize RESULTS_DIR --config CONFIG --out DIR [--kernels DIR] [--study fused2]
    kbfuse check CANDIDATE.py [--task 2/53] [--kernelbench DIR | --task-file FILE] [--out JSON]
    kbfuse audit CORPUS [--mapping cuda_l1] [--references pinned|corpus] [--out DIR]
    kbfuse scratch [--mb]
    kbfuse --version

`summarize` is the CPU-only way to rebuild the tables and plots of a finished run (for
example results/reference/h200) from its result files: the same `write_summary` call as the
summary rule, with the config of that run (read by `kbfuse.workflow.config.load_config`, which also
checks the kernel sources it names, under `--kernels`); `--study fused2` summarises the second
fused study's results (results/fused2) with the config its block derives
(kbfuse.workflow.studies.fused2_config). `compare` labels each bundle by the
machine its fingerprint names (GPU, driver, NVRTC) unless `--label` is given once per bundle.

Bundles, manifests, configs and result files are untrusted input: a command reads only its
inputs and writes only under its `--out` directory (`verify-bundle` writes nothing); tables
and plots are staged there and moved into place when all are complete.

Exit status:
  0  everything checks out;
  1  the input has problems: a bundle with changed, missing, extra or duplicated files, a
     malformed or unsafe bundle, manifest, config or result file, stale provenance, a
     bundle refused before a comparison; the message names file, field and value;
  2  the command could not run: bad arguments, an input that does not exist or cannot be
     read, an `--out` that names an existing file, an error of the operating system while
     writing.
No bad input ends in a traceback.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from kbfuse import __version__
from kbfuse.errors import KbfuseError

EXIT_OK, EXIT_PROBLEMS, EXIT_CANNOT_RUN = 0, 1, 2


class CannotRun(Exception):
    """The command could not run (exit 2); the message says why."""


def _need_file(path: str, what: str) -> Path:
    p = Path(path)
    if not p.is_file():
        raise CannotRun(f"{what} {path} does not exist or is not a file")
    return p


def _need_dir(path: str, what: str) -> Path:
    p = Path(path)
    if not p.is_dir():
        raise CannotRun(f"{what} {path} does not exist or is not a directory")
    return p


def _out_dir(path: str) -> Path:
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise CannotRun(f"--out {path} exists and is not a directory")
    return p


def _verify(args: argparse.Namespace) -> int:
    from kbfuse.results.bundle import format_report, verify_bundle
    from kbfuse.results.manifest import verify_manifest

    path = Path(args.bundle)
    if path.is_dir():  # a results folder with its manifest.json (e.g. a committed reference)
        manifest = _need_file(str(path / "manifest.json"), "manifest of the folder")
        report = verify_manifest(path, manifest, ignore=["manifest.json", *args.ignore])
        report["bundle"] = str(path)
    else:
        report = verify_bundle(_need_file(args.bundle, "bundle"))
    if args.json:
        sys.stdout.write(json.dumps(report, indent=2, sort_keys=True) + "\n")
    else:
        sys.stdout.write(format_report(report))
    return EXIT_OK if report["ok"] else EXIT_PROBLEMS


def _compare(args: argparse.Namespace) -> int:
    from kbfuse.results.compare import check_label, compare_bundles, write_comparison
    from kbfuse.results.records import STAGING_PREFIX, staged

    bundles = [_need_file(b, "bundle") for b in args.bundles]
    if len(bundles) < 2:
        raise CannotRun(f"compare needs at least two bundles, got {len(bundles)}")
    if args.label and len(args.label) != len(bundles):
        raise CannotRun(f"{len(args.label)} --label given for {len(bundles)} bundles")
    try:
        labels = [check_label(label) for label in args.label] if args.label else None
    except KbfuseError as exc:
        raise CannotRun(f"--label: {exc}") from None
    with staged(_out_dir(args.out)) as stage:
        work = Path(tempfile.mkdtemp(dir=args.out, prefix=STAGING_PREFIX + "bundles-"))
        try:
            tables = compare_bundles(bundles, labels, workdir=work)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        write_comparison(tables, stage)
        names = sorted(p.name for p in stage.iterdir())
    for name in names:
        sys.stdout.write(f"{Path(args.out) / name}\n")
    sys.stdout.write(f"{len(tables['differences'])} difference(s) between the bundles\n")
    return EXIT_OK


def _summarize(args: argparse.Namespace) -> int:
    from kbfuse.results.summary import write_summary
    from kbfuse.workflow.config import load_config  # names the file when its text is not YAML

    results = _need_dir(args.results, "results directory")
    config_path = _need_file(args.config, "config file")
    out = _out_dir(args.out)
    config = load_config(config_path, args.kernels)
    if args.study == "fused2":
        from kbfuse.workflow.studies import fused2_config

        config = fused2_config(config)
        if config is None:
            sys.stderr.write(f"kbfuse summarize: {config_path} has no fused2 block\n")
            return EXIT_PROBLEMS
    for path in write_summary(results, config, out):
        sys.stdout.write(f"{path}\n")
    return EXIT_OK


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="kbfuse",
        description=__doc__.split("\n")[0],
        epilog="exit status: 0 all checks out, 1 the input has problems, 2 could not run",
    )
    p.add_argument("--version", action="version", version=f"kbfuse {__version__}")
    sub = p.add_subparsers(dest="command", required=True)
    v = sub.add_parser(
        "verify-bundle",
        help="check a bundle, or a results folder, against the manifest inside it",
    )
    v.add_argument(
        "bundle",
        help="a .tar.gz made by the bundle rule, or a folder with its manifest.json",
    )
    v.add_argument(
        "--ignore",
        action="append",
        default=[],
        metavar="GLOB",
        help="a folder's files to leave out (relative paths; again for more)",
    )
    v.add_argument("--json", action="store_true", help="print the report as JSON")
    v.set_defaults(run=_verify)
    c = sub.add_parser("compare", help="put two or more verified bundles side by side")
    c.add_argument("bundles", nargs="+", help="bundle .tar.gz files (at least two)")
    c.add_argument("--out", required=True, help="directory for the comparison tables")
    c.add_argument(
        "--label",
        action="append",
        help="column label of a bundle, once per bundle in order "
        "(default: its machine: GPU, driver, NVRTC)",
    )
    c.set_defaults(run=_compare)
    s = sub.add_parser("summarize", help="rebuild the summary tables and plots of a finished run")
    s.add_argument("results", help="results directory of the run (the layout of results/)")
    s.add_argument("--config", required=True, help="the config file the run used")
    s.add_argument("--out", required=True, help="directory for the tables and plots")
    s.add_argument(
        "--kernels", default="kernels", help="kernel sources the config names (default: kernels)"
    )
    s.add_argument(
        "--study",
        choices=("first", "fused2"),
        default="first",
        help="which study of the config the results are (default: the first, its top level)",
    )
    s.set_defaults(run=_summarize)
    from kbfuse.candidates.cli import add_parser as add_check_parser
    from kbfuse.candidates.cli import add_scratch_parser

    add_check_parser(sub)  # kbfuse check CANDIDATE.py --task 2/53 (docs/check.md)
    add_scratch_parser(sub)  # kbfuse scratch: where checks write, and how much (docs/check.md)
    from kbfuse.audit.cli import add_parser as add_audit_parser

    add_audit_parser(sub)  # kbfuse audit CORPUS --mapping cuda_l1 (docs/audit.md)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)  # bad arguments: argparse's message, exit 2
    prefix = f"kbfuse {args.command}"
    try:
        return args.run(args)
    except KbfuseError as exc:
        sys.stderr.write(f"{prefix}: {exc}\n")
        return EXIT_PROBLEMS
    except CannotRun as exc:
        sys.stderr.write(f"{prefix}: cannot run: {exc}\n")
        return EXIT_CANNOT_RUN
    except OSError as exc:
        where = f" ({exc.filename})" if exc.filename else ""
        sys.stderr.write(f"{prefix}: cannot run: {exc.strerror or exc}{where}\n")
        return EXIT_CANNOT_RUN


if __name__ == "__main__":
    sys.exit(main())
