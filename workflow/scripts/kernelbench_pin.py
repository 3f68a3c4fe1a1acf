from kbfuse.jobs import job
from kbfuse.kernelbench import combine_pins

with job(snakemake.log[0], "kernelbench_pin"):
    combine_pins(
        record=snakemake.input.record, tasks=snakemake.input.tasks, out=snakemake.output.pin
    )
