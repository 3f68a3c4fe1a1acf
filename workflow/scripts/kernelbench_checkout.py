import sys

from kbfuse.tasks.kernelbench import pin_kernelbench
from kbfuse.workflow.jobs import job

# The checkout also checks every configured task exists. Tasks and the URL come from the
# config, not from params: adding a task or changing the mirror must not redo the checkout.
with job(snakemake.log[0], "kernelbench_checkout"):
    pin_kernelbench(
        url=snakemake.config["kernelbench"]["url"],
        commit=snakemake.params.commit,
        level=snakemake.params.level,
        tasks=snakemake.config["tasks"],
        checkout=snakemake.output.checkout,
        pin_json=snakemake.output.record,
        log=sys.stdout,
    )
