# kbfuse: fused pointwise CUDA tails on KernelBench level-2 tasks, checked bit for bit
# against PyTorch and timed against eager, TorchScript and Inductor. See README.md.
import sys
from pathlib import Path

from snakemake.utils import min_version, validate

min_version("9.0")

# The library lives in src/. This checkout's copy must win over any installed kbfuse (from
# another clone, say), in this process and in every job: Snakemake's script preamble only
# *appends* the script's folder (where workflow/scripts/kbfuse links to src/kbfuse) to the
# path, after site-packages, so the jobs get src/ first through PYTHONPATH, which they inherit.
sys.path.insert(0, str(Path(workflow.basedir) / "src"))

from kbfuse.workflow.jobs import announce_cpu_target, put_first_on_jobs_path

put_first_on_jobs_path(Path(workflow.basedir) / "src")


configfile: "config/config.yaml"


report: "workflow/report/workflow.rst"


# kbfuse's check first (the files, then the merged config; one line per problem naming key
# and value; exit 1 before any job), then Snakemake's own, which fills in the schema's defaults.
from kbfuse.workflow.config import check_workflow_config
from kbfuse.errors import KbfuseError

try:
    check_workflow_config(
        config, workflow.configfiles, Path(workflow.basedir) / "kernels"
    )
except KbfuseError as exc:
    sys.exit(str(exc))
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
include: "workflow/rules/check.smk"
include: "workflow/rules/audit_common.smk"
include: "workflow/rules/audit.smk"
include: "workflow/rules/summary.smk"


# The survey's rules exist where the config has a survey block (config/config.yaml does): a
# copy of the study made from a recorded config (tools/reference_report.py) then holds no
# checkpoint, with which Snakemake's report would list every job of the DAG.
if "survey" in config:

    include: "workflow/rules/survey.smk"
    include: "workflow/rules/survey_summary.smk"


# The second fused study (docs/fused2.md), where the config has its block (config/config.yaml
# does): `snakemake fused2`, results under results/fused2/.
if "fused2" in config:

    include: "workflow/rules/fused2_common.smk"
    include: "workflow/rules/fused2.smk"


# On a cluster these run on the submitting host: the checkout needs the network, the others
# take seconds of CPU on small files (profiles/slurm; a level-3 GRU's survey_floor a minute).
localrules:
    kernelbench_checkout,
    kernelbench_task,
    kernelbench_pin,
    kernelbench_contract,
    direction_witness,
    margin_audit,
    check_summary,
    audit_summary,
    summary,
    manifest,
    bundle,
    survey_task_list,
    survey_devices,
    survey_pin,
    survey_floor,
    survey_records,
    survey_summary,


# A failed cluster job (profiles/slurm): which rule Slurm stopped, and which of its resources to
# raise (kbfuse.workflow.slurm); nothing for a local run.
onerror:
    from kbfuse.workflow.slurm import explain_failures

    explain_failures(log)


rule all:
    default_target: True
    input:
        all_targets(),


# An input function runs only when the target is asked for: then it says why nothing is
# compiled when the architecture is left to a GPU (arch: auto).
rule cpu:
    input:
        lambda wildcards: announce_cpu_target(config["arch"], cpu_targets()),
