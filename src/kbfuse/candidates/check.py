"""`check_candidate`: judge one candidate file against one task, and write its verdict.

The parent (this process) never imports the candidate. It
  1. checks its arguments and settings (spec.check_settings), finds a bwrap that works here
     (kbfuse.candidates.bwrap; or none under `check.unsandboxed: true`, which the verdict
     records) and plans the cases: kbfuse.candidates.reference.build_cases on the settings
     and the pinned KernelBench's contract (its trials and their seeds, kbfuse.checks.official;
     changed weights; seeds x distributions);
  2. runs the `reference` child (the task's Model on every planned case) in scratch/reference;
     it and the candidate's child run in the numerics mode `check.numerics` names (None:
     PyTorch's defaults as the child finds them, as KernelBench's evaluator runs);
  3. runs the `candidate` child (kbfuse.candidates.runner) in scratch/candidate on the planned
     cases, in a sandbox where it sees nothing of the reference (it draws each case's inputs
     itself, with the reference's code), under the wall-time and memory limits (sandbox);
  4. on a GPU, runs the `witness` child on the flags the candidate reports it built with;
  5. once every process of a child is gone, reads what it left within bounds (readback),
     compares every planned case with the reference on the check's device (evidence; with
     a GPU lock, held shared for each case's comparison) and the digests of the inputs both
     drew, decides (verdict),
     validates
     the record against its schema and writes it, once and atomically, with the children's
     logs beside it. No child ever sees the verdict folder, the log folder or the scratch
     folders of the others.
With a GPU lock (kbfuse.workflow.gpulock), the reference and the witness share the device with
other jobs (the reference of a pinned task file for each case's device work only,
sandbox.Turns: it writes its cases holding nothing), and so does the candidate while it
builds, runs its cases and builds its baselines; for its guards and timing it has the device
alone (sandbox.Handoff: the wait is not counted against its time limit, and its processes are
stopped while the parent waits).
Before step 2 the check reserves the scratch disk its cases will take, in the first of the
scratch roots where they fit (diskbudget: TMPDIR, or the folders of $KBFUSE_SCRATCH; checks
beside each other wait for space rather than fill the disk, and one that cannot fit is refused
before any child runs); the verdict's `scratch` says how much and how long it waited.
The scratch folder is deleted afterwards unless `keep_scratch`. A problem of the harness (a
missing task file, no bwrap, a reference that fails) raises KbfuseError and writes nothing;
anything the candidate does ends in a verdict.
"""

from __future__ import annotations

import contextlib
import functools
import json
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from kbfuse.candidates import bwrap, diskbudget, evidence, readback, verdict
from kbfuse.candidates.reference import build_cases
from kbfuse.candidates.sandbox import Handoff, Limits, Turns, run_child
from kbfuse.candidates.spec import CANDIDATE_BYTES, check_settings
from kbfuse.candidates.witness import extension_name
from kbfuse.errors import KbfuseError
from kbfuse.io import sha256_file, write_json
from kbfuse.workflow import gpulock

ROLES = ("reference", "candidate", "witness")
PLAN_KEYS = ("seeds", "distributions")
# How long a check waits for its scratch disk (diskbudget), in its time limits: the checks
# holding it each end within three children's time limits.
DISK_WAIT_LIMITS = 4
# a verdict's name with ".candidate.log" or its atomic write's temporary name must fit the
# 255 bytes of a file name
MAX_STEM_BYTES = 200


def find_task_file(checkout: str | Path, level: int, task: int) -> Path:
    folder = Path(checkout) / "KernelBench" / f"level{level}"
    matches = sorted(folder.glob(f"{task}_*.py"))
    if len(matches) != 1:
        raise KbfuseError(
            f"task {level}/{task}: {len(matches)} files match {folder}/{task}_*.py (need one)"
        )
    return matches[0]


def checkout_commit(checkout: str | Path) -> str | None:
    try:
        done = subprocess.run(
            ["git", "-C", str(checkout), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def default_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def sandbox_of(settings: dict) -> tuple[str | None, dict]:
    """(the bwrap binary or None, the record's `sandbox` block); KbfuseError when no bwrap
    works here and the settings do not say `unsandboxed`."""
    if settings["unsandboxed"]:
        return None, {"used": "none", "version": None}
    binary, version = bwrap.require()
    return binary, {"used": "bwrap", "version": version}


def judged_contract(contract: dict, settings: dict) -> dict:
    """The pinned contract (kbfuse.checks.official.check_contract) with the check's seed and
    trial count where its settings name them (None: the pinned evaluator's own)."""
    from kbfuse.checks import official

    contract = official.check_contract(contract, "the check's kernelbench contract")
    for key, setting in (("seed", "seed"), ("trials", "official_trials")):
        if settings[setting] is not None:
            contract[key] = settings[setting]
    return contract


def plan(settings: dict, contract: dict) -> list[dict]:
    """The cases the parent will compare: the reference's own plan of these settings, judged
    by `contract` (judged_contract)."""
    return build_cases({**{key: settings[key] for key in PLAN_KEYS}, "contract": contract})


@dataclass
class Scratch:
    """The children's folders under `root`, how they are run, and what none of them sees."""

    root: Path
    binary: str | None  # bwrap, or None (unsandboxed)
    device: str
    limits: Limits
    hidden: tuple[Path, ...]

    def child(self, role, request, log, *, writable=(), env=None, handoff=None):
        folder = self.root / role
        folder.mkdir(exist_ok=True)
        path = folder / "request.json"
        path.write_text(json.dumps({**request, "out": str(folder / "out")}))
        view = bwrap.View(
            folder,
            writable=tuple(writable),
            hidden=self.hidden,
            gpu=self.device == "cuda",
        )
        return run_child(role, path, view, self.limits, log, self.binary, env, handoff)


def _holding(lock, how: str):
    """`lock.shared()` or `lock.alone()`; nothing without a lock."""
    return contextlib.nullcontext() if lock is None else getattr(lock, how)()


def witness_env(settings: dict, builds: list[dict]) -> tuple[dict[str, str] | None, list[Path]]:
    """The witness's extensions folder and the folders it may write there: a shared cache when
    check.witness_cache names one (the witness is kbfuse's own code, built by name from a hash
    of the flags: only the folders of these flag sets are writable in its sandbox), else
    its scratch."""
    cache = settings["witness_cache"]
    if cache is None:
        return None, []
    root = Path(cache).resolve()
    folders = [root / extension_name(b["flags"]) for b in builds if b["route"] == "load_inline"]
    for folder in folders:
        folder.mkdir(parents=True, exist_ok=True)
    return {"TORCH_EXTENSIONS_DIR": str(root)}, folders


def scratch_estimate(task_file: Path, settings: dict, contract: dict) -> int | None:
    """Bytes a check of the pinned `task_file` reserves (diskbudget.scratch_need over its
    planned cases; `settings` checked, `contract` judged); None when its sizes are unknown."""
    sizes = diskbudget.task_bytes(task_file)
    return None if sizes is None else diskbudget.scratch_need(sizes, len(plan(settings, contract)))


@functools.cache
def _pinned_task_bytes(task_file: str, mtime_ns: int):
    """diskbudget.task_bytes, once per version of a file: Snakemake evaluates a job's
    resources when it plans the DAG and again when the job is ready."""
    return diskbudget.task_bytes(task_file)


def scratch_mb(checkout, level: int, task: int, contract_file, settings, budget_mb=None) -> int:
    """The scratch disk, in MiB, a check job of pinned task `level/task` will reserve: its
    Snakemake resource `scratch_mb`, so that with `--resources scratch_mb=N` the scheduler
    starts checks whose cases fit beside the running ones, not one that would wait for disk in
    a job slot. 0 where it reserves nothing (unknown sizes); at most `budget_mb` (a check that
    could never fit is refused at once when it runs)."""
    from kbfuse.tasks.evaluator import read_contract_record

    settings = check_settings(settings)
    contract = judged_contract(read_contract_record(contract_file), settings)
    task_file = find_task_file(checkout, level, task)
    sizes = _pinned_task_bytes(str(task_file), task_file.stat().st_mtime_ns)
    need = None if sizes is None else diskbudget.scratch_need(sizes, len(plan(settings, contract)))
    mb = 0 if need is None else -(-need // (1 << 20))
    return mb if budget_mb is None else min(mb, budget_mb)


def witness_built(settings: dict, builds: list[dict]) -> bool:
    """Whether the shared witness cache already has every load_inline witness of `builds`
    (False without a cache: each check then builds in its own scratch)."""
    names = [extension_name(b["flags"]) for b in builds if b["route"] == "load_inline"]
    cache = settings["witness_cache"]
    if not names or cache is None:
        return not names
    root = Path(cache).resolve()
    return all((root / name / f"{name}.so").is_file() for name in names)


def _reference_cases(planned: list[dict], out: Path, folder: Path) -> list[dict]:
    """The planned cases with the reference's names of the parameters it changed; KbfuseError
    when the reference's cases are not the plan."""
    cases = readback.read_json(out / "cases.json", folder)
    readable = isinstance(cases, list) and all(isinstance(c, dict) for c in cases)
    names = [c.get("name") for c in cases] if readable else None
    if names != [c["name"] for c in planned]:
        raise KbfuseError(f"the reference process's cases {names} are not the plan")
    merged = []
    for mine, theirs in zip(planned, cases, strict=True):
        perturbed = theirs.get("perturbed")
        if mine.get("perturb") and not (
            isinstance(perturbed, list) and all(isinstance(n, str) for n in perturbed)
        ):
            raise KbfuseError(f"the reference process's {mine['name']} case names no parameters")
        merged.append({**mine, "perturbed": perturbed} if mine.get("perturb") else mine)
    return merged


def run_reference(
    task_file: Path, settings: dict, contract: dict, scratch: Scratch, planned, log, lock=None,
    pinned: bool = False,
):  # fmt: skip
    """The reference's run; with a GPU lock, held shared for each of its turns on the device
    (sandbox.Turns), not while it writes its cases, when `pinned` (the task file is the pinned
    KernelBench's: the child runs code that gives each turn back when its device work is
    done); for a task file of unknown origin, held shared for the whole run, as for the
    candidate: such code could say it was done and go on using the device while another job
    times."""
    folder = scratch.root / "reference"
    folder.mkdir()
    shutil.copyfile(task_file, folder / "task.py")
    turns = Turns(lock, folder) if lock is not None and pinned else None
    request = {
        "task_file": str(folder / "task.py"),
        "device": scratch.device,
        "contract": contract,
        "seeds": settings["seeds"],
        "distributions": settings["distributions"],
        "numerics": settings["numerics"],
        "turns": None if turns is None else turns.paths(),
    }
    with _holding(None if turns else lock, "shared"):  # without turns: for the whole run
        outcome = scratch.child("reference", request, log, handoff=turns)
    out = folder / "out"
    try:
        if outcome.status != "exited" or outcome.returncode != 0:
            raise KbfuseError(f"{outcome.status}, exit {outcome.returncode}")
        cases = _reference_cases(planned, out, folder)
        info = readback.read_json(out / "reference.json", folder)
    except KbfuseError as exc:
        error, _ = readback.read_json_or_none(out / "error.json", folder)
        error = error if isinstance(error, dict) else {}
        raise KbfuseError(
            f"the reference process for {task_file} failed ({exc}): {error.get('error')}: "
            f"{error.get('message')}; log: {log}"
        ) from None
    return cases, info if isinstance(info, dict) else {}, folder


def run_candidate(candidate, task_file, settings, contract, cases, scratch: Scratch, log, lock):
    """The candidate's run; with a GPU lock, held shared for it until it asks to be alone.
    It sees nothing of the reference: it draws each case's inputs itself (runner.draw)."""
    folder = scratch.root / "candidate"
    folder.mkdir()
    shutil.copyfile(candidate, folder / "candidate.py")
    shutil.copyfile(task_file, folder / "task.py")
    handoff = None if lock is None else Handoff(lock, folder)
    request = {
        "candidate": str(folder / "candidate.py"),
        "task_file": str(folder / "task.py"),
        "device": scratch.device,
        "contract": contract,
        "cases": cases,
        "gpu_memory_fraction": settings["gpu_memory_fraction"],
        "baselines": settings["baselines"],
        "timing": settings["timing"],
        "numerics": settings["numerics"],
        "handoff": None if handoff is None else handoff.paths(),
    }
    outcome = scratch.child("candidate", request, log, handoff=handoff)
    return outcome, folder


def run_witness(settings, runner: dict, scratch: Scratch, log, lock):
    """The witness's measurements and its outcome, (None, None) when there is nothing to
    measure (no GPU, no build reported)."""
    builds = evidence.witness_builds(runner)
    if scratch.device != "cuda" or not builds:
        return None, None
    env, writable = witness_env(settings, builds)
    if not witness_built(settings, builds):
        # kbfuse's own build launches nothing on the GPU: outside the lock, so that a flag
        # set's first build (about a minute) does not keep a timer waiting for it
        scratch.child(
            "witness", {"builds": builds, "build_only": True}, log, writable=writable, env=env
        )
    with _holding(lock, "shared"):
        outcome = scratch.child("witness", {"builds": builds}, log, writable=writable, env=env)
    folder = scratch.root / "witness"
    witness, _ = readback.read_json_or_none(folder / "out" / "witness.json", folder)
    valid = isinstance(witness, list) and all(
        isinstance(w, dict) and w.get("effective_ftz") in (True, False, None) for w in witness
    )
    return (witness if valid else None), outcome


def lock_waited(lock) -> float | None:
    """The seconds this process has waited for `lock` so far (gpulock.GpuLock.waited_s);
    None without a lock or for one that does not count."""
    waited = getattr(lock, "waited_s", None)
    return float(waited) if isinstance(waited, (int, float)) else None


def gather(
    candidate, task_file, settings, contract, scratch: Scratch, logs: dict, lock=None,
    pinned: bool = False,
):  # fmt: skip
    """Run the reference, candidate and witness children; compare every planned case.
    `pinned`: the task file is the pinned KernelBench's (run_reference)."""
    planned = plan(settings, contract)
    phases, started = {}, time.monotonic()
    waits, waited = {}, lock_waited(lock)

    def lap(phase: str) -> None:  # where a check's wall time goes (the verdict's phases_s)
        nonlocal started, waited
        phases[phase] = round(time.monotonic() - started, 3)
        started = time.monotonic()
        if waited is not None:  # and how much of it was the wait for the GPU lock
            now = lock_waited(lock)
            waits[phase], waited = round(now - waited, 3), now

    cases, info, reference = run_reference(
        task_file, settings, contract, scratch, planned, logs["reference"], lock, pinned
    )
    lap("reference")
    outcome, folder = run_candidate(
        candidate, task_file, settings, contract, cases, scratch, logs["candidate"], lock
    )
    lap("candidate")
    runner, report_problem = evidence.read_report(folder / "out" / "runner.json", folder)
    witness, witness_outcome = run_witness(settings, runner, scratch, logs["witness"], lock)
    lap("witness")
    finished = outcome.status == "exited" and outcome.returncode == 0
    expected = finished and report_problem is None and runner.get("failure") is None
    correctness = evidence.compare_all(
        cases,
        reference,
        folder,
        contract,
        settings["memory_limit_mb"] << 20,
        expected,
        runner.get("skipped_cases"),
        scratch.device,
        hold=functools.partial(_holding, lock, "shared"),  # on the device, beside others' builds
    )
    correctness["inputs_differ"] = evidence.inputs_differ(info, runner, correctness)
    lap("compare")
    return evidence.Evidence(
        info, cases, outcome, runner, report_problem, witness, witness_outcome, correctness,
        phases, waits,
    )  # fmt: skip


def check_candidate(
    candidate: str | Path,
    level: int,
    task: int,
    task_file: str | Path,
    out: str | Path,
    contract: dict,
    settings: dict | None = None,
    device: str | None = None,
    commit: str | None = None,
    survey: str | Path | None = None,
    keep_scratch: bool = False,
    log_dir: str | Path | None = None,
    lock=None,
    record_refusal: bool = False,
) -> dict:
    """Check one candidate (see the module docstring) under `contract` (the pinned
    kernelbench_contract record); the verdict record, also at `out`. `lock`: the device's GPU
    lock (kbfuse.workflow.gpulock), or None to take none. `record_refusal` (an audit): a
    check whose cases could never fit this machine's scratch disk writes a check_refused
    record (refusal_record) at `out` instead of raising diskbudget.ScratchTooSmall."""
    settings = check_settings(settings)
    contract = judged_contract(contract, settings)
    candidate, task_file, out = Path(candidate), Path(task_file), Path(out)
    for path, what in ((candidate, "candidate file"), (task_file, "task file")):
        if not path.is_file():
            raise KbfuseError(f"{what} {path} does not exist or is not a file")
        if path.stat().st_size > CANDIDATE_BYTES:
            raise KbfuseError(f"{what} {path} is over {CANDIDATE_BYTES} bytes")
    if len(out.stem.encode()) > MAX_STEM_BYTES:
        raise KbfuseError(
            f"verdict {str(out)[:300]!r}: its name is over {MAX_STEM_BYTES} bytes, too long for "
            "its log and temporary files"
        )
    binary, sandbox = sandbox_of(settings)
    device = device or default_device()
    logs_at = Path(log_dir) if log_dir is not None else out.parent
    logs = {role: logs_at / f"{out.stem}.{role}.log" for role in ROLES}
    for log in logs.values():
        log.unlink(missing_ok=True)
    # The scratch disk's estimate imports the task file here, as the survey imports the pinned
    # KernelBench files; a task file that is not the pin's (`--task-file`, an audit judged
    # against its corpus's own code: no commit) runs in the sandbox only, so it gets none.
    need = scratch_estimate(task_file, settings, contract) if commit is not None else None
    roots = diskbudget.scratch_roots()
    # none of these may be seen by a child, even where it lies in a folder a child can read
    # (a GPU lock file can be locked through a read-only view)
    locks = [gpulock.lock_dir()] + ([lock.path.parent] if hasattr(lock, "path") else [])
    limits = Limits(settings["time_limit_s"], settings["memory_limit_mb"])
    wait_s = DISK_WAIT_LIMITS * settings["time_limit_s"]
    refused = held = None
    try:
        with diskbudget.reserve(need, roots, gpulock.lock_dir(), wait_s, keep=keep_scratch) as held:
            hidden = tuple(p.resolve() for p in (held.folder, out.parent, logs_at, *locks))
            found = gather(
                candidate,
                task_file,
                settings,
                contract,
                Scratch(held.folder, binary, device, limits, hidden),
                logs,
                lock,
                pinned=commit is not None,
            )
    except diskbudget.ScratchTooSmall as exc:
        if not record_refusal:
            raise
        refused = exc
    finally:
        if keep_scratch and held is not None:
            print(f"scratch kept: {held.folder}")
    if refused is not None:
        record = refusal_record(candidate, level, task, task_file, commit, settings, refused)
        write_json(out, record)
        return record
    task_record = {
        "level": level,
        "task": task,
        "file": task_file.name,
        "sha256": sha256_file(task_file),
        "commit": commit,
    }
    record = evidence.assemble(
        candidate, task_record, device, settings, survey, found, sandbox, contract
    )
    record["scratch"] = held.info
    record["phases_s"] = {"scratch_wait": held.info["waited_s"], **found.phases_s}
    if found.lock_wait_s:
        record["lock_wait_s"] = found.lock_wait_s
    verdict.validate(record, f"verdict of {candidate}")
    write_json(out, record)
    return record


def refusal_record(
    candidate: Path, level: int, task: int, task_file: Path, commit, settings: dict,
    refused: diskbudget.ScratchTooSmall,
) -> dict:  # fmt: skip
    """The check_refused record of a check that did not start (check_refused.json)."""
    record = {
        "kind": "check_refused",
        "schema_version": 1,
        "candidate": {"file": candidate.name, "sha256": sha256_file(candidate)},
        "task": {"level": level, "task": task, "file": task_file.name, "commit": commit},
        "numerics": settings.get("numerics"),
        "verdict": "not checked",
        "why": f"needs {refused.need / 1e9:.1f} GB of scratch disk, "
        f"{max(refused.free, 0) / 1e9:.1f} GB free here",
        "scratch": {"need_bytes": refused.need, "free_bytes": refused.free},
    }
    verdict.validate_refusal(record, f"refusal record of {candidate}")
    return record
