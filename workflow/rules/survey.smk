# The survey of KernelBench level-2 tasks (config key survey; config/README.md): one job per
# task, one record per task and numerics mode, results/survey/{numerics}/tasks/{task}.json.
# The task list is a checkpoint (survey.tasks: all is resolved against the pinned checkout); each task is pinned
# on its own (its file's sha256 a param, so editing one task file reruns that task only), and
# the per-task jobs' params leave out the task list, so adding a task reruns nothing else.
# The summary and the `survey` target live in survey_summary.smk.
include: "survey_common.smk"


checkpoint survey_task_list:
    input:
        checkout=SURVEY_CHECKOUT,
        record=layout.file("checkout_record"),
    output:
        survey_path("survey_task_list"),
    log:
        survey_path("survey_task_list_log"),
    conda:
        ENV
    params:
        tasks=SURVEY["tasks"],
        level=SURVEY_LEVEL,
    script:
        "../scripts/survey_task_list.py"


rule survey_pin:
    input:
        unpack(survey_pin_inputs),
    output:
        survey_path("survey_pin"),
    log:
        survey_path("survey_pin_log"),
    wildcard_constraints:
        survey_task="[1-9][0-9]*",
    conda:
        ENV
    params:
        sha256=survey_pin_sha256,
        level=SURVEY_LEVEL,
    script:
        "../scripts/survey_pin.py"


# One job per task makes every numerics mode's record (the baselines built once). Up to
# `gpu_jobs` of them share the GPU (the default profile's cap); each times alone under the GPU
# lock (kbfuse.workflow.gpulock), so their start-up and builds overlap but no timing does.
rule survey_task:
    input:
        checkout=SURVEY_CHECKOUT,
        pin=survey_path("survey_pin"),
        contract=CONTRACT,
        code=SURVEY_CODE,
    output:
        SURVEY_TASK_RECORDS,
    log:
        survey_path("survey_log"),
    benchmark:
        layout.benchmark(f"{layout.survey_root(SURVEY_LEVEL)}/{{survey_task}}")
    wildcard_constraints:
        survey_task="[1-9][0-9]*",
    conda:
        ENV
    resources:
        gpu_jobs=1,
    params:
        settings=SURVEY_JOB_SETTINGS,
        modes=SURVEY["numerics"],
        cache=survey_path("survey_cache"),
    script:
        "../scripts/survey_task.py"


rule survey_records:
    input:
        survey_record_files,
