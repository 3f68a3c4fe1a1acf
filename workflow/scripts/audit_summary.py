from pathlib import Path

from kbfuse.audit.summary import write_audit_summary
from kbfuse.workflow.jobs import job

with job(snakemake.log[0], "audit_summary"):
    write_audit_summary(
        snakemake.input.index,
        snakemake.input.verdicts,
        snakemake.input.checkout,
        Path(snakemake.output[0]).parent,
    )
