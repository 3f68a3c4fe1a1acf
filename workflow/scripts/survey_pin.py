from kbfuse.jobs import job
from kbfuse.kernelbench import pin_task

with job(snakemake.log[0], "survey_pin", torch=False):
    pin_task(
        checkout=snakemake.input.checkout,
        record=snakemake.input.record,
        task=int(snakemake.wildcards.survey_task),
        out=snakemake.output[0],
    )
