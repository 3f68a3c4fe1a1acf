rule env_fingerprint:
    input:
        code=module_files("workflow.envinfo"),
    output:
        layout.record("env"),
    log:
        layout.log("env/fingerprint"),
    benchmark:
        layout.benchmark("env/fingerprint")
    conda:
        ENV
    resources:
        gpu=1,
    script:
        "../scripts/env_fingerprint.py"
