# kbfuse audit (docs/audit.md): the audit: block and its corpus, read at every Snakemake start
# through the corpus's mapping (a problem of either stops the workflow before any job, named);
# each entry is written as a candidate file named after its content, only when its content
# changed (kbfuse.audit.materialise), so a job reruns only for a new or changed entry.
import errno

from kbfuse.audit.materialise import prepare
from kbfuse.audit.settings import audit_settings, audit_targets
from kbfuse.audit.summary import OUTPUTS as AUDIT_OUTPUTS

# The audit's settings, its entries and their files, for workflow/rules/audit.smk (and the
# manifest's list, workflow/rules/common.smk).
try:
    AUDIT = audit_settings(config.get("audit"))
    AUDIT_ROOT = layout.file("audit_root", audit=AUDIT["name"] or "none")
    AUDIT_ENTRIES, AUDIT_MODES = (
        prepare(AUDIT, AUDIT_ROOT) if AUDIT["corpus"] else ({}, [])
    )
except KbfuseError as exc:
    sys.exit(str(exc))


def audit_file(kind, /, **wildcards):
    return layout.audit_file(kind, AUDIT_ROOT, **wildcards)


# one verdict per entry and numerics mode measured (the claims' first)
AUDIT_VERDICTS = [
    audit_file("verdict", numerics=mode, entry=name)
    for mode in AUDIT_MODES
    for name in AUDIT_ENTRIES
]
AUDIT_SUMMARY = [audit_file("summary", name=name) for name in AUDIT_OUTPUTS]
# the index holds the claims and the corpus's digests; the candidates' code stays out
AUDIT_IN_MANIFEST = (
    [audit_file("index"), *AUDIT_VERDICTS, *AUDIT_SUMMARY]
    if AUDIT["corpus"] and AUDIT["in_manifest"]
    else []
)
# judged against the corpus's own task code: its file beside the candidate's
AUDIT_TASK = {"task": audit_file("task")} if AUDIT["references"] == "corpus" else {}


def audit_check_settings(wildcards):
    """The check: block's settings in the job's numerics mode."""
    return {**CHECK, "numerics": wildcards.numerics}


def audit_scratch_mb(wildcards, input):
    """The entry's `scratch_mb` resource (kbfuse.candidates.check.scratch_mb), at most the
    run's `--resources scratch_mb`; 0 against the corpus's own task code (never imported
    here). Until the checkout and contract exist it is not known yet: Snakemake evaluates it
    again when the job is ready."""
    from kbfuse.candidates.check import scratch_mb  # torch: only once a job is planned

    if AUDIT_TASK:
        return 0
    for path in (input.checkout, input.contract):
        if not Path(path).exists():
            raise FileNotFoundError(errno.ENOENT, "not made yet", path)
    budget = workflow.global_resources.get("scratch_mb")
    return scratch_mb(
        input.checkout,
        *AUDIT_ENTRIES[wildcards.entry],
        input.contract,
        audit_check_settings(wildcards),
        None if budget is None else budget.value,
    )
