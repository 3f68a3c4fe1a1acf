from kbfuse.survey.tasks import write_task_list
from kbfuse.workflow.jobs import job

with job(snakemake.log[0], "survey_task_list", torch=False):
    write_task_list(
        checkout=snakemake.input.checkout,
        record=snakemake.input.record,
        tasks=snakemake.params.tasks,
        out=snakemake.output[0],
        level=snakemake.params.level,
    )
