from kbfuse.workflow.jobs import job

with job(snakemake.log[0], "verify", gpu=True, gpu_lock="shared"):
    from kbfuse.checks.verify import verify_variants

    verify_variants(
        variants=snakemake.params.artifacts,
        checkout=snakemake.input.checkout,
        pin_path=snakemake.input.pins[0] if snakemake.input.pins else None,
        outs=snakemake.params.outputs,
        log=None,
    )
