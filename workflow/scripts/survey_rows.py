from kbfuse.results.prediction import write_survey_rows
from kbfuse.workflow.jobs import job

with job(snakemake.log[0], "survey_rows"):
    write_survey_rows(snakemake.params.study, snakemake.output[0])
