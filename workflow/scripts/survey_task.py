from kbfuse.survey.job import run_survey_task, share_compile_caches
from kbfuse.workflow.jobs import job

share_compile_caches(snakemake.params.cache)  # before torch is imported
settings = snakemake.params.settings
with job(snakemake.log[0], "survey_task", gpu=settings["device"] == "cuda"):
    run_survey_task(
        checkout=snakemake.input.checkout,
        pin_path=snakemake.input.pin,
        settings=settings,
        mode=snakemake.wildcards.numerics,
        out=snakemake.output[0],
        say=lambda line: print(line, flush=True),
        precompiled=snakemake.input.get("compiled"),
    )
