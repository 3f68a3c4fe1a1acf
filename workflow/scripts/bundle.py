from kbfuse.bundle import make_bundle
from kbfuse.jobs import job

with job(snakemake.log[0], "bundle"):
    make_bundle("results", snakemake.input.manifest, snakemake.output[0])
