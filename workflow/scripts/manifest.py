from kbfuse.layout import RESULTS
from kbfuse.results.manifest import build_manifest
from kbfuse.workflow.jobs import job

with job(snakemake.log[0], "manifest"):
    root = snakemake.params.get("root", RESULTS)
    build_manifest(root, snakemake.input.files, snakemake.params.study, snakemake.output[0])
