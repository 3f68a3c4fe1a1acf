rule correctness_variants:
    input:
        unpack(task_inputs),
        artifacts=artifact_files(),
        code=module_files("correctness"),
    output:
        expand("results/correctness/{{task}}/{variant}.json", variant=VARIANTS),
    log:
        "results/logs/correctness/{task}/variants.log",
    benchmark:
        "results/benchmarks/correctness/{task}/variants.tsv"
    conda:
        ENV
    resources:
        gpu=1,
    params:
        artifacts=variant_artifacts,
        outputs=outputs_by_variant,
        seeds=config["seeds"],
        distributions=config["distributions"],
        tolerance=config["tolerance"],
        input_seed=config["timing"]["input_seed"],
    script:
        "../scripts/correctness_variants.py"


rule correctness_baselines:
    input:
        unpack(task_inputs),
        code=module_files("correctness"),
    output:
        "results/correctness/{task}/baselines.json",
    log:
        "results/logs/correctness/{task}/baselines.log",
    benchmark:
        "results/benchmarks/correctness/{task}/baselines.tsv"
    conda:
        ENV
    resources:
        gpu=1,
    params:
        seeds=config["seeds"],
        distributions=config["distributions"],
        tolerance=config["tolerance"],
        input_seed=config["timing"]["input_seed"],
    script:
        "../scripts/correctness_baselines.py"
