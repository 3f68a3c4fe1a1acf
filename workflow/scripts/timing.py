from kbfuse.workflow.jobs import job

with job(snakemake.log[0], "timing", gpu=True):
    from kbfuse.timing.gate import TimedTask
    from kbfuse.timing.timing import run_timing

    run_timing(
        TimedTask.of_job(snakemake),
        protocol=snakemake.params.protocol,
        out=snakemake.output[0],
        log=None,
    )
