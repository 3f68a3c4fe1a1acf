import functools

from kbfuse.tasks.evaluator import tolerance_of
from kbfuse.tasks.registry import baselines_gpu_lock
from kbfuse.workflow.jobs import job
from kbfuse.workflow.outofmemory import shared_then_alone

compiled = list(snakemake.params.baselines)
alone = baselines_gpu_lock(compiled) == "alone"  # max-autotune benchmarks kernels on the GPU
# A sharing job takes the lock around the run: again alone if it runs out of device memory.
with job(snakemake.log[0], "correctness_baselines", gpu=True, gpu_lock="alone" if alone else None):
    from kbfuse.checks.correctness import run_baselines

    run = functools.partial(
        run_baselines,
        task=int(snakemake.wildcards.task),
        checkout=snakemake.input.checkout,
        pin_path=snakemake.input.pin,
        request=dict(
            seeds=snakemake.params.seeds,
            distributions=snakemake.params.distributions,
            tolerance=tolerance_of(snakemake.input.contract),
            input_seed=snakemake.params.input_seed,
            numerics=snakemake.params.get("numerics"),
        ),
        out=snakemake.output[0],
        log=None,
        implementations=compiled,
    )
    run() if alone else shared_then_alone(run)
