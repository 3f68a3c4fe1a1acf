import functools

from kbfuse.tasks.evaluator import tolerance_of
from kbfuse.workflow.jobs import job
from kbfuse.workflow.outofmemory import shared_then_alone

# The lock is taken around the run (shared; alone if the device runs out of memory beside other
# jobs), not for the job's whole life.
with job(snakemake.log[0], "correctness", gpu=True, gpu_lock=None):
    from kbfuse.checks.correctness import run_correctness_variants

    run = functools.partial(
        run_correctness_variants,
        task=int(snakemake.wildcards.task),
        variants=snakemake.params.artifacts,
        outs=snakemake.params.outputs,
        checkout=snakemake.input.checkout,
        pin_path=snakemake.input.pin,
        request=dict(
            seeds=snakemake.params.seeds,
            distributions=snakemake.params.distributions,
            tolerance=tolerance_of(snakemake.input.contract),
            input_seed=snakemake.params.input_seed,
            numerics=snakemake.params.get("numerics"),
        ),
        log=None,
    )
    shared_then_alone(run)
