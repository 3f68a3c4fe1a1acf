from kbfuse.jobs import job

with job(snakemake.log[0], "controls", gpu=True):
    from kbfuse.controls import run_controls

    task = int(snakemake.wildcards.task)
    variants = snakemake.params.variants
    run_controls(
        task=task,
        variants={
            v: (f"results/compile/{v}/tails.bin", f"results/compile/{v}/meta.json")
            for v in variants
        },
        correctness={v: f"results/correctness/{task}/{v}.json" for v in variants},
        checkout=snakemake.input.checkout,
        pin_path=snakemake.input.pin,
        baselines=snakemake.params.baselines,
        controls_cfg=snakemake.params.controls,
        tolerance=snakemake.params.tolerance,
        protocol=snakemake.params.protocol,
        out=snakemake.output[0],
        log=None,
    )
