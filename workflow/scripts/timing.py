from kbfuse.workflow.jobs import job

with job(snakemake.log[0], "timing", gpu=True):
    from kbfuse.timing.gate import TimedTask
    from kbfuse.timing.timing import run_timing

    run_timing(
        TimedTask(
            task=int(snakemake.wildcards.task),
            variants=snakemake.params.artifacts,
            correctness=snakemake.params.correctness,
            baselines_record=snakemake.input.baselines,
            checkout=snakemake.input.checkout,
            pin_path=snakemake.input.pin,
            baselines=snakemake.params.baselines,
        ),
        protocol=snakemake.params.protocol,
        out=snakemake.output[0],
        log=None,
    )
