from pathlib import Path

from kbfuse.survey.summary import records_by_mode, write_survey_summary
from kbfuse.workflow.jobs import job

with job(snakemake.log[0], "survey_summary", torch=False):
    write_survey_summary(
        records_by_mode(snakemake.input.records, snakemake.params.modes),
        snakemake.input.checkout,
        Path(snakemake.output[0]).parent,
        fingerprint=getattr(snakemake.input, "fingerprint", None),
        floor_files=snakemake.input.floors,
    )
