# kbfuse check over a folder of candidates (docs/check.md): one job per candidate file, the
# task read from its `# kbfuse-task: 2/53` line, the task file from the pinned checkout. The
# check: settings, every candidate's name and task line are checked here, before any job runs.
import re

from kbfuse import layout
from kbfuse.candidates.spec import check_settings, scan_folder

try:
    CHECK = check_settings(config.get("check"))
    CHECK_FOLDER = Path(CHECK["folder"])
    CANDIDATES = scan_folder(CHECK_FOLDER)
except KbfuseError as exc:
    sys.exit(str(exc))
# every candidates module and what they import (candidate children import theirs by name)
CHECK_CODE = module_files(
    *(
        f"candidates.{p.stem}"
        for p in sorted(Path(workflow.basedir, "src/kbfuse/candidates").glob("*.py"))
    )
)


# Verdicts and their summary: the check target; also the manifest's when check.in_manifest.
CHECK_SUMMARY = {
    key: layout.file("check_summary", name=name)
    for key, name in (
        ("table", "table.csv"),
        ("markdown", "table.md"),
        ("plot", "speedup.png"),
    )
}
CHECK_FILES = [layout.file("check_verdict", candidate=c) for c in CANDIDATES] + list(
    CHECK_SUMMARY.values()
)
CHECK_IN_MANIFEST = CHECK_FILES if CHECK["in_manifest"] else []


wildcard_constraints:
    candidate="|".join(map(re.escape, CANDIDATES)) or "no-candidates",


rule check_candidate:
    input:
        candidate=f"{CHECK_FOLDER}/{{candidate}}.py",
        checkout=layout.file("checkout"),
        record=layout.file("checkout_record"),
        contract=CONTRACT,
        code=CHECK_CODE,
        schema="src/kbfuse/schemas/check_candidate.json",
    output:
        verdict=layout.file("check_verdict"),
    log:
        layout.log("check/{candidate}"),
    conda:
        ENV
    # Several checks at once: each builds and runs its reference beside the others and has the
    # GPU alone while its candidate runs and is timed (the GPU lock, kbfuse.candidates.check).
    resources:
        gpu_jobs=1,
    params:
        settings=CHECK,
        task=lambda wildcards: list(CANDIDATES[wildcards.candidate]),
    script:
        "../scripts/check_candidate.py"


rule check_summary:
    input:
        verdicts=[layout.file("check_verdict", candidate=c) for c in CANDIDATES],
        code=CHECK_CODE,
    output:
        **CHECK_SUMMARY,
    log:
        layout.log("check/summary"),
    conda:
        ENV
    script:
        "../scripts/check_summary.py"


rule check:
    input:
        CHECK_FILES,
