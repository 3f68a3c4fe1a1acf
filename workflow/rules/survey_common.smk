# Settings and input functions of the survey's rules (survey.smk).
from glob import glob as _glob

from kbfuse.survey.precompile import compiled_baselines
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
        SURVEY,
        "results/kernelbench/checkout",
        "results/kernelbench/checkout.json",
        config,
    )
except KbfuseError as exc:
    sys.exit(f"kbfuse: {exc}")
SURVEY_CHECKOUT = "results/kernelbench/checkout"
SURVEY_PRECOMPILE = bool(
    SURVEY["precompile"] and compiled_baselines(SURVEY["baselines"])
)
SURVEY_JOB_SETTINGS = {
    k: v for k, v in SURVEY.items() if k not in ("tasks", "numerics")
}
SURVEY_CODE = sorted(_glob("src/kbfuse/survey/*.py")) + module_files(
    "kernelbench", "measure", "numerics", "records"
)


def survey_task_list():
    return checkpoints.survey_task_list.get().output[0]


def survey_pin_inputs(wildcards):
    survey_task_list()  # the task exists at the pin (and the checkout is there) first
    return {
        "checkout": SURVEY_CHECKOUT,
        "record": "results/kernelbench/checkout.json",
    }


def survey_pin_sha256(wildcards):
    return task_file_sha256(
        SURVEY_CHECKOUT, config["kernelbench"]["level"], int(wildcards.survey_task)
    )


def survey_task_inputs(wildcards):
    inputs = {
        "checkout": SURVEY_CHECKOUT,
        "pin": f"results/survey/pins/{wildcards.survey_task}.json",
        "code": SURVEY_CODE,
    }
    if SURVEY_PRECOMPILE:
        inputs["compiled"] = (
            f"results/survey/{wildcards.numerics}/compiled/{wildcards.survey_task}.json"
        )
    return inputs


def survey_record_files(wildcards):
    return expand(
        "results/survey/{numerics}/tasks/{survey_task}.json",
        numerics=SURVEY["numerics"],
        survey_task=read_task_list(survey_task_list()),
    )
