"""`kbfuse audit CORPUS [--mapping cuda_l1] ...`: audit a corpus without Snakemake.

The same steps as `snakemake audit` (docs/audit.md), one check after another in this process:
the corpus read through its mapping and materialised under `--out` (default
results/audit/<name>), every entry without a verdict there checked by
kbfuse.candidates.check.check_candidate (so a second run resumes, and checks only new or changed
entries), in each numerics mode asked (`--numerics`; the claims' mode always), then the summary
written to `--out`/summary. The task files come from the `--kernelbench` checkout (the pin), or
from the corpus itself with `--references corpus`; the contract from `--contract` or that
checkout; the check's settings from the `check:` block of `--config`. An entry the checker
itself cannot judge (a problem of the harness, not of the kernel: kbfuse.candidates.check
raises for those) is named on stderr and left without a verdict, and the others go on.
`--summary-only` checks nothing: it writes the summary of the verdicts already there (an entry
without one is `no verdict`), on any machine, e.g. after a `snakemake audit` where a job
failed. Exit 0 once the summary is written, whatever the verdicts; 1 for bad input (the corpus,
its mapping, a task file that is missing), named on stderr, or when an entry was left
without a verdict (the summary is written all the same).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from kbfuse.errors import KbfuseError


def add_parser(sub) -> None:
    a = sub.add_parser("audit", help="check every candidate of a published corpus, claims beside")
    a.add_argument("corpus", help="a folder of candidate files, or a JSON/JSONL file")
    a.add_argument("--mapping", help="a packaged mapping (cuda_l1) or a mapping YAML file")
    a.add_argument("--name", help="the audit's name (default: from the corpus's file name)")
    a.add_argument(
        "--references",
        choices=("pinned", "corpus"),
        default="pinned",
        help="judge against the pinned task files (default) or the corpus's own",
    )
    a.add_argument("--limit", type=int, help="check the first N entries only")
    a.add_argument(
        "--task",
        type=int,
        action="append",
        dest="tasks",
        help="check this task number's records only (again for more; default: every task)",
    )
    a.add_argument(
        "--numerics",
        action="append",
        choices=("kernelbench-defaults", "strict"),
        help="a mode to measure in (again for more; default: the claims' mode only)",
    )
    a.add_argument(
        "--kernelbench",
        default="results/kernelbench/checkout",
        help="KernelBench checkout at the pin (default: the workflow's)",
    )
    a.add_argument("--contract", help="a kernelbench_contract record (default: the checkout's)")
    a.add_argument("--out", help="the audit's folder (default: results/audit/<name>)")
    a.add_argument("--config", help="a config file whose check: block sets the limits")
    a.add_argument("--device", choices=["cuda", "cpu"], help="default: cuda when available")
    a.add_argument(
        "--summary-only",
        action="store_true",
        help="check nothing: summarise the verdicts already there",
    )
    a.add_argument(
        "--unsandboxed",
        action="store_true",
        help="run the children without the bubblewrap sandbox (recorded in every verdict)",
    )
    a.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    # Imported here: building the parser must not import torch (as `kbfuse check`).
    from kbfuse import layout
    from kbfuse.audit.corpus import read_corpus
    from kbfuse.audit.mapping import load_mapping
    from kbfuse.audit.materialise import claims_mode, materialise, select
    from kbfuse.audit.settings import audit_settings, measured_modes
    from kbfuse.candidates.check import check_candidate, checkout_commit, find_task_file
    from kbfuse.candidates.cli import contract_of, settings_from_config
    from kbfuse.candidates.spec import check_settings

    settings = audit_settings(
        {
            "corpus": args.corpus,
            "mapping": args.mapping,
            "name": args.name,
            "references": args.references,
            "limit": args.limit,
            "tasks": args.tasks,
            "numerics": args.numerics,
        }
    )
    # Everything that can be refused is, before a file is written: the mapping, the corpus,
    # the contract, the check's settings and, judged at the pin, every task file.
    mapping = None if settings["mapping"] is None else load_mapping(settings["mapping"])
    corpus = read_corpus(settings["corpus"], mapping)
    modes = measured_modes(settings, claims_mode(mapping))
    checkout = Path(args.kernelbench)
    root = Path(args.out) if args.out else Path(layout.file("audit_root", audit=settings["name"]))
    if args.summary_only:
        entries = materialise(corpus, mapping, settings, root)
        return summarise(root, [(mode, name) for mode in modes for name in entries], checkout, [])
    contract = contract_of(args)
    check = check_settings(settings_from_config(args.config, args.unsandboxed))
    chosen = select(corpus, settings["references"], settings["limit"], settings["tasks"])[0]
    pinned = {}
    if settings["references"] == "pinned":
        pinned = {
            n: find_task_file(checkout, c.entry.level, c.entry.task) for n, c in chosen.items()
        }
    entries = materialise(corpus, mapping, settings, root)
    commit = checkout_commit(checkout) if checkout.is_dir() else None
    jobs = [(mode, name) for mode in modes for name in entries]
    unjudged = []
    for number, (mode, name) in enumerate(jobs, start=1):
        level, task = entries[name]
        said = f"[{number}/{len(jobs)}] {name} ({mode})"
        verdict = Path(layout.audit_file("verdict", root, numerics=mode, entry=name))
        if verdict.is_file():
            print(f"{said}: verdict there, not checked again")
            continue
        if name in pinned:
            task_file, task_commit = pinned[name], commit
        else:
            task_file, task_commit = Path(layout.audit_file("task", root, entry=name)), None
        try:
            record = check_candidate(
                layout.audit_file("candidate", root, entry=name),
                level,
                task,
                task_file,
                verdict,
                contract,
                {**check, "numerics": mode},
                device=args.device,
                commit=task_commit,
                log_dir=root / "logs" / mode,
                record_refusal=True,
            )
        except KbfuseError as exc:  # the harness's problem with this entry: the others go on
            unjudged.append(f"{name} ({mode})")
            print(f"{said}: no verdict: {exc}", file=sys.stderr)
            continue
        failed = " ".join(record.get("failed_checks", []))
        print(f"{said}: {record['verdict']} {failed}".rstrip())
    return summarise(root, jobs, checkout, unjudged)


def summarise(root: Path, jobs: list[tuple[str, str]], checkout: Path, unjudged: list[str]) -> int:
    """The summary of the verdicts there for `jobs` ((mode, entry) pairs; one without a
    verdict is `no verdict`); 1 when `unjudged` names entries the checker could not judge."""
    from kbfuse import layout
    from kbfuse.audit.summary import write_audit_summary

    verdicts = [
        path
        for mode, name in jobs
        if (path := Path(layout.audit_file("verdict", root, numerics=mode, entry=name))).is_file()
    ]
    print(f"{len(verdicts)} of {len(jobs)} verdicts there; the rest are `no verdict`")
    summary = Path(layout.audit_file("summary", root, name="table.csv")).parent
    for path in write_audit_summary(
        layout.audit_file("index", root), verdicts, checkout if checkout.is_dir() else None, summary
    ):
        print(path)
    if unjudged:
        print(
            f"kbfuse audit: {len(unjudged)} entries left without a verdict (above): "
            + ", ".join(unjudged),
            file=sys.stderr,
        )
        return 1
    return 0
