from pathlib import Path

from kbfuse.jobs import job
from kbfuse.layout import RESULTS
from kbfuse.summary import write_summary

with job(snakemake.log[0], "summary"):
    write_summary(RESULTS, snakemake.params.study, Path(snakemake.output[0]).parent)
