from kbfuse.jobs import job

with job(snakemake.log[0], "correctness", gpu=True):
    from kbfuse.correctness import run_correctness

    run_correctness(
        task=int(snakemake.wildcards.task),
        variant=snakemake.wildcards.variant,
        artifact=snakemake.input.artifact,
        meta_path=snakemake.input.meta,
        checkout=snakemake.input.checkout,
        pin_path=snakemake.input.pin,
        seeds=snakemake.params.seeds,
        distributions=snakemake.params.distributions,
        tolerance=snakemake.params.tolerance,
        input_seed=snakemake.params.input_seed,
        out=snakemake.output[0],
        log=None,
    )
