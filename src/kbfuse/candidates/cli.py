"""`kbfuse check CANDIDATE.py [--task 2/53] ...`: the command-line form of check_candidate.

The task is `--task`, or the candidate's `# kbfuse-task:` line. Its file comes from a
KernelBench checkout (`--kernelbench`, default results/kernelbench/checkout, the workflow's
checkout at the pin; the commit is recorded) or is given directly (`--task-file`, for a task
outside KernelBench, such as the CPU tests' tiny tasks). The judge's contract (tolerance,
argument order, seed, trials) is the pinned evaluator's: read from the `--kernelbench`
checkout's own source (kbfuse.tasks.evaluator), or from a written contract record
(`--contract`, e.g. the workflow's results/kernelbench/contract.json). Settings come from the
`check:` block of `--config` when given (config/config.yaml), else the defaults of
kbfuse.candidates.spec; `--unsandboxed` runs the children without the bubblewrap sandbox (the
verdict says so).
Prints the verdict, the failed checks and the findings; exit 0 for pass, 1 for fail (or a
problem named on stderr: no bwrap, a missing task file, a reference that fails).

`kbfuse scratch [--mb]`: the scratch roots a check would use here (TMPDIR, or the folders of
$KBFUSE_SCRATCH), the room of each (kbfuse.candidates.diskbudget.room) and their pool in MiB,
the `--resources scratch_mb=N` of an audit's Snakemake run (`--mb`: that number alone).
"""

from __future__ import annotations

import argparse
from pathlib import Path


def add_parser(sub) -> None:
    c = sub.add_parser("check", help="judge a KernelBench candidate kernel (ModelNew)")
    c.add_argument("candidate", help="a Python file in KernelBench's submission format")
    c.add_argument("--task", help="LEVEL/TASK, e.g. 2/53 (default: the file's kbfuse-task line)")
    c.add_argument(
        "--kernelbench",
        default="results/kernelbench/checkout",
        help="KernelBench checkout at the pin (default: the workflow's)",
    )
    c.add_argument("--task-file", help="the task's Python file, instead of the checkout's")
    c.add_argument(
        "--contract",
        help="a kernelbench_contract record (default: read from the --kernelbench checkout)",
    )
    c.add_argument("--out", help="verdict JSON (default: results/check/<candidate>.json)")
    c.add_argument("--config", help="a config file whose check: block sets the limits")
    c.add_argument("--survey", help="the survey record of the task (its blind spots)")
    c.add_argument("--device", choices=["cuda", "cpu"], help="default: cuda when available")
    c.add_argument("--keep-scratch", action="store_true", help="keep the scratch folder")
    c.add_argument(
        "--unsandboxed",
        action="store_true",
        help="run the children without the bubblewrap sandbox (recorded in the verdict)",
    )
    c.set_defaults(run=run)


def add_scratch_parser(sub) -> None:
    s = sub.add_parser("scratch", help="the scratch roots of checks here, and their room")
    s.add_argument("--mb", action="store_true", help="print only the pool in MiB (scratch_mb)")
    s.set_defaults(run=run_scratch)


def run_scratch(args) -> int:
    from kbfuse.candidates import diskbudget

    roots = diskbudget.scratch_roots()
    pool = diskbudget.pool_mb(roots)
    if args.mb:
        print(pool)
        return 0
    for root in roots:
        space = diskbudget.room(root)
        kind = diskbudget.filesystem_type(root) or "unknown filesystem"
        bound = ", bounded by the memory kept for processes" if space.memory else ""
        print(f"{root}: {kind}, {space.free / 1e9:.1f} GB of room now{bound}")
    print(f"scratch_mb={pool} (each root's room less {diskbudget.FREE_MARGIN_BYTES >> 30} GiB)")
    return 0


def settings_from_config(config: str | None, unsandboxed: bool) -> dict | None:
    """The `check:` block of a config file, with `unsandboxed` when asked (kbfuse audit too)."""
    settings = None
    if config is not None:
        from kbfuse.workflow.config import read_config_file

        data = read_config_file(config) or {}
        settings = data.get("check") if isinstance(data, dict) else None
    if unsandboxed:
        settings = {**(settings or {}), "unsandboxed": True}
    return settings


def contract_of(args: argparse.Namespace) -> dict:
    """The contract of `--contract`, or read from the `--kernelbench` checkout."""
    from kbfuse.candidates.check import checkout_commit
    from kbfuse.tasks.evaluator import read_contract, read_contract_record

    if args.contract:
        return read_contract_record(args.contract)
    return read_contract(args.kernelbench, checkout_commit(args.kernelbench))


def run(args: argparse.Namespace) -> int:
    # Imported here: building the parser must not import torch (`kbfuse verify-bundle` stays
    # a small process; tests/test_untrusted_bundle.py bounds its memory).
    from kbfuse.candidates.check import check_candidate, checkout_commit, find_task_file
    from kbfuse.candidates.spec import candidate_name, parse_task, task_of_file

    candidate = Path(args.candidate)
    if args.task:
        level, task = parse_task(args.task)
    else:
        level, task = task_of_file(candidate)
    if args.task_file:
        task_file, commit = Path(args.task_file), None
    else:
        task_file = find_task_file(args.kernelbench, level, task)
        commit = checkout_commit(args.kernelbench)
    out = (
        Path(args.out) if args.out else Path("results/check") / f"{candidate_name(candidate)}.json"
    )
    contract = contract_of(args)
    record = check_candidate(
        candidate,
        level,
        task,
        task_file,
        out,
        contract,
        settings_from_config(args.config, args.unsandboxed),
        device=args.device,
        commit=commit,
        survey=args.survey,
        keep_scratch=args.keep_scratch,
    )
    print(f"{candidate.name}: {record['verdict']} (task {level}/{task})")
    print("\n".join(outcome_lines(record)))
    print(f"  verdict written to {out}")
    return 0 if record["verdict"] == "pass" else 1


def outcome_lines(record: dict) -> list[str]:
    """A verdict's failed checks with their details, then its findings, a switch the
    candidate changed under `switches_changed`."""
    lines = [
        f"  failed {name}: {record['checks'][name]['detail']}" for name in record["failed_checks"]
    ]
    for name in record["findings"]:
        lines.append(f"  finding {name}")
        if name == "switches_changed":
            lines += [f"    {change}" for change in record["guards"]["switches_changed"]]
    return lines
