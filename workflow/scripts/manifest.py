from kbfuse.jobs import job
from kbfuse.layout import RESULTS
from kbfuse.manifest import build_manifest

with job(snakemake.log[0], "manifest"):
    build_manifest(RESULTS, snakemake.input.files, snakemake.params.study, snakemake.output[0])
