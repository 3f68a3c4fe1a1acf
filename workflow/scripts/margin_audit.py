from kbfuse.checks.protocol import write_margin_audit
from kbfuse.workflow.jobs import job

with job(snakemake.log[0], "margin_audit"):
    write_margin_audit(paths=list(snakemake.input.results), out=snakemake.output[0])
