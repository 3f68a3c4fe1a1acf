from kbfuse.survey.agreement import run_agreement
from kbfuse.workflow.jobs import job

# Each device's timing runs in a child process that sees only that device, under its GPU lock:
# this job never initialises CUDA itself.
with job(snakemake.log[0], "survey_devices"):
    run_agreement(
        snakemake.output[0],
        device=snakemake.params.device,
        exclude=bool(snakemake.params.exclude),
        say=lambda line: print(line, flush=True),
    )
