from kbfuse.candidates.summary import write_summary
from kbfuse.workflow.jobs import job

with job(snakemake.log[0], "check_summary"):
    write_summary(snakemake.input.verdicts, "results/check/summary")
