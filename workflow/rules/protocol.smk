rule direction_witness:
    input:
        code=module_files("protocol"),
    output:
        "results/protocol/direction_witness.json",
    log:
        "results/logs/protocol/direction_witness.log",
    conda:
        ENV
    params:
        tolerance=config["tolerance"],
    script:
        "../scripts/direction_witness.py"


rule margin_audit:
    input:
        results=gpu_results(),
        code=module_files("protocol"),
    output:
        "results/protocol/margin_audit.json",
    log:
        "results/logs/protocol/margin_audit.log",
    conda:
        ENV
    script:
        "../scripts/margin_audit.py"
