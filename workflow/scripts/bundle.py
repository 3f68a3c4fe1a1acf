from kbfuse.layout import RESULTS
from kbfuse.results.bundle import make_bundle
from kbfuse.workflow.jobs import job

with job(snakemake.log[0], "bundle"):
    make_bundle(snakemake.params.get("root", RESULTS), snakemake.input.manifest, snakemake.output[0])
