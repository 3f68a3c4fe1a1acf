rule direction_witness:
    input:
        contract=CONTRACT,
        code=module_files("checks.protocol", "tasks.evaluator"),
    output:
        layout.record("direction_witness"),
    log:
        layout.log("protocol/direction_witness"),
    conda:
        ENV
    script:
        "../scripts/direction_witness.py"


rule margin_audit:
    input:
        results=gpu_results(),
        code=module_files("checks.protocol"),
    output:
        layout.record("margin_audit"),
    log:
        layout.log("protocol/margin_audit"),
    conda:
        ENV
    script:
        "../scripts/margin_audit.py"
