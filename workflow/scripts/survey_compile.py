import os

from kbfuse.survey.job import share_compile_caches
from kbfuse.survey.precompile import precompile_task
from kbfuse.workflow.jobs import job

# Before torch is imported: the shared caches, and one compile thread per job (Snakemake
# runs several compile jobs side by side; Inductor's own worker pool would oversubscribe).
share_compile_caches(snakemake.params.cache)
os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", str(snakemake.threads))
settings = snakemake.params.settings
with job(snakemake.log[0], "survey_compile", gpu=settings["device"] == "cuda"):
    precompile_task(
        checkout=snakemake.input.checkout,
        pin_path=snakemake.input.pin,
        settings=settings,
        mode=snakemake.wildcards.numerics,
        out=snakemake.output[0],
        say=lambda line: print(line, flush=True),
    )
