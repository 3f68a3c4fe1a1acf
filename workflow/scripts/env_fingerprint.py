from kbfuse.workflow.jobs import job

with job(snakemake.log[0], "env", gpu=True):
    from kbfuse.workflow.envinfo import write_fingerprint

    write_fingerprint(out=snakemake.output[0], log=None)
