# What a device call's Snakemake runs are given, shared by tools/h200-run.sh (which runs them)
# and tools/resume-plan.sh (which plans them on the development machine first), so that the
# plan asks Snakemake what the call will ask it. Sourced, not run.

# where the carried corpus (.corpus/cuda_l1_h100.json.xz) is unpacked: among the audit's params
DEVICE_CORPUS=/tmp/corpus/cuda_l1_h100.json

# A resumed run compares params and the software, not the set of inputs: every job lists the
# code it runs (each module, each schema), so a commit that adds a file would redo every
# finished job without changing what one computes (session 26's first call redid 55 audit
# verdicts so). RESUME_RERUN_TRIGGERS="params input software-env" compares the set too; to redo
# jobs that a change does concern, leave their outputs out of the pack (tools/resume-pack.sh
# PATH...).
resume_triggers() { echo "${RESUME_RERUN_TRIGGERS:-params software-env}"; }

# The audit's config items, one a line: CUDA-L1's H100 kernels, and the timing's spread when
# AUDIT_SPREAD is set.
audit_items() {
  echo "audit={corpus: $DEVICE_CORPUS, mapping: cuda_l1, name: cuda_l1_h100}"
  if [ -n "${AUDIT_SPREAD:-}" ]; then echo "check={timing: {spread: $AUDIT_SPREAD}}"; fi
}
