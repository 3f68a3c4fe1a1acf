from kbfuse.io import write_json
from kbfuse.results import records
from kbfuse.survey.floor import KIND, floor_record
from kbfuse.workflow.jobs import job

with job(snakemake.log[0], "survey_floor", torch=False):
    found = floor_record(snakemake.input.checkout, snakemake.input.pin, snakemake.params.semantics)
    records.validate_record(found, KIND, snakemake.output[0])
    write_json(snakemake.output[0], found)
