# kbfuse check over a folder of candidates (docs/check.md): one job per candidate file, the
# task read from its `# kbfuse-task: 2/53` line, the task file from the pinned checkout. The
# check: settings and every candidate's task line are checked here, before any job runs.
from kbfuse.candidates.spec import check_settings, task_of_file

try:
    CHECK = check_settings(config.get("check"))
    CHECK_FOLDER = Path(CHECK["folder"])
    CANDIDATES = {p.stem: task_of_file(p) for p in sorted(CHECK_FOLDER.glob("*.py"))}
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
CHECK_FILES = [f"results/check/{c}.json" for c in CANDIDATES] + [
    f"results/check/summary/{name}" for name in ("table.csv", "table.md", "speedup.png")
]
CHECK_IN_MANIFEST = CHECK_FILES if CHECK["in_manifest"] else []


wildcard_constraints:
    candidate="|".join(CANDIDATES) or "no-candidates",


rule check_candidate:
    input:
        candidate=f"{CHECK_FOLDER}/{{candidate}}.py",
        checkout="results/kernelbench/checkout",
        record="results/kernelbench/checkout.json",
        code=CHECK_CODE,
        schema="src/kbfuse/schemas/check_candidate.json",
    output:
        verdict="results/check/{candidate}.json",
    log:
        "results/logs/check/{candidate}.log",
    conda:
        ENV
    resources:
        gpu=1,
    params:
        settings=CHECK,
        task=lambda wildcards: list(CANDIDATES[wildcards.candidate]),
    script:
        "../scripts/check_candidate.py"


rule check_summary:
    input:
        verdicts=expand("results/check/{candidate}.json", candidate=CANDIDATES),
        code=CHECK_CODE,
    output:
        table="results/check/summary/table.csv",
        markdown="results/check/summary/table.md",
        plot="results/check/summary/speedup.png",
    log:
        "results/logs/check/summary.log",
    conda:
        ENV
    script:
        "../scripts/check_summary.py"


rule check:
    input:
        CHECK_FILES,
