from kbfuse.jobs import job

with job(snakemake.log[0], "compile", gpu=bool(snakemake.resources.gpu)):
    from kbfuse.compile import compile_variant

    compile_variant(
        source=snakemake.input.source,
        variant=snakemake.wildcards.variant,
        spec=snakemake.params.spec,
        arch=snakemake.params.arch,
        artifact=snakemake.output.artifact,
        meta=snakemake.output.meta,
        log=None,
    )
