from kbfuse.jobs import job
from kbfuse.protocol import write_margin_audit

with job(snakemake.log[0], "margin_audit"):
    write_margin_audit(paths=list(snakemake.input.results), out=snakemake.output[0])
