"""kbfuse.workflow.slurm: the line the Snakefile's `onerror` prints for a Slurm job that Slurm
ended, read from Snakemake's log and the job's Slurm log (the texts below are cut from runs on
the test cluster of tests/test_slurm.py, which checks the same lines end to end)."""

from __future__ import annotations

import io

import pytest

from kbfuse.workflow import slurm

SUBMITTED = """\
[Wed Dec  2 08:59:50 2026]
rule compile_variant:
    input: kernels/naive.cu, kernels/eager_ops.cuh
    output: results/compile/nvrtc-cubin-noftz/tails.bin, results/compile/nvrtc-cubin-noftz/meta.json
    log: results/logs/compile/nvrtc-cubin-noftz.log
    jobid: 6
    wildcards: variant=nvrtc-cubin-noftz
    resources: tmpdir=<TBD>, mem_mb=100, mem=100 MB, mem_mib=96, runtime=1, cpus_per_task=1, gpu=0
Shell command: None
Job 6 has been submitted with SLURM jobid 12 (log: {slurm_log}).
"""
FAILED = """\
[Wed Dec  2 08:59:52 2026]
Error in rule compile_variant:
    message: SLURM-job '12' failed, SLURM status is: '{status}'. Reason: Unknown.For further \
error details see the cluster/cloud log and the log files of the involved rule(s).
    jobid: 6
    input: kernels/naive.cu, kernels/eager_ops.cuh
    output: results/compile/nvrtc-cubin-noftz/tails.bin, results/compile/nvrtc-cubin-noftz/meta.json
    log: results/logs/compile/nvrtc-cubin-noftz.log, {slurm_log} (check log file(s) for error \
details)
    external_jobid: 12
Logfile results/logs/compile/nvrtc-cubin-noftz.log: empty file
"""
OVER_MEMORY = """\
slurmstepd-kbfuse: error: StepId=12.batch exceeded memory limit (149250048 > 104857600), being \
killed
slurmstepd-kbfuse: error: *** JOB 12 ON kbfuse CANCELLED AT 2026-12-02T08:59:42 ***
slurmstepd-kbfuse: error: Exceeded job memory limit
"""
OOM_KILL = "slurmstepd: error: Detected 1 oom_kill event in StepId=12.batch. Some of the step \
tasks have been OOM Killed.\n"
TIME_LIMIT = "slurmstepd-kbfuse: error: *** JOB 12 ON kbfuse CANCELLED AT 2026-12-02T09:02:07 \
DUE TO TIME LIMIT ***\n"
CANCELLED = "slurmstepd-kbfuse: error: *** JOB 12 ON kbfuse CANCELLED AT 2026-12-02T09:01:20 ***\n"
OWN_ERROR = "kbfuse: compile failed: nvrtc: error: identifier 'x' is undefined\n"
WHERE = "kbfuse: rule compile_variant (nvrtc-cubin-noftz), Slurm job 12: "
RAISE = "Raise {} for compile_variant under set-resources in profiles/slurm."


def explained(tmp_path, status: str, slurm_log_text: str | None) -> list[str]:
    slurm_log = tmp_path / ".snakemake/slurm_logs/rule_compile_variant/nvrtc-cubin-noftz/12.log"
    if slurm_log_text is not None:
        slurm_log.parent.mkdir(parents=True)
        slurm_log.write_text(slurm_log_text)
    log = tmp_path / "snakemake.log"
    log.write_text((SUBMITTED + FAILED).format(slurm_log=slurm_log, status=status))
    out = io.StringIO()
    lines = slurm.explain_failures([log], out=out)
    assert out.getvalue() == "".join(line + "\n" for line in lines)
    return lines


@pytest.mark.parametrize(
    ("status", "slurm_log_text", "line"),
    [
        ("FAILED", OVER_MEMORY, "killed for exceeding its memory, 142.34 MB used of mem_mb=100. "
                                + RAISE.format("mem_mb")),
        ("OUT_OF_MEMORY", OOM_KILL, "killed for exceeding its memory, mem_mb=100. "
                                    + RAISE.format("mem_mb")),
        ("TIMEOUT", TIME_LIMIT, "cancelled at its time limit, runtime=1 min. "
                                + RAISE.format("runtime")),
        ("TIMEOUT", None, "cancelled at its time limit, runtime=1 min. " + RAISE.format("runtime")),
        ("CANCELLED", CANCELLED, "cancelled (scancel, or the site). Run the same command again: "
                                 "the jobs that finished are kept, the cancelled one runs again."),
    ],
)  # fmt: skip
def test_a_job_slurm_ended_gets_a_line_naming_the_rule_and_what_to_raise(
    tmp_path, status, slurm_log_text, line
):
    assert explained(tmp_path, status, slurm_log_text) == [WHERE + line]


def test_a_job_that_failed_on_its_own_is_left_to_snakemakes_message(tmp_path):
    assert explained(tmp_path, "FAILED", OWN_ERROR) == []


def test_a_local_run_has_no_slurm_job_to_explain(tmp_path):
    log = tmp_path / "snakemake.log"
    log.write_text("Error in rule compile_variant:\n    jobid: 6\n    output: a, b\n")
    assert slurm.explain_failures(str(log), out=io.StringIO()) == []
    assert slurm.explain_failures([tmp_path / "missing.log"], out=io.StringIO()) == []


def test_the_failed_jobs_are_read_with_their_resources_and_slurm_log(tmp_path):
    text = (SUBMITTED + FAILED).format(slurm_log="/wf/.snakemake/slurm_logs/rule_r/w/12.log",
                                       status="TIMEOUT")  # fmt: skip
    (job,) = slurm.failed_jobs(text)
    assert (job.rule, job.slurm_id, job.status, job.wildcards) == ("compile_variant", "12",
                                                                   "TIMEOUT", "w")  # fmt: skip
    assert str(job.slurm_log) == "/wf/.snakemake/slurm_logs/rule_r/w/12.log"
    assert (job.resources["mem_mb"], job.resources["runtime"]) == ("100", "1")
