from pathlib import Path

from kbfuse.layout import RESULTS
from kbfuse.results.summary import write_summary
from kbfuse.workflow.jobs import job

with job(snakemake.log[0], "summary"):
    root = snakemake.params.get("root", RESULTS)
    write_summary(root, snakemake.params.study, Path(snakemake.output[0]).parent)
