from kbfuse.workflow.jobs import job

with job(snakemake.log[0], "witness81", gpu=True):
    from kbfuse.checks.controls import run_witness81

    run_witness81(
        variants=snakemake.params.artifacts,
        checkout=snakemake.input.checkout,
        pin_path=snakemake.input.pins[0],
        out=snakemake.output[0],
        log=None,
        inputs=snakemake.params.inputs,
    )
