# The second fused study (docs/fused2.md): the first study's rules, each reused as
# fused2_<rule> with the `fused2` block's config (kbfuse.workflow.studies.fused2_config) and
# its paths under results/fused2/. The scripts are the same; only what the rules hand them
# differs. `snakemake --cores 16 fused2` runs it all.


# As the first study's: on a cluster these run on the submitting host (profiles/slurm).
localrules:
    fused2_kernelbench_task,
    fused2_kernelbench_pin,
    fused2_kernelbench_contract,
    fused2_direction_witness,
    fused2_margin_audit,
    fused2_summary,
    fused2_manifest,
    fused2_bundle,
    fused2_survey_rows,


use rule kernelbench_task as fused2_kernelbench_task with:
    output:
        pin=F2.file("task_pin"),
    log:
        F2.log("kernelbench/task-{task}"),
    wildcard_constraints:
        task=F2_TASKS,


use rule kernelbench_pin as fused2_kernelbench_pin with:
    input:
        record=layout.file("checkout_record"),
        tasks=[F2.task_pin(task) for task in F2.tasks],
        code=module_files("tasks.kernelbench"),
    output:
        pin=F2.record("kernelbench_pin"),
    log:
        F2.log("kernelbench/pin"),


use rule kernelbench_contract as fused2_kernelbench_contract with:
    output:
        contract=F2.record("kernelbench_contract"),
    log:
        F2.log("kernelbench/contract"),


use rule compile_variant as fused2_compile_variant with:
    input:
        source=f2_variant_source,
        headers=f2_variant_headers,
        code=module_files("compilation.compile"),
    output:
        artifact=F2.file("artifact"),
        meta=F2.record("compile"),
    log:
        F2.log("compile/{variant}"),
    benchmark:
        F2.benchmark("compile/{variant}")
    wildcard_constraints:
        variant=F2_VARIANTS,
    resources:
        gpu=f2_compile_gpu,
    params:
        spec=f2_variant_spec,
        arch=FUSED2_CONFIG["arch"],


use rule verify_variants as fused2_verify_variants with:
    input:
        artifacts=F2.artifact_files(),
        checkout=layout.file("checkout"),
        pins=[],
        code=module_files("checks.verify"),
    output:
        F2.verify_files(),
    log:
        F2.log("verify/variants"),
    benchmark:
        F2.benchmark("verify/variants")
    params:
        artifacts=f2_artifacts,
        outputs=f2_outputs_by_variant,


use rule env_fingerprint as fused2_env_fingerprint with:
    output:
        F2.record("env"),
    log:
        F2.log("env/fingerprint"),
    benchmark:
        F2.benchmark("env/fingerprint")


use rule correctness_variants as fused2_correctness_variants with:
    input:
        unpack(f2_task_inputs),
        artifacts=F2.artifact_files(),
        code=module_files("checks.correctness", "tasks.evaluator"),
    output:
        [F2.record("correctness", variant=v) for v in F2.variants],
    log:
        F2.log("correctness/{task}/variants"),
    benchmark:
        F2.benchmark("correctness/{task}/variants")
    wildcard_constraints:
        task=F2_TASKS,
    params:
        artifacts=f2_artifacts,
        outputs=f2_outputs_by_variant,
        seeds=FUSED2_CONFIG["seeds"],
        distributions=FUSED2_CONFIG["distributions"],
        input_seed=FUSED2_CONFIG["timing"]["input_seed"],
        numerics=f2_numerics,


use rule correctness_baselines as fused2_correctness_baselines with:
    input:
        unpack(f2_task_inputs),
        code=module_files("checks.correctness", "tasks.evaluator"),
    output:
        F2.record("correctness_baselines"),
    log:
        F2.log("correctness/{task}/baselines"),
    benchmark:
        F2.benchmark("correctness/{task}/baselines")
    wildcard_constraints:
        task=F2_TASKS,
    params:
        seeds=FUSED2_CONFIG["seeds"],
        distributions=FUSED2_CONFIG["distributions"],
        input_seed=FUSED2_CONFIG["timing"]["input_seed"],
        baselines=[b for b in FUSED2_CONFIG["baselines"] if b != "eager"],
        numerics=f2_numerics,


use rule timing as fused2_timing with:
    input:
        unpack(f2_timing_inputs),
    output:
        F2.record("timing"),
    log:
        F2.log("timing/{task}"),
    benchmark:
        F2.benchmark("timing/{task}")
    wildcard_constraints:
        task=F2_TASKS,
    params:
        artifacts=f2_artifacts,
        correctness=f2_correctness,
        baselines=FUSED2_CONFIG["baselines"],
        protocol=FUSED2_CONFIG["timing"],
        numerics=f2_numerics,


use rule controls as fused2_controls with:
    input:
        unpack(f2_controls_inputs),
    output:
        F2.record("controls"),
    log:
        F2.log("controls/{task}"),
    benchmark:
        F2.benchmark("controls/{task}")
    wildcard_constraints:
        task=F2_TASKS,
    params:
        artifacts=f2_artifacts,
        correctness=f2_correctness,
        baselines=FUSED2_CONFIG["baselines"],
        controls=FUSED2_CONFIG["controls"],
        protocol=FUSED2_CONFIG["timing"],
        numerics=f2_numerics,


use rule direction_witness as fused2_direction_witness with:
    input:
        contract=F2.record("kernelbench_contract"),
        code=module_files("checks.protocol", "tasks.evaluator"),
    output:
        F2.record("direction_witness"),
    log:
        F2.log("protocol/direction_witness"),


use rule margin_audit as fused2_margin_audit with:
    input:
        results=F2.gpu_results(),
        code=module_files("checks.protocol"),
    output:
        F2.record("margin_audit"),
    log:
        F2.log("protocol/margin_audit"),


# The survey's rows the prediction compares with, copied into the study's results with the
# sha256 of each table read: a new survey reruns it and the summary, and the bundle holds them.
rule fused2_survey_rows:
    input:
        tables=f2_survey_tables(),
        code=module_files("results.prediction"),
    output:
        F2.record("survey_rows"),
    log:
        F2.log("prediction/survey_rows"),
    conda:
        ENV
    params:
        study=prediction_settings(FUSED2_CONFIG),
    script:
        "../scripts/survey_rows.py"


use rule summary as fused2_summary with:
    input:
        results=layout.summary_inputs(FUSED2_CONFIG, FUSED2_ROOT),
        code=module_files("results.summary", "results.plots", "results.prediction"),
    output:
        F2.summary_files(),
    log:
        F2.log("summary/summary"),
    params:
        study=recorded_config(FUSED2_CONFIG),


use rule manifest as fused2_manifest with:
    input:
        files=F2.manifest_files(),
        code=module_files("results.manifest"),
    output:
        F2.file("manifest"),
    log:
        F2.log("manifest/manifest"),
    params:
        study=recorded_config(FUSED2_CONFIG),


use rule bundle as fused2_bundle with:
    input:
        manifest=F2.file("manifest"),
        files=F2.manifest_files(),
        code=module_files("results.bundle"),
    output:
        F2.file("bundle"),
    log:
        F2.log("manifest/bundle"),


rule fused2:
    input:
        F2.all_targets(),


# Without a GPU: the second study's pins, contract, NVRTC compiles and direction witness.
rule fused2_cpu:
    input:
        lambda wildcards: announce_cpu_target(
            FUSED2_CONFIG["arch"], F2.cpu_targets(f2_compiles_without_gpu)
        ),
