from kbfuse.workflow.jobs import job

# The compile needs the GPU only to read its architecture (arch: auto), through the driver.
with job(
    snakemake.log[0], "compile", gpu=bool(snakemake.resources.gpu), torch=False, gpu_lock="shared"
):
    from kbfuse.compilation.compile import compile_variant

    compile_variant(
        source=snakemake.input.source,
        variant=snakemake.wildcards.variant,
        spec=snakemake.params.spec,
        arch=snakemake.params.arch,
        artifact=snakemake.output.artifact,
        meta=snakemake.output.meta,
        log=None,
    )
