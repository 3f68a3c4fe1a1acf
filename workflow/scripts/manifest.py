from pathlib import Path

from kbfuse.results.manifest import build_manifest
from kbfuse.workflow.jobs import job

with job(snakemake.log[0], "manifest"):
    # The manifest is <results>/manifest.json, whichever study's results these are.
    root = Path(snakemake.output[0]).parent
    build_manifest(root, snakemake.input.files, snakemake.params.study, snakemake.output[0])
