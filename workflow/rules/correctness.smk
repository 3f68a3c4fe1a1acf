rule correctness_variants:
    input:
        unpack(task_inputs),
        artifacts=artifact_files(),
        code=module_files("checks.correctness", "tasks.evaluator"),
    output:
        [layout.record("correctness", variant=v) for v in VARIANTS],
    log:
        layout.log("correctness/{task}/variants"),
    benchmark:
        layout.benchmark("correctness/{task}/variants")
    conda:
        ENV
    resources:
        gpu_jobs=1,
    params:
        artifacts=variant_artifacts,
        outputs=outputs_by_variant,
        seeds=config["seeds"],
        distributions=config["distributions"],
        input_seed=config["timing"]["input_seed"],
    script:
        "../scripts/correctness_variants.py"


rule correctness_baselines:
    input:
        unpack(task_inputs),
        code=module_files("checks.correctness", "tasks.evaluator"),
    output:
        layout.record("correctness_baselines"),
    log:
        layout.log("correctness/{task}/baselines"),
    benchmark:
        layout.benchmark("correctness/{task}/baselines")
    conda:
        ENV
    resources:
        gpu_jobs=1,
    params:
        seeds=config["seeds"],
        distributions=config["distributions"],
        input_seed=config["timing"]["input_seed"],
        baselines=COMPILED_BASELINES,
    script:
        "../scripts/correctness_baselines.py"
