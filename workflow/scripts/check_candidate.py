from pathlib import Path

from kbfuse import layout
from kbfuse.candidates.check import (
    check_candidate,
    checkout_commit,
    default_device,
    find_task_file,
)
from kbfuse.tasks.evaluator import read_contract_record
from kbfuse.workflow import devices, gpulock
from kbfuse.workflow.jobs import job

SURVEY_MODES = ("kernelbench-defaults", "strict")

# On a machine with several GPUs the check is placed on one of them before CUDA starts here
# (kbfuse.workflow.devices); its children see that one device.
with job(snakemake.log[0], "check_candidate"), devices.placed("shared"):
    level, task = snakemake.params.task
    checkout = snakemake.input.checkout
    verdict = Path(snakemake.output.verdict)
    # An audit judging against its corpus's own task code gives that file: no pinned commit,
    # and the survey's record (of the pinned task) says nothing about it.
    own_task = hasattr(snakemake.input, "task")
    if own_task:
        task_file, commit = Path(snakemake.input.task), None
    else:
        task_file, commit = find_task_file(checkout, level, task), checkout_commit(checkout)
    # The survey's record of the task, when the survey ran (KernelBench's numerics first: the
    # reference here runs with torch's defaults, as KernelBench's evaluator does).
    surveys = [
        layout.file("survey_record", numerics=mode, survey_task=task)
        for mode in SURVEY_MODES
        if not own_task
    ]
    survey = next((path for path in surveys if Path(path).is_file()), None)
    device = default_device()
    # Builds and references share the device with other jobs; the candidate's timed run has
    # it alone (kbfuse.candidates.check).
    record = check_candidate(
        snakemake.input.candidate,
        level,
        task,
        task_file,
        verdict,
        read_contract_record(snakemake.input.contract),
        dict(snakemake.params.settings),
        device=device,
        commit=commit,
        survey=survey,
        log_dir=Path(snakemake.log[0]).parent,
        lock=gpulock.for_device(device),
        # an audit records an entry this machine's scratch disk cannot hold, and goes on
        record_refusal=getattr(snakemake.params, "record_refusal", False),
    )
    print(f"{verdict}: {record['verdict']} {' '.join(record.get('failed_checks', []))}")
