# The survey of KernelBench level-2 tasks (config key survey; config/README.md): one record per
# task and numerics mode, results/survey/{numerics}/tasks/{task}.json. The task list is a
# checkpoint (survey.tasks: all is resolved against the pinned checkout); each task is pinned
# on its own (its file's sha256 a param, so editing one task file reruns that task only), and
# the per-task jobs' params leave out the task list, so adding a task reruns nothing else.
# The summary and the `survey` target live in survey_summary.smk.
include: "survey_common.smk"


checkpoint survey_task_list:
    input:
        checkout=SURVEY_CHECKOUT,
        record="results/kernelbench/checkout.json",
    output:
        "results/survey/task_list.json",
    log:
        "results/survey/logs/task_list.log",
    conda:
        ENV
    params:
        tasks=SURVEY["tasks"],
    script:
        "../scripts/survey_task_list.py"


rule survey_pin:
    input:
        unpack(survey_pin_inputs),
    output:
        "results/survey/pins/{survey_task}.json",
    log:
        "results/survey/logs/pins/{survey_task}.log",
    wildcard_constraints:
        survey_task="[1-9][0-9]*",
    conda:
        ENV
    params:
        sha256=survey_pin_sha256,
    script:
        "../scripts/survey_pin.py"


# Inductor's compile, ahead of the timing job and beside other jobs: no gpu resource.
rule survey_compile:
    input:
        checkout=SURVEY_CHECKOUT,
        pin="results/survey/pins/{survey_task}.json",
        code=SURVEY_CODE,
    output:
        "results/survey/{numerics}/compiled/{survey_task}.json",
    log:
        "results/survey/{numerics}/logs/{survey_task}.compile.log",
    benchmark:
        "results/benchmarks/survey/{numerics}/{survey_task}.compile.tsv"
    wildcard_constraints:
        survey_task="[1-9][0-9]*",
        numerics="strict|kernelbench-defaults",
    conda:
        ENV
    params:
        settings=SURVEY_JOB_SETTINGS,
        cache="results/survey/.cache",
    script:
        "../scripts/survey_compile.py"


rule survey_task:
    input:
        unpack(survey_task_inputs),
    output:
        "results/survey/{numerics}/tasks/{survey_task}.json",
    log:
        "results/survey/{numerics}/logs/{survey_task}.log",
    benchmark:
        "results/benchmarks/survey/{numerics}/{survey_task}.tsv"
    wildcard_constraints:
        survey_task="[1-9][0-9]*",
        numerics="strict|kernelbench-defaults",
    conda:
        ENV
    resources:
        gpu=1 if SURVEY["device"] == "cuda" else 0,
    params:
        settings=SURVEY_JOB_SETTINGS,
        cache="results/survey/.cache",
    script:
        "../scripts/survey_task.py"


rule survey_records:
    input:
        survey_record_files,
