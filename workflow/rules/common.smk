from kbfuse.config import variant_spec as _variant_spec
from kbfuse.deps import module_files
from kbfuse.kernelbench import recorded_config
from kbfuse.kernelsrc import included_headers
from kbfuse.routes import ROUTES
from kbfuse.summary_layout import caption_name, summary_inputs, summary_outputs

ENV = "../../envs/kbfuse.yaml"
TASKS = [int(t) for t in config["tasks"]]
VARIANTS = list(config["variants"])


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
        v: (f"results/compile/{v}/tails.bin", f"results/compile/{v}/meta.json")
        for v in (VARIANTS if variants is None else variants)
    }


def artifact_files(variants=None):
    return [path for pair in artifacts(variants).values() for path in pair]


def task_pin(task):
    return f"results/kernelbench/tasks/{task}.json"


def witness_pins():
    """Task 81's pin when the study includes it (verify and witness81 use its tail)."""
    return [task_pin(81)] if 81 in TASKS else []


def variant_artifacts(wildcards=None):
    """variant -> (artifact, meta), for the jobs that load every variant."""
    return artifacts()


def variant_correctness(wildcards):
    return correctness_files(wildcards.task)


def correctness_files(task):
    return {v: f"results/correctness/{task}/{v}.json" for v in VARIANTS}


def verify_files():
    return [f"results/verify/{v}.json" for v in VARIANTS]


def outputs_by_variant(wildcards, output):
    """variant -> output path, for the jobs that write one file per variant (in VARIANTS order)."""
    return dict(zip(VARIANTS, output, strict=True))


def task_inputs(wildcards):
    return {
        "checkout": "results/kernelbench/checkout",
        "pin": task_pin(wildcards.task),
    }


def gpu_results():
    files = verify_files()
    files += ["results/env/fingerprint.json"]
    if 81 in TASKS:
        files += ["results/controls/witness81.json"]
    files += expand(
        "results/correctness/{task}/{variant}.json", task=TASKS, variant=VARIANTS
    )
    files += expand("results/correctness/{task}/baselines.json", task=TASKS)
    files += expand("results/timing/{task}.json", task=TASKS)
    files += expand("results/controls/{task}.json", task=TASKS)
    return files


def cpu_targets():
    cpu_variants = [v for v in VARIANTS if compiles_without_gpu(v)]
    return [
        "results/kernelbench/pin.json",
        *artifact_files(cpu_variants),
        "results/protocol/direction_witness.json",
    ]


def study_results():
    """Every result of the study proper: what the summary reads and the manifest hashes."""
    return [
        "results/kernelbench/pin.json",
        *artifact_files(),
        *gpu_results(),
        "results/protocol/direction_witness.json",
        "results/protocol/margin_audit.json",
    ]


def summary_files():
    return [f"results/summary/{name}" for name in summary_outputs(config)]


def manifest_files():
    # CHECK_IN_MANIFEST (workflow/rules/check.smk): the check verdicts when check.in_manifest
    return study_results() + summary_files() + CHECK_IN_MANIFEST


def report_category(name):
    if name.endswith(".png"):
        return "Plots"
    if name.startswith(("timing", "small_shapes", "ftz_cost", "position_effect")):
        return "Time"
    if name.startswith(("environment",)):
        return "Environment"
    return "Bits"


def all_targets():
    return [
        *manifest_files(),
        "results/manifest.json",
        "results/bundle/kbfuse-results.tar.gz",
    ]


def timing_inputs(wildcards):
    return {
        **task_inputs(wildcards),
        "artifacts": artifact_files(),
        "correctness": list(correctness_files(wildcards.task).values()),
        "baselines": f"results/correctness/{wildcards.task}/baselines.json",
        "code": module_files("timing"),
    }


def controls_inputs(wildcards):
    return {
        **task_inputs(wildcards),
        "artifacts": artifact_files(),
        "correctness": list(correctness_files(wildcards.task).values()),
        "baselines": f"results/correctness/{wildcards.task}/baselines.json",
        "code": module_files("controls"),
    }
