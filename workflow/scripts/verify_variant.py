from kbfuse.jobs import job

with job(snakemake.log[0], "verify", gpu=True):
    from kbfuse.verify import verify_variant

    verify_variant(
        artifact=snakemake.input.artifact,
        meta_path=snakemake.input.meta,
        checkout=snakemake.input.checkout,
        pin_path=snakemake.input.pins[0] if snakemake.input.pins else None,
        out=snakemake.output[0],
        log=None,
    )
