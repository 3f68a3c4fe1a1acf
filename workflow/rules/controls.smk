rule controls:
    input:
        unpack(controls_inputs),
    output:
        layout.record("controls"),
    log:
        layout.log("controls/{task}"),
    benchmark:
        layout.benchmark("controls/{task}")
    conda:
        ENV
    resources:
        gpu=1,
    params:
        artifacts=variant_artifacts,
        correctness=variant_correctness,
        baselines=config["baselines"],
        controls=config["controls"],
        protocol=config["timing"],
    script:
        "../scripts/controls.py"


rule witness81:
    input:
        checkout=layout.file("checkout"),
        pins=witness_pins(),
        artifacts=artifact_files(),
        code=module_files("checks.controls"),
    output:
        layout.record("witness81"),
    log:
        layout.log("controls/witness81"),
    benchmark:
        layout.benchmark("controls/witness81")
    conda:
        ENV
    resources:
        gpu=1,
    params:
        artifacts=variant_artifacts,
        inputs=config["controls"]["witness81_inputs"],
    script:
        "../scripts/witness81.py"
