"""Contracts for tests that judge without a KernelBench checkout: the shape of the
`kernelbench_contract` record (kbfuse.tasks.evaluator), with the values of a test's choosing.
Tests of the record itself read it from a KernelBench-shaped repository (tests/kbrepo.py)."""

from __future__ import annotations


def contract(atol=1e-4, rtol=1e-4, order=("reference", "candidate"), seed=42, trials=5) -> dict:
    return {
        "atol": atol,
        "rtol": rtol,
        "tolerance_source": {"atol": "eval.py:1 test", "rtol": "eval.py:1 test"},
        "argument_order": list(order),
        "seed": seed,
        "trials": trials,
        "trial_seed_low": 0,
        "trial_seed_high": 2**32 - 1,
        "commit": None,
    }


def contract_record(commit: str | None, tolerance: str = "1e-4") -> dict:
    """A full kernelbench_contract record, read by kbfuse.tasks.evaluator from the test
    evaluator of tests/kbrepo.py (written to a temporary folder; no git needed)."""
    import tempfile
    from pathlib import Path

    from kbrepo import evaluator_files

    from kbfuse.tasks.evaluator import read_contract

    with tempfile.TemporaryDirectory() as folder:
        for rel, text in evaluator_files(tolerance).items():
            path = Path(folder) / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        return read_contract(folder, commit)


def contract_file(folder) -> str:
    """contract_record(None) written to folder/contract.json (for `kbfuse check --contract`)."""
    import json
    from pathlib import Path

    path = Path(folder) / "contract.json"
    path.write_text(json.dumps(contract_record(None)))
    return str(path)
