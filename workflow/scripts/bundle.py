from kbfuse.bundle import make_bundle
from kbfuse.jobs import job
from kbfuse.layout import RESULTS

with job(snakemake.log[0], "bundle"):
    make_bundle(RESULTS, snakemake.input.manifest, snakemake.output[0])
