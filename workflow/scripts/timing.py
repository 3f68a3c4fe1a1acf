from kbfuse.jobs import job

with job(snakemake.log[0], "timing", gpu=True):
    from kbfuse.timing import run_timing

    task = int(snakemake.wildcards.task)
    variants = snakemake.params.variants
    run_timing(
        task=task,
        variants={
            v: (f"results/compile/{v}/tails.bin", f"results/compile/{v}/meta.json")
            for v in variants
        },
        correctness={v: f"results/correctness/{task}/{v}.json" for v in variants},
        checkout=snakemake.input.checkout,
        pin_path=snakemake.input.pin,
        baselines=snakemake.params.baselines,
        protocol=snakemake.params.protocol,
        out=snakemake.output[0],
        log=None,
    )
