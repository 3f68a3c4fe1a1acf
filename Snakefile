# kbfuse: fused pointwise CUDA tails on KernelBench level-2 tasks, checked bit for bit
# against PyTorch and timed against eager, TorchScript and Inductor. See README.md.
import sys
from pathlib import Path

from snakemake.utils import min_version, validate

min_version("9.0")

# The library lives in src/ (scripts find it through workflow/scripts/kbfuse, a link to it,
# since Snakemake puts a script's own folder on its path).
sys.path.insert(0, str(Path(workflow.basedir) / "src"))


configfile: "config/config.yaml"


report: "workflow/report/workflow.rst"


# kbfuse's check first (its messages name key and value), then Snakemake's own, which
# fills in the schema's defaults.
from kbfuse.config import validate_schema

validate_schema(config)
validate(config, "workflow/schemas/config.schema.yaml")


include: "workflow/rules/common.smk"
include: "workflow/rules/kernelbench.smk"
include: "workflow/rules/compile.smk"
include: "workflow/rules/verify.smk"
include: "workflow/rules/env.smk"
include: "workflow/rules/correctness.smk"
include: "workflow/rules/timing.smk"
include: "workflow/rules/controls.smk"
include: "workflow/rules/protocol.smk"
include: "workflow/rules/summary.smk"


# On a cluster these run on the submitting host: the checkout needs the network, the others
# take seconds of CPU on small files (profiles/slurm).
localrules:
    kernelbench_checkout,
    kernelbench_task,
    kernelbench_pin,
    direction_witness,
    margin_audit,
    summary,
    manifest,
    bundle,


rule all:
    default_target: True
    input:
        all_targets(),


rule cpu:
    input:
        cpu_targets(),
