from kbfuse.jobs import job
from kbfuse.summary import write_summary

with job(snakemake.log[0], "summary"):
    write_summary("results", snakemake.params.study, "results/summary")
