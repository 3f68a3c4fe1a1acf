from kbfuse.tasks.kernelbench import pin_task
from kbfuse.workflow.jobs import job

with job(snakemake.log[0], "kernelbench_task"):
    pin_task(
        checkout=snakemake.input.checkout,
        record=snakemake.input.record,
        task=int(snakemake.wildcards.task),
        out=snakemake.output.pin,
    )
