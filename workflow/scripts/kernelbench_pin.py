from kbfuse.tasks.kernelbench import combine_pins
from kbfuse.workflow.jobs import job

with job(snakemake.log[0], "kernelbench_pin"):
    combine_pins(
        record=snakemake.input.record, tasks=snakemake.input.tasks, out=snakemake.output.pin
    )
