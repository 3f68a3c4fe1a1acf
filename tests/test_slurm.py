"""The cluster path against a real Slurm: profiles/slurm and Snakemake's Slurm executor plugin
submitting to slurmctld and slurmd on this machine (tools/slurm-local.sh, started once for
this module, which pytest-xdist gives to one worker whole: tests/slurmcluster.py).

The profile is set up as a site sets it up (docs/running.md): an account and a partition under
`default-resources`, a GPU model on every GPU rule. The node offers two GPUs of that model that
are not there: the survey runs on the CPU (`survey.device: cpu`), its jobs still ask for and get
a GPU each, as on a GPU cluster. Every run the tests read starts in the background before the
first test (`started`): they mostly wait for the plugin's polls.

- A job cancelled with `scancel` while it runs: Snakemake reports it, and a rerun redoes that
  job and nothing else.
- A job over its memory, and one past its runtime: the run fails with a line naming the rule and
  the resource to raise (kbfuse.workflow.slurm, from the Snakefile's `onerror`).
- The CPU part of the study (`cpu`, two variants) and the survey of a KernelBench-shaped
  fixture: every job but the `localrules` is a Slurm job the accounting knows, under the run's
  name, with the rule and wildcards as its comment; the `localrules` are run by Snakemake itself
  and are not in Slurm's records; the results are those of a local run (the study's byte for
  byte, the survey's but for the times it measured); the scheduler saw the requests
  (`scontrol show job`) that profiles/slurm and the rules declare.
- A second cluster beside the first: each has its own daemons, and stopping one stops all of
  its own and none of the other's.

Where Slurm, munge or MariaDB is not installed, or not as root, every test here skips with the
reason (tests/conftest.py); CI installs them (.ci/run).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import snakefork
import yaml
from conftest import ROOT, copy_workflow, snakemake, write_test_config
from slurmcluster import ACCOUNT, GPU_MODEL, PARTITION, Cluster, Submitted, run_id, submitted
from survey_kbrepo import make_survey_repo

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

VARIANTS = ("nvrtc-cubin-noftz", "fast-nvrtc-cubin-noftz")
# The test cluster answers at once: no need for the plugin's first 40 s of waiting.
FAST_POLLS = ("--slurm-init-seconds-before-status-checks", "1")
STUDY_LOCAL = {"kernelbench_checkout", "kernelbench_task", "kernelbench_pin",
               "kernelbench_contract", "direction_witness", "cpu"}  # fmt: skip
SURVEY_LOCAL = {"kernelbench_checkout", "kernelbench_contract", "survey_task_list",
                "survey_devices", "survey_pin", "survey_records"}  # fmt: skip
SURVEY = {
    "device": "cpu",
    "tasks": [1, 53],
    "numerics": ["strict"],
    "rounds": 2,
    "warmup": 1,
    "invocations_per_pair": 1,
    "profile": False,
    "baselines": ["eager", "torchscript"],
}
# Snakemake's block for each job it starts: "rule NAME:" (a cluster job), "localrule NAME:" or
# "localcheckpoint NAME:" (run by Snakemake itself), with its wildcards where it has any.
_JOB = re.compile(r"^(local)?(?:rule|checkpoint) (\w+):\n((?:    .*\n)+)", re.M)


@dataclass
class Run:
    workdir: Path
    output: str

    @property
    def submitted(self) -> list[Submitted]:
        return submitted(self.output)

    def jobs(self, local: bool) -> list[tuple[str, str]]:
        """(rule, wildcard values joined by "_") of each job the run started, local or not."""
        found = []
        for is_local, rule, body in _JOB.findall(self.output):
            if bool(is_local) == local:
                m = re.search(r"^    wildcards: (.*)$", body, re.M)
                pairs = m.group(1).split(", ") if m else []
                found.append((rule, "_".join(pair.split("=", 1)[1] for pair in pairs)))
        return found


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    started = Cluster.start(tmp_path_factory.mktemp("slurm") / "cluster")
    yield started
    started.stop()


def site_profile(workdir: Path, **rules: dict) -> dict:
    """profiles/slurm of `workdir` as a site sets it up (docs/running.md): account and partition
    under default-resources, the GPU model on every rule that asks for a GPU; `rules` changes
    more per rule. The profile written, as a dict."""
    path = workdir / "profiles/slurm/config.yaml"
    profile = yaml.safe_load(path.read_text())
    profile["default-resources"] += [f"slurm_account={ACCOUNT}", f"slurm_partition={PARTITION}"]
    for resources in profile["set-resources"].values():
        if resources.get("gpu"):
            resources["gpu_model"] = GPU_MODEL
    for rule, changes in rules.items():
        profile["set-resources"].setdefault(rule, {}).update(changes)
    path.write_text(yaml.safe_dump(profile, sort_keys=False))
    return profile


def on_slurm(cluster: Cluster, workdir: Path, *args: str, check: bool = True) -> Run:
    try:
        proc = snakemake(workdir, "--workflow-profile", "profiles/slurm", *FAST_POLLS, *args,
                         env=cluster.env, check=check)  # fmt: skip
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(stuck(cluster, exc)) from exc
    return Run(workdir, proc.stdout + proc.stderr)


def stuck(cluster: Cluster, exc: subprocess.TimeoutExpired) -> str:
    """What a run that never ended leaves to diagnose: the queue and the node as Slurm sees
    them, and the end of the run's own output (one CI run's rerun hung for its 600 s once)."""
    output = "".join(part or "" for part in (exc.stdout, exc.stderr))
    views = []
    queue = ("squeue", "-a", "-o", "%i %j %T %r %M %l")
    for command in (queue, ("sinfo", "-N", "-o", "%N %T %C %m %e")):
        try:
            views.append(f"--- {' '.join(command)}:\n{cluster.command(*command)}")
        except (AssertionError, subprocess.TimeoutExpired) as error:
            views.append(f"--- {command[0]} failed: {error}")
    return "\n".join([f"snakemake on Slurm did not end in {exc.timeout} s", *views,
                      "--- the run's output, last 6000 characters:", output[-6000:]])  # fmt: skip


def study_copy(folder: Path, kb_repo, variants=VARIANTS) -> tuple[Path, Path]:
    workdir = copy_workflow(folder, list(variants))
    return workdir, write_test_config(workdir, *kb_repo, nvrtc_versions=[])


def survey_copy(folder: Path, repo: tuple[str, str]) -> tuple[Path, Path]:
    workdir = copy_workflow(folder)
    overlay = workdir / "survey.yaml"
    url, commit = repo
    overlay.write_text(yaml.safe_dump({"kernelbench": {"url": url, "commit": commit},
                                       "arch": "sm_90", "survey": SURVEY}))  # fmt: skip
    return workdir, overlay


# ------------------------------------------------------------------ the runs the tests read


@dataclass
class Started:
    """A run on the cluster started in the background."""

    workdir: Path
    overlay: Path
    proc: object  # tests/snakefork.py's Started, or a subprocess.Popen
    output: Path

    def finish(self, timeout: float = 300) -> Run:
        """The run, once it has ended (killed, and the test failed, after `timeout` s)."""
        deadline = time.monotonic() + timeout
        while self.proc.poll() is None:
            if time.monotonic() > deadline:
                self.kill()
                raise AssertionError(f"the run did not end in {timeout} s:\n{self.text()}")
            time.sleep(0.5)
        return Run(self.workdir, self.text())

    def text(self) -> str:
        return self.output.read_text()

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


def start(cluster: Cluster, copy: tuple[Path, Path], target: str, pause: str = "") -> Started:
    """`target` on the cluster, in the background, from the workflow copy (workdir, config
    overlay); with `pause`, the job that reaches that kbfuse pause point (kbfuse.faults) waits
    there, having written workdir/../paused."""
    workdir, overlay = copy
    env = {**cluster.env, "PYTHONPATH": str(workdir / "src")}
    if pause:
        env |= {"KBFUSE_PAUSE_AT": pause, "KBFUSE_PAUSE_MARKER": str(workdir.parent / "paused")}
    args = ["--workflow-profile", "profiles/slurm", *FAST_POLLS, target]
    output = workdir.parent / "run.out"
    proc = snakefork.start([*args, "--configfile", str(overlay)], workdir, env, output,
                           new_session=True)  # fmt: skip
    return Started(workdir, overlay, proc, output)


@pytest.fixture(scope="module", autouse=True)
def started(cluster, kb_repo, survey_repo, tmp_path_factory) -> dict[str, Started]:
    """Every run the module reads, started at once before its first test: they wait for
    Slurm's polls far more than they compute, and the job past its runtime takes 60-90 s
    before Slurm ends it.

    - study, survey: the `cpu` target and the survey on the cluster;
    - cancel: `cpu`, the compile of the second variant paused (for scancel);
    - memory: `cpu` of one variant whose compile asks for mem_mb=100;
    - runtime: `cpu` of one variant whose compile asks for runtime=1 and pauses."""

    def copy(name: str, make, *args, **rules) -> tuple[Path, Path]:
        workdir, overlay = make(tmp_path_factory.mktemp(name) / "wf", *args)
        site_profile(workdir, **rules)
        return workdir, overlay

    runs = {
        "runtime": start(cluster, copy("runtime", study_copy, kb_repo, VARIANTS[:1],
                                       compile_variant={"runtime": 1}),
                         "cpu", pause=f"compile:{VARIANTS[0]}"),
        "study": start(cluster, copy("study", study_copy, kb_repo), "cpu"),
        "survey": start(cluster, copy("survey", survey_copy, survey_repo), "survey_records"),
        "cancel": start(cluster, copy("cancel", study_copy, kb_repo), "cpu",
                        pause=f"compile:{VARIANTS[1]}"),
        "memory": start(cluster, copy("memory", study_copy, kb_repo, VARIANTS[:1],
                                      compile_variant={"mem_mb": 100}), "cpu"),
    }  # fmt: skip
    yield runs
    for run in runs.values():
        run.kill()


@pytest.fixture(scope="module")
def survey_repo(tmp_path_factory) -> tuple[str, str]:
    return make_survey_repo(tmp_path_factory.mktemp("survey-kb"))


def finished(run: Started) -> Run:
    done = run.finish()
    assert run.proc.returncode == 0, done.output
    return done


@pytest.fixture(scope="module")
def study(started) -> Run:
    return finished(started["study"])


@pytest.fixture(scope="module")
def survey(started) -> Run:
    return finished(started["survey"])


def local_run(workdir: Path, overlay: Path, target: str) -> Path:
    snakemake(workdir, "--cores", "2", target, "--configfile", str(overlay))
    return workdir


# ------------------------------------------------------------------------ failure modes
# (first: the paused job is cancelled while the run still polls Slurm often)


def test_a_cancelled_job_is_reported_and_a_rerun_redoes_it_alone(started, cluster):
    run = started["cancel"]
    cancelled, kept = VARIANTS[1], VARIANTS[0]
    paused = run.workdir.parent / "paused"
    kept_meta = run.workdir / f"results/compile/{kept}/meta.json"
    deadline = time.monotonic() + 240
    while not (paused.exists() and kept_meta.exists()):
        assert run.proc.poll() is None, f"the run ended before its job paused:\n{run.text()}"
        assert time.monotonic() < deadline, f"no paused job after 240 s:\n{run.text()}"
        time.sleep(0.2)
    job = next(j for j in submitted(run.text()) if j.wildcards == cancelled)
    cluster.command("scancel", job.slurm_id)
    out = run.finish().output
    assert run.proc.returncode == 1
    assert f"SLURM-job '{job.slurm_id}' failed, SLURM status is: 'CANCELLED'" in out
    assert (f"kbfuse: rule compile_variant ({cancelled}), Slurm job {job.slurm_id}: cancelled"
            " (scancel, or the site). Run the same command again") in out  # fmt: skip
    results = run.workdir / "results"
    kept_times = {p: p.stat().st_mtime_ns for p in results.rglob("*.json")}
    assert not (results / f"compile/{cancelled}/meta.json").exists()

    rerun = on_slurm(cluster, run.workdir, "cpu", "--configfile", str(run.overlay))
    assert rerun.jobs(local=False) == [("compile_variant", cancelled)]
    assert rerun.jobs(local=True) == [("cpu", "")]  # the target, which has no output
    assert [(j.rule, j.wildcards) for j in rerun.submitted] == [("compile_variant", cancelled)]
    assert {p: p.stat().st_mtime_ns for p in kept_times} == kept_times
    assert json.loads((results / f"compile/{cancelled}/meta.json").read_text())["variant"] \
        == cancelled  # fmt: skip


def test_a_job_over_its_memory_fails_naming_the_rule_and_mem_mb(started, cluster):
    run = started["memory"].finish()
    assert started["memory"].proc.returncode == 1
    (job,) = run.submitted
    assert f"Error in rule compile_variant:\n    message: SLURM-job '{job.slurm_id}' failed" \
        in run.output  # fmt: skip
    line = re.search(
        rf"^kbfuse: rule compile_variant \({VARIANTS[0]}\), Slurm job {job.slurm_id}: killed for "
        r"exceeding its memory, ([\d.]+) MB used of mem_mb=100\. Raise mem_mb for compile_variant "
        r"under set-resources in profiles/slurm\.$", run.output, re.M)  # fmt: skip
    assert line, run.output
    assert float(line.group(1)) > 100
    assert cluster.sacct(run_id(run.output))[job.slurm_id]["State"] == "FAILED"


# ------------------------------------------------------------------------------ the study


@pytest.mark.parametrize("name", ["study", "survey"])
def test_every_job_but_the_local_rules_is_a_slurm_job_in_the_accounting(name, request, cluster):
    run = request.getfixturevalue(name)
    jobs = run.submitted
    assert sorted((job.rule, job.wildcards) for job in jobs) == sorted(run.jobs(local=False))
    assert {job.rule for job in jobs} == {"study": {"compile_variant"},
                                          "survey": {"survey_task"}}[name]  # fmt: skip
    assert len(jobs) == 2
    records = cluster.sacct(run_id(run.output))
    assert sorted(records) == sorted(job.slurm_id for job in jobs)
    for job in jobs:
        record = records[job.slurm_id]
        assert record["State"] == "COMPLETED"
        assert record["Comment"] == f"rule_{job.rule}_wildcards_{job.wildcards}"
        assert (record["Account"], record["Partition"]) == (ACCOUNT, PARTITION)


@pytest.mark.parametrize(("name", "local"), [("study", STUDY_LOCAL), ("survey", SURVEY_LOCAL)])
def test_the_local_rules_ran_in_snakemake_itself_and_never_reached_slurm(name, local, request,
                                                                         cluster):  # fmt: skip
    run = request.getfixturevalue(name)
    assert {rule for rule, _ in run.jobs(local=True)} == local
    slurm_rules = {rec["Comment"].split("_wildcards_")[0].removeprefix("rule_")
                   for rec in cluster.sacct(run_id(run.output)).values()}  # fmt: skip
    assert slurm_rules and slurm_rules.isdisjoint(local)


def result_files(workdir: Path) -> dict[str, bytes]:
    """Every result file but logs, benchmarks (times) and the git checkout (its index holds
    file times), by path."""
    results = workdir / "results"
    files = (p.relative_to(results) for p in sorted(results.rglob("*")) if p.is_file())
    kept = (p for p in files if {"logs", "benchmarks"}.isdisjoint(p.parts))
    return {str(p): (results / p).read_bytes() for p in kept
            if p.parts[:2] != ("kernelbench", "checkout")}  # fmt: skip


def test_the_study_on_slurm_gives_the_local_runs_results_byte_for_byte(study, kb_repo, tmp_path):
    local = local_run(*study_copy(tmp_path / "wf", kb_repo), "cpu")
    on_slurm, here = result_files(study.workdir), result_files(local)
    assert sorted(on_slurm) == sorted(here)
    assert {f"compile/{v}/{f}" for v in VARIANTS for f in ("tails.bin", "meta.json")} <= set(here)
    assert [name for name in here if on_slurm[name] != here[name]] == []


def without_times(node):
    """A record without what it measured: the keys named in seconds or milliseconds and the
    ratios of times."""
    if isinstance(node, dict):
        return {k: without_times(v) for k, v in node.items()
                if not re.search(r"_(s|ms)$", k) and k != "ratios"}  # fmt: skip
    if isinstance(node, list):
        return [without_times(v) for v in node]
    return node


def test_the_survey_on_slurm_gives_the_local_runs_records_but_for_the_times(survey, survey_repo,
                                                                            tmp_path):  # fmt: skip
    local = local_run(*survey_copy(tmp_path / "wf", survey_repo), "survey_records")
    on_slurm, here = result_files(survey.workdir), result_files(local)
    records = sorted(name for name in here if "/tasks/" in name)
    assert records == ["survey/strict/tasks/1.json", "survey/strict/tasks/53.json"]
    assert sorted(on_slurm) == sorted(here)
    for name in here:
        a, b = json.loads(on_slurm[name]), json.loads(here[name])
        assert without_times(a) == without_times(b), name
    record = json.loads(on_slurm[records[1]])
    assert record["baselines"]["torchscript"]["status"] == "ok"
    assert record["baselines"]["eager"]["timing"]["wall"]["median_ms"] > 0


def minutes(runtime: int) -> str:
    return f"{runtime // 60:02d}:{runtime % 60:02d}:00"


@pytest.mark.parametrize(
    ("name", "rule"), [("study", "compile_variant"), ("survey", "survey_task")]
)
def test_the_scheduler_got_what_the_profile_and_the_rules_ask(name, rule, request, cluster):
    """`scontrol show job` against profiles/slurm (the repository's, plus the site's lines):
    a compile asks for no GPU (the rule's `gpu` is 0 for an NVRTC route), a survey job for one
    of the site's model."""
    profile = yaml.safe_load((ROOT / "profiles/slurm/config.yaml").read_text())
    default = dict(item.split("=") for item in profile["default-resources"])
    asked = {**{k: int(v) for k, v in default.items()}, **profile["set-resources"][rule]}
    for job in request.getfixturevalue(name).submitted:
        shown = cluster.show_job(job.slurm_id)
        assert shown["TimeLimit"] == minutes(asked["runtime"])
        assert shown["MinMemoryNode"] == f"{asked['mem_mb']}M"
        assert shown["CPUs/Task"] == str(asked["cpus_per_task"])
        gpus = f"gres:gpu:{GPU_MODEL}:{asked['gpu']}" if asked.get("gpu") else None
        assert shown.get("TresPerJob") == gpus
        assert (shown["Account"], shown["Partition"]) == (ACCOUNT, PARTITION)
        assert shown["Comment"] == f"rule_{rule}_wildcards_{job.wildcards}"


# ------------------------------------------------------------------------ the cluster itself


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_second_cluster_runs_beside_the_first_and_stops_only_its_own_daemons(cluster, tmp_path):
    other = Cluster.start(tmp_path / "other")
    pids = other.pids()
    try:
        assert set(pids) == {"munged", "mariadb", "slurmdbd", "slurmctld", "slurmd"}
        assert set(pids.values()).isdisjoint(cluster.pids().values())
        assert other.env["SLURM_CONF"] != cluster.env["SLURM_CONF"]
        assert other.command("sinfo", "-h", "-o", "%t").split() == ["idle"]
    finally:
        other.stop()
    assert [name for name, pid in pids.items() if alive(pid)] == []
    assert all(alive(pid) for pid in cluster.pids().values())
    assert cluster.command("sinfo", "-h", "-o", "%P %a").split() == [f"{PARTITION}*", "up"]


# ------------------------------------------------------------------------ last


def test_a_job_past_its_runtime_fails_naming_the_rule_and_runtime(started, cluster):
    """Last: Slurm ends the job 60-90 s after it starts, and the plugin, which polls less often
    the longer nothing ends, notices it up to a minute later."""
    run = started["runtime"].finish()
    assert started["runtime"].proc.returncode == 1
    (job,) = run.submitted
    assert f"SLURM-job '{job.slurm_id}' failed, SLURM status is: 'TIMEOUT'" in run.output
    assert (f"kbfuse: rule compile_variant ({VARIANTS[0]}), Slurm job {job.slurm_id}: cancelled at"
            " its time limit, runtime=1 min. Raise runtime for compile_variant under"
            " set-resources in profiles/slurm.") in run.output  # fmt: skip
    assert cluster.sacct(run_id(run.output))[job.slurm_id]["State"] == "TIMEOUT"
