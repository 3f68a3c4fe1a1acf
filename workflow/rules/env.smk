rule env_fingerprint:
    input:
        code=module_files("envinfo"),
    output:
        "results/env/fingerprint.json",
    log:
        "results/logs/env/fingerprint.log",
    benchmark:
        "results/benchmarks/env/fingerprint.tsv"
    conda:
        ENV
    resources:
        gpu=1,
    script:
        "../scripts/env_fingerprint.py"
