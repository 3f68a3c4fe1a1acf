from kbfuse.checks.protocol import write_direction_witness
from kbfuse.tasks.evaluator import tolerance_of
from kbfuse.workflow.jobs import job

with job(snakemake.log[0], "direction_witness"):
    tol = tolerance_of(snakemake.input.contract)
    write_direction_witness(atol=tol["atol"], rtol=tol["rtol"], out=snakemake.output[0])
