# kbfuse audit of a published corpus (docs/audit.md): one job per entry and numerics mode,
# checked with the check's script and settings (the check: block; workflow/rules/check.smk),
# and the summary that puts each entry's claims beside what was measured. audit_common.smk
# reads the corpus.


wildcard_constraints:
    entry="|".join(map(re.escape, AUDIT_ENTRIES)) or "no-entries",


rule audit_candidate:
    input:
        **AUDIT_TASK,
        candidate=audit_file("candidate"),
        checkout=layout.file("checkout"),
        record=layout.file("checkout_record"),
        contract=CONTRACT,
        code=CHECK_CODE,
        schema="src/kbfuse/schemas/check_candidate.json",
    output:
        verdict=audit_file("verdict"),
    log:
        layout.log(f"audit/{AUDIT['name']}/{{numerics}}/{{entry}}"),
    wildcard_constraints:
        numerics="|".join(map(re.escape, AUDIT_MODES)) or "no-modes",
    conda:
        ENV
    # as check_candidate: builds and references beside other jobs, timing with the GPU alone;
    # with --resources scratch_mb=N, started only when its cases fit the disk beside the others
    resources:
        gpu_jobs=1,
        scratch_mb=audit_scratch_mb,
    # the check: block's settings, measured in the job's numerics mode
    params:
        settings=audit_check_settings,
        task=lambda wildcards: list(AUDIT_ENTRIES[wildcards.entry]),
        # an entry whose cases this machine's scratch disk cannot hold is `not checked`
        record_refusal=True,
    script:
        "../scripts/check_candidate.py"


rule audit_summary:
    input:
        index=audit_file("index"),
        verdicts=AUDIT_VERDICTS,
        checkout=layout.file("checkout"),
        code=module_files("audit.summary"),
        schemas=[
            "src/kbfuse/schemas/audit_entries.json",
            "src/kbfuse/schemas/check_candidate.json",
        ],
    output:
        [
            report(
                name,
                caption=f"../report/audit_{Path(name).stem}.rst",
                category="Audit",
            )
            for name in AUDIT_SUMMARY
        ],
    log:
        layout.log(f"audit/{AUDIT['name']}/summary"),
    conda:
        ENV
    script:
        "../scripts/audit_summary.py"


# Without audit.corpus there is nothing to audit: the target says so (an input function runs
# only when the target is asked for).
rule audit:
    input:
        lambda wildcards: audit_targets(AUDIT, AUDIT_VERDICTS + AUDIT_SUMMARY),
