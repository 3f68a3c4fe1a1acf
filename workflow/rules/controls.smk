rule controls:
    input:
        unpack(controls_inputs),
    output:
        "results/controls/{task}.json",
    log:
        "results/logs/controls/{task}.log",
    benchmark:
        "results/benchmarks/controls/{task}.tsv"
    conda:
        ENV
    resources:
        gpu=1,
    params:
        artifacts=variant_artifacts,
        correctness=variant_correctness,
        baselines=config["baselines"],
        controls=config["controls"],
        tolerance=config["tolerance"],
        protocol=config["timing"],
    script:
        "../scripts/controls.py"


rule witness81:
    input:
        checkout="results/kernelbench/checkout",
        pins=witness_pins(),
        artifacts=artifact_files(),
        code=module_files("controls"),
    output:
        "results/controls/witness81.json",
    log:
        "results/logs/controls/witness81.log",
    benchmark:
        "results/benchmarks/controls/witness81.tsv"
    conda:
        ENV
    resources:
        gpu=1,
    params:
        artifacts=variant_artifacts,
        inputs=config["controls"]["witness81_inputs"],
    script:
        "../scripts/witness81.py"
