from kbfuse.tasks.evaluator import write_contract
from kbfuse.workflow.jobs import job

with job(snakemake.log[0], "kernelbench_contract"):
    write_contract(snakemake.input.checkout, snakemake.input.record, out=snakemake.output.contract)
