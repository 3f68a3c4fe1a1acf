# Helpers of the second fused study's rules (workflow/rules/fused2.smk): its config
# (kbfuse.workflow.studies.fused2_config), its paths (StudyFiles, under results/fused2/) and
# the input and param functions its rules use, as common.smk's are the first study's.
from kbfuse.results.prediction import survey_table
from kbfuse.workflow.studies import (
    FUSED2_ROOT,
    StudyFiles,
    fused2_config,
    numerics_for,
    prediction_settings,
)

FUSED2_CONFIG = fused2_config(config)
F2 = StudyFiles(FUSED2_CONFIG, FUSED2_ROOT)
F2_TASKS = "|".join(str(t) for t in F2.tasks)
F2_VARIANTS = "|".join(F2.variants)


def f2_variant_spec(wildcards):
    return _variant_spec(FUSED2_CONFIG, wildcards.variant)


def f2_variant_source(wildcards):
    return f"kernels/{f2_variant_spec(wildcards)['kernel']}.cu"


def f2_variant_headers(wildcards):
    return [str(path) for path in included_headers(f2_variant_source(wildcards))]


def f2_compiles_without_gpu(variant):
    route = ROUTES[FUSED2_CONFIG["variants"][variant]["route"]]
    return FUSED2_CONFIG["arch"] != "auto" and not route.needs_gpu_to_compile


def f2_compile_gpu(wildcards):
    return 0 if f2_compiles_without_gpu(wildcards.variant) else 1


def f2_artifacts(wildcards=None):
    return F2.artifacts()


def f2_correctness(wildcards):
    return F2.correctness_files(wildcards.task)


def f2_outputs_by_variant(wildcards, output):
    return dict(zip(F2.variants, output, strict=True))


def f2_task_inputs(wildcards):
    return {
        "checkout": layout.file("checkout"),
        "pin": F2.task_pin(wildcards.task),
        "contract": F2.record("kernelbench_contract"),
    }


def f2_timed_inputs(wildcards, *modules):
    return {
        **f2_task_inputs(wildcards),
        "artifacts": F2.artifact_files(),
        "correctness": list(F2.correctness_files(wildcards.task).values()),
        "baselines": F2.record("correctness_baselines", task=wildcards.task),
        "code": module_files(*modules),
    }


def f2_timing_inputs(wildcards):
    return f2_timed_inputs(wildcards, "timing.timing")


def f2_controls_inputs(wildcards):
    return f2_timed_inputs(wildcards, "checks.controls", "tasks.evaluator")


def f2_numerics(wildcards):
    """The numerics mode the job's task runs in (config fused2.numerics)."""
    return numerics_for(FUSED2_CONFIG, wildcards.task)


def f2_survey_tables():
    """The survey tables of the modes the study's tasks run in."""
    modes = dict.fromkeys(numerics_for(FUSED2_CONFIG, task) for task in F2.tasks)
    return [survey_table(FUSED2_CONFIG["survey_summary"], mode) for mode in modes]
