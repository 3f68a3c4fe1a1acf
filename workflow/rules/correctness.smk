rule correctness_variant:
    input:
        unpack(task_inputs),
        artifact="results/compile/{variant}/tails.bin",
        meta="results/compile/{variant}/meta.json",
        code=module_files("correctness"),
    output:
        "results/correctness/{task}/{variant}.json",
    log:
        "results/logs/correctness/{task}/{variant}.log",
    benchmark:
        "results/benchmarks/correctness/{task}/{variant}.tsv"
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
        "../scripts/correctness_variant.py"


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
