from kbfuse.jobs import job
from kbfuse.manifest import build_manifest

with job(snakemake.log[0], "manifest"):
    build_manifest("results", snakemake.input.files, snakemake.params.study, snakemake.output[0])
