from pathlib import Path

from kbfuse.results.bundle import make_bundle
from kbfuse.workflow.jobs import job

with job(snakemake.log[0], "bundle"):
    # The bundle holds what <results>/manifest.json lists, whichever study's results these are.
    root = Path(snakemake.input.manifest).parent
    make_bundle(root, snakemake.input.manifest, snakemake.output[0])
