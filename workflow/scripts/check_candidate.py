from pathlib import Path

from kbfuse.candidates.check import check_candidate, checkout_commit, find_task_file
from kbfuse.jobs import job

with job(snakemake.log[0], "check_candidate"):
    level, task = snakemake.params.task
    checkout = snakemake.input.checkout
    verdict = Path(snakemake.output.verdict)
    record = check_candidate(
        snakemake.input.candidate,
        level,
        task,
        find_task_file(checkout, level, task),
        verdict,
        dict(snakemake.params.settings),
        commit=checkout_commit(checkout),
        log_dir=Path(snakemake.log[0]).parent,
    )
    print(f"{verdict}: {record['verdict']} {' '.join(record['failed_checks'])}")
