from kbfuse.jobs import job

with job(snakemake.log[0], "env", gpu=True):
    from kbfuse.envinfo import write_fingerprint

    write_fingerprint(out=snakemake.output[0], log=None)
