from kbfuse.workflow.config import variant_spec as _variant_spec
from kbfuse.workflow.deps import module_files
from kbfuse.tasks.kernelbench import recorded_config
from kbfuse.compilation.kernelsrc import included_headers
from kbfuse.compilation.routes import ROUTES
from kbfuse.tasks.registry import WITNESS_TASK
from kbfuse import layout
from kbfuse.layout import caption_name, report_category, summary_inputs, summary_outputs
from kbfuse.results.manifest import survey_files

ENV = "../../envs/kbfuse.yaml"
TASKS = [int(t) for t in config["tasks"]]
VARIANTS = list(config["variants"])
# The compiled baselines the study checks and times (config key baselines; eager is the
# reference every check compares with).
COMPILED_BASELINES = [b for b in config["baselines"] if b != "eager"]


wildcard_constraints:
    task="|".join(str(t) for t in TASKS),
    variant="|".join(VARIANTS),


def variant_spec(wildcards):
    return _variant_spec(config, wildcards.variant)


def variant_source(wildcards):
    return f"kernels/{_variant_spec(config, wildcards.variant)['kernel']}.cu"


def variant_headers(wildcards):
    """The headers the variant's kernel source includes: editing one recompiles it."""
    return [str(path) for path in included_headers(variant_source(wildcards))]


def compiles_without_gpu(variant):
    route = ROUTES[config["variants"][variant]["route"]]
    return config["arch"] != "auto" and not route.needs_gpu_to_compile


def compile_gpu(wildcards):
    return 0 if compiles_without_gpu(wildcards.variant) else 1


def artifacts(variants=None):
    return {
        v: (layout.file("artifact", variant=v), layout.record("compile", variant=v))
        for v in (VARIANTS if variants is None else variants)
    }


def artifact_files(variants=None):
    return [path for pair in artifacts(variants).values() for path in pair]


def task_pin(task):
    return layout.file("task_pin", task=task)


def witness_pins():
    """The witness task's pin when the study includes it (verify and witness81 use its tail)."""
    return [task_pin(WITNESS_TASK)] if WITNESS_TASK in TASKS else []


def variant_artifacts(wildcards=None):
    """variant -> (artifact, meta), for the jobs that load every variant."""
    return artifacts()


def variant_correctness(wildcards):
    return correctness_files(wildcards.task)


def correctness_files(task):
    return {v: layout.record("correctness", task=task, variant=v) for v in VARIANTS}


def verify_files():
    return [layout.record("verify", variant=v) for v in VARIANTS]


def outputs_by_variant(wildcards, output):
    """variant -> output path, for the jobs that write one file per variant (in VARIANTS order)."""
    return dict(zip(VARIANTS, output, strict=True))


CONTRACT = layout.record("kernelbench_contract")


def task_inputs(wildcards):
    return {
        "checkout": layout.file("checkout"),
        "pin": task_pin(wildcards.task),
        "contract": CONTRACT,
    }


GPU_RECORDS = (
    "verify",
    "env",
    "witness81",
    "correctness",
    "correctness_baselines",
    "timing",
    "controls",
)


def gpu_results():
    """Every record the GPU jobs write (what the margin audit reads)."""
    return layout.record_files(config, GPU_RECORDS)


def cpu_targets():
    cpu_variants = [v for v in VARIANTS if compiles_without_gpu(v)]
    return [
        layout.record("kernelbench_pin"),
        CONTRACT,
        *artifact_files(cpu_variants),
        layout.record("direction_witness"),
    ]


def study_results():
    """Every result of the study proper: what the summary reads and the manifest hashes."""
    return [
        layout.record("kernelbench_pin"),
        CONTRACT,
        *artifact_files(),
        *gpu_results(),
        layout.record("direction_witness"),
        layout.record("margin_audit"),
    ]


def summary_files():
    return [layout.file("summary", name=name) for name in summary_outputs(config)]


def manifest_files():
    # a survey's records and summary, when results/survey holds one (docs/survey.md), and
    # CHECK_IN_MANIFEST (workflow/rules/check.smk): the check verdicts when check.in_manifest,
    # and AUDIT_IN_MANIFEST (workflow/rules/audit.smk): an audit's when audit.in_manifest
    survey = [f"{layout.RESULTS}/{rel}" for rel in survey_files(layout.RESULTS)]
    return (
        study_results()
        + summary_files()
        + survey
        + CHECK_IN_MANIFEST
        + AUDIT_IN_MANIFEST
    )


def all_targets():
    return [
        *manifest_files(),
        layout.file("manifest"),
        layout.file("bundle"),
    ]


def timing_inputs(wildcards):
    return {
        **task_inputs(wildcards),
        "artifacts": artifact_files(),
        "correctness": list(correctness_files(wildcards.task).values()),
        "baselines": layout.record("correctness_baselines", task=wildcards.task),
        "code": module_files("timing.timing"),
    }


def controls_inputs(wildcards):
    return {
        **task_inputs(wildcards),
        "artifacts": artifact_files(),
        "correctness": list(correctness_files(wildcards.task).values()),
        "baselines": layout.record("correctness_baselines", task=wildcards.task),
        "code": module_files("checks.controls", "tasks.evaluator"),
    }
