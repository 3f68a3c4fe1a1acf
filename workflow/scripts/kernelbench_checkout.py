import sys

from kbfuse.jobs import job
from kbfuse.kernelbench import pin_kernelbench

# The checkout also checks every configured task exists. Tasks come from the config, not
# from params: adding a task must not redo the checkout.
with job(snakemake.log[0], "kernelbench_checkout"):
    pin_kernelbench(
        url=snakemake.params.url,
        commit=snakemake.params.commit,
        level=snakemake.params.level,
        tasks=snakemake.config["tasks"],
        checkout=snakemake.output.checkout,
        pin_json=snakemake.output.record,
        log=sys.stdout,
    )
