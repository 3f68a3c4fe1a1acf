from pathlib import Path

from kbfuse.results.summary import write_summary
from kbfuse.workflow.jobs import job

with job(snakemake.log[0], "summary"):
    # The summary folder is <results>/summary, whichever study's results these are.
    outdir = Path(snakemake.output[0]).parent
    write_summary(outdir.parent, snakemake.params.study, outdir)
