# Settings and input functions of the survey's rules (survey.smk).
from kbfuse import layout
from kbfuse.survey.settings import survey_settings
from kbfuse.survey.tasks import (
    check_tasks_at_checkout,
    read_task_list,
    task_file_sha256,
)

SURVEY = survey_settings(config)
# Unknown task numbers are refused here when the pinned checkout is already present (and by
# the survey_task_list job, the first survey job, when it is not).
try:
    check_tasks_at_checkout(
        SURVEY, layout.file("checkout"), layout.file("checkout_record"), config
    )
except KbfuseError as exc:
    sys.exit(f"kbfuse: {exc}")
SURVEY_CHECKOUT = layout.file("checkout")
# The KernelBench level surveyed: level 2 under results/survey, another under
# results/survey/level<N> (layout.survey_file), so both can sit side by side.
SURVEY_LEVEL = SURVEY["level"]
# (exclude_outlier_devices only moves jobs between GPUs: the cross-device check's param)
SURVEY_JOB_SETTINGS = {
    k: v
    for k, v in SURVEY.items()
    if k not in ("tasks", "numerics", "level", "exclude_outlier_devices")
}


def survey_path(name, **wildcards):
    return layout.survey_file(name, SURVEY_LEVEL, **wildcards)


# A task's job writes the record of every configured numerics mode.
SURVEY_TASK_RECORDS = expand(
    survey_path("survey_record"),
    numerics=SURVEY["numerics"],
    survey_task="{survey_task}",
)
# What the jobs run (not the summary's modules: editing those reruns no GPU job).
SURVEY_CODE = module_files("survey.job", "workflow.jobs")
SURVEY_FLOOR_CODE = module_files("survey.floor")


def survey_task_list():
    return checkpoints.survey_task_list.get().output[0]


def survey_pin_inputs(wildcards):
    survey_task_list()  # the task exists at the pin (and the checkout is there) first
    return {
        "checkout": SURVEY_CHECKOUT,
        "record": layout.file("checkout_record"),
    }


def survey_pin_sha256(wildcards):
    return task_file_sha256(SURVEY_CHECKOUT, SURVEY_LEVEL, int(wildcards.survey_task))


def survey_floor_files(wildcards):
    return expand(
        survey_path("survey_floor"), survey_task=read_task_list(survey_task_list())
    )


def survey_record_files(wildcards):
    return expand(
        survey_path("survey_record"),
        numerics=SURVEY["numerics"],
        survey_task=read_task_list(survey_task_list()),
    )
