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


# A task's memory floor (kbfuse.survey.floor), found on the CPU from its pinned file: a job of
# its own, with no GPU, so that it runs beside the task jobs rather than in the summary (a
# level-3 GRU's fake forward takes a minute).
rule survey_floor:
    input:
        checkout=SURVEY_CHECKOUT,
        pin=survey_path("survey_pin"),
        code=SURVEY_FLOOR_CODE,
    output:
        survey_path("survey_floor"),
    log:
        survey_path("survey_floor_log"),
    wildcard_constraints:
        survey_task="[1-9][0-9]*",
    conda:
        ENV
    params:
        semantics=SURVEY["semantics"],
    script:
        "../scripts/survey_floor.py"


# The cross-device check (kbfuse.survey.agreement): one reference kernel timed on every
# visible GPU, each alone, before any task job; on one GPU (or the CPU) it only names the
# device. Devices off the others are reported, and left out of the task jobs' placement with
# survey.exclude_outlier_devices. Its code is no input: editing it does not rerun the survey.
# It takes each GPU's lock alone in turn itself, so it declares no GPU resource; on a Slurm
# cluster it is a local rule (each cluster job sees the one GPU it is given: nothing to place).
rule survey_devices:
    output:
        survey_path("survey_devices"),
    log:
        survey_path("survey_devices_log"),
    conda:
        ENV
    params:
        device=SURVEY["device"],
        exclude=SURVEY["exclude_outlier_devices"],
    script:
        "../scripts/survey_devices.py"


# One job per task makes every numerics mode's record (the baselines built once). Up to
# `gpu_jobs` of them run at once, each placed on one of the visible GPUs
# (kbfuse.workflow.devices: the one with the fewest jobs); on its device each times alone
# under the device's GPU lock (kbfuse.workflow.gpulock), so their start-up and builds overlap
# but no timing does. The cross-device check's record is read for the devices to leave out; a
# new check (the switch changed) reruns the task jobs, which it may move.
rule survey_task:
    input:
        checkout=SURVEY_CHECKOUT,
        pin=survey_path("survey_pin"),
        contract=CONTRACT,
        code=SURVEY_CODE,
        devices=survey_path("survey_devices"),
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
