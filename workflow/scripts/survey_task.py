import os
import sys

from kbfuse.errors import KbfuseError
from kbfuse.survey.agreement import excluded_devices
from kbfuse.survey.job import run_survey_task, share_compile_caches
from kbfuse.workflow.jobs import job

share_compile_caches(snakemake.params.cache)  # before torch is imported
settings = snakemake.params.settings
# placed on one of the visible GPUs, less those the cross-device check left out
try:
    avoid = excluded_devices(snakemake.input.devices)
except KbfuseError as exc:
    sys.exit(f"kbfuse: survey_task failed: {exc}")
with job(
    snakemake.log[0], "survey_task", gpu=settings["device"] == "cuda", gpu_lock=None, avoid=avoid
):
    run_survey_task(
        checkout=snakemake.input.checkout,
        pin_path=snakemake.input.pin,
        settings=settings,
        contract_path=snakemake.input.contract,
        outs=dict(zip(snakemake.params.modes, snakemake.output, strict=True)),
        say=lambda line: print(line, flush=True),
    )

# The records are written and the log closed: leave without Python's interpreter teardown. On
# the H200 that teardown once aborted a finished job ("double free or corruption" after task
# 17's record was written, docs/device-runs.md), which turned complete records into a failed job.
sys.stdout.flush()
sys.stderr.flush()
os._exit(0)
