from kbfuse.tasks.kernelbench import pin_task
from kbfuse.workflow.jobs import job

with job(snakemake.log[0], "survey_pin", torch=False):
    pin_task(
        checkout=snakemake.input.checkout,
        record=snakemake.input.record,
        task=int(snakemake.wildcards.survey_task),
        out=snakemake.output[0],
        level=snakemake.params.level,
    )
