rule summary:
    input:
        results=summary_inputs(config),
        code=module_files("results.summary", "results.plots"),
    output:
        [
            report(
                layout.file("summary", name=name),
                caption=f"../report/{caption_name(name)}",
                category=report_category(name),
            )
            for name in summary_outputs(config)
        ],
    log:
        layout.log("summary/summary"),
    conda:
        ENV
    params:
        study=recorded_config(config),
    script:
        "../scripts/summary.py"


rule manifest:
    input:
        files=manifest_files(),
        code=module_files("results.manifest"),
    output:
        layout.file("manifest"),
    log:
        layout.log("manifest/manifest"),
    conda:
        ENV
    params:
        study=recorded_config(config),
    script:
        "../scripts/manifest.py"


rule bundle:
    input:
        manifest=layout.file("manifest"),
        files=manifest_files(),
        code=module_files("results.bundle"),
    output:
        layout.file("bundle"),
    log:
        layout.log("manifest/bundle"),
    conda:
        ENV
    script:
        "../scripts/bundle.py"
