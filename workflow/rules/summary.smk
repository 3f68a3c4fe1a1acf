rule summary:
    input:
        results=summary_inputs(config),
        code=module_files("summary", "plots"),
    output:
        [
            report(
                f"results/summary/{name}",
                caption=f"../report/{caption_name(name)}",
                category=report_category(name),
            )
            for name in summary_outputs(config)
        ],
    log:
        "results/logs/summary/summary.log",
    conda:
        ENV
    params:
        study=recorded_config(config),
    script:
        "../scripts/summary.py"


rule manifest:
    input:
        files=manifest_files(),
        code=module_files("manifest"),
    output:
        "results/manifest.json",
    log:
        "results/logs/manifest/manifest.log",
    conda:
        ENV
    params:
        study=recorded_config(config),
    script:
        "../scripts/manifest.py"


rule bundle:
    input:
        manifest="results/manifest.json",
        files=manifest_files(),
        code=module_files("bundle"),
    output:
        "results/bundle/kbfuse-results.tar.gz",
    log:
        "results/logs/manifest/bundle.log",
    conda:
        ENV
    script:
        "../scripts/bundle.py"
