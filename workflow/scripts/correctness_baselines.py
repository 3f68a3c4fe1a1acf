from kbfuse.tasks.evaluator import tolerance_of
from kbfuse.tasks.registry import baselines_gpu_lock
from kbfuse.workflow.jobs import job

compiled = list(snakemake.params.baselines)
lock = baselines_gpu_lock(compiled)  # alone when max-autotune benchmarks kernels on the GPU
with job(snakemake.log[0], "correctness_baselines", gpu=True, gpu_lock=lock):
    from kbfuse.checks.correctness import run_baselines

    run_baselines(
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
