from kbfuse.tasks.evaluator import tolerance_of
from kbfuse.workflow.jobs import job

with job(snakemake.log[0], "controls", gpu=True):
    from kbfuse.checks.controls import run_controls
    from kbfuse.timing.gate import TimedTask

    run_controls(
        TimedTask.of_job(snakemake),
        controls_cfg=snakemake.params.controls,
        tolerance=tolerance_of(snakemake.input.contract),
        protocol=snakemake.params.protocol,
        out=snakemake.output[0],
        log=None,
    )
