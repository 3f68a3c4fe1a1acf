"""`check_candidate`: judge one candidate file against one task, and write its verdict.

The parent (this process) never imports the candidate. It
  1. checks its arguments and settings (spec.check_settings) and reads the task file;
  2. runs the `reference` child (the task's Model on every case) in scratch/reference;
  3. runs the `candidate` child (kbfuse.candidates.runner) in scratch/candidate, with the
     inputs the reference wrote, under the wall-time and memory limits (sandbox);
  4. on a GPU, runs the `witness` child on the flags the candidate built with;
  5. reads every tensor back with `weights_only=True`, compares (compare), decides (verdict),
     validates the record against its schema and writes it (atomically), with the three
     children's logs beside it.
With a GPU lock (kbfuse.workflow.gpulock), the reference and the witness share the device with
other jobs, and so does the candidate while it builds, runs its cases and builds its
baselines; for its guards and timing it has the device alone (sandbox.Handoff: the wait is
not counted against its time limit, and its processes are stopped while the parent waits).
The scratch folder is deleted afterwards unless `keep_scratch`. A problem of the harness (a
missing task file, a reference that fails) raises KbfuseError and writes nothing; anything
the candidate does ends in a verdict.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kbfuse.candidates import compare, flags, verdict
from kbfuse.candidates.childio import load_tensors
from kbfuse.candidates.sandbox import Handoff, Limits, Outcome, run_child
from kbfuse.candidates.spec import check_settings
from kbfuse.errors import KbfuseError
from kbfuse.io import sha256_file, write_json

ROLES = ("reference", "candidate", "witness")


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


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _child(
    role: str, request: dict, folder: Path, limits: Limits, log: Path, env=None, handoff=None
):
    request_path = folder.parent / f"{role}-request.json"
    request_path.write_text(json.dumps({**request, "out": str(folder / "out")}))
    return run_child(role, request_path, folder, limits, log, env, handoff)


def _holding(lock, how: str):
    """`lock.shared()` or `lock.alone()`; nothing without a lock."""
    return contextlib.nullcontext() if lock is None else getattr(lock, how)()


def witness_env(settings: dict) -> dict[str, str] | None:
    """The witness's extensions folder: a shared cache when check.witness_cache names one (the
    witness is kbfuse's own code, built by name from a hash of the flags), else its scratch."""
    cache = settings["witness_cache"]
    if cache is None:
        return None
    Path(cache).mkdir(parents=True, exist_ok=True)
    return {"TORCH_EXTENSIONS_DIR": str(Path(cache).resolve())}


def judged_contract(contract: dict, settings: dict) -> dict:
    """The pinned contract (kbfuse.checks.official.check_contract) with the check's seed and
    trial count where its settings name them (None: the pinned evaluator's own)."""
    from kbfuse.checks import official

    contract = official.check_contract(contract, "the check's kernelbench contract")
    for key, setting in (("seed", "seed"), ("trials", "official_trials")):
        if settings[setting] is not None:
            contract[key] = settings[setting]
    return contract


def run_reference(
    task_file: Path, settings: dict, contract: dict, device: str, scratch: Path, limits, log
):
    folder = scratch / "reference"
    folder.mkdir()
    copy = folder / "task.py"
    shutil.copyfile(task_file, copy)
    request = {
        "task_file": str(copy),
        "device": device,
        "contract": contract,
        "seeds": settings["seeds"],
        "distributions": settings["distributions"],
    }
    outcome = _child("reference", request, folder, limits, log)
    out = folder / "out"
    cases, info = _read_json(out / "cases.json"), _read_json(out / "reference.json")
    if outcome.status != "exited" or outcome.returncode != 0 or cases is None or info is None:
        error = _read_json(out / "error.json") or {}
        raise KbfuseError(
            f"the reference process for {task_file} failed ({outcome.status}, exit "
            f"{outcome.returncode}): {error.get('error')}: {error.get('message')}; log: {log}"
        )
    return cases, info, out


def run_candidate(
    candidate,
    task_file,
    settings,
    contract,
    device,
    cases,
    ref_out,
    scratch,
    limits,
    log,
    lock=None,
):
    """The candidate's run; with a GPU lock, held shared for it until it asks to be alone."""
    folder = scratch / "candidate"
    folder.mkdir()
    shutil.copyfile(candidate, folder / "candidate.py")
    shutil.copyfile(task_file, folder / "task.py")
    handoff = None if lock is None else Handoff(lock, folder)
    request = {
        "candidate": str(folder / "candidate.py"),
        "task_file": str(folder / "task.py"),
        "device": device,
        "contract": contract,
        "cases": cases,
        "inputs_dir": str(ref_out / "inputs"),
        "gpu_memory_fraction": settings["gpu_memory_fraction"],
        "baselines": settings["baselines"],
        "timing": settings["timing"],
        "handoff": None if handoff is None else handoff.paths(),
    }
    outcome = _child("candidate", request, folder, limits, log, handoff=handoff)
    return outcome, folder / "out"


def witness_builds(runner: dict) -> list[dict]:
    """Distinct flag sets to measure: torch builds by their extra_cuda_cflags, CuPy by
    options (whatever the candidate compiled; each set once)."""
    seen, builds = set(), []
    for build in runner.get("builds") or []:
        if build["route"].startswith("cupy"):
            item = {"route": "cupy", "options": build.get("options", [])}
        else:
            item = {"route": "load_inline", "flags": build.get("extra_cuda_cflags", [])}
        key = json.dumps(item, sort_keys=True)
        if key not in seen:
            seen.add(key)
            builds.append(item)
    return builds


def contract(runner: dict, witness: list[dict] | None) -> dict:
    builds = runner.get("builds") or []
    ninja = runner.get("ninja") or []
    device_flags: list[str] = []
    host_flags: list[str] = []
    for build in ninja:
        device_flags += build["cuda_flags"]
        host_flags += build["host_flags"]
    for build in builds:
        if build["route"].startswith("cupy"):
            device_flags += build["options"] + build["implicit_options"]
        elif not ninja:
            device_flags += build["extra_cuda_cflags"]
            host_flags += build["extra_cflags"]
    routes = sorted({b["route"] for b in builds} | ({"triton"} if runner.get("triton") else set()))
    measured = [w["effective_ftz"] for w in witness or [] if w["effective_ftz"] is not None]
    return {
        "routes": routes,
        "builds": builds,
        "ninja": ninja,
        "implies": flags.implications(device_flags, host_flags),
        "witness": witness,
        "effective_ftz": any(measured) if measured else None,
    }


def compare_all(cases, ref_out: Path, cand_out: Path, ran: list[str], contract: dict) -> dict:
    from kbfuse.checks import official

    references = {c["name"]: load_tensors(ref_out / "reference" / f"{c['name']}.pt") for c in cases}
    outputs = {}
    for name in [*ran, "after_timing"]:
        path = cand_out / "outputs" / f"{name}.pt"
        if path.is_file():
            outputs[name] = load_tensors(path)
    records = {}
    for name, output in outputs.items():
        reference = references["official_0" if name == "after_timing" else name]
        records[name] = compare.compare_case(reference, output, contract)
    loop = {k: v for k, v in outputs.items() if k != "after_timing"}
    return {
        **official.tolerance(contract),
        "cases": records,
        "cached_pairs": compare.cached_calls(cases, references, loop),
    }


def _environment(device: str) -> dict:
    import torch

    env = {"torch": torch.__version__, "device": device}
    if device == "cuda":
        env["device_name"] = torch.cuda.get_device_name(0)
        env["cuda"] = torch.version.cuda
    return env


@dataclass
class Evidence:
    """What the three children left behind, read back by the parent."""

    info: dict  # reference.json: output shape, trivial-candidate status
    cases: list[dict]  # the case list both sides followed
    outcome: Outcome  # the candidate process
    runner: dict  # runner.json ({} when the process died before writing it)
    witness: list[dict] | None
    witness_outcome: Outcome | None
    correctness: dict


def gather(
    candidate, task_file, settings, contract, device, scratch: Path, logs: dict, lock=None
) -> Evidence:
    """Run the reference, candidate and witness children in `scratch`; compare the tensors."""
    limits = Limits(settings["time_limit_s"], settings["memory_limit_mb"])
    with _holding(lock, "shared"):
        cases, info, ref_out = run_reference(
            task_file, settings, contract, device, scratch, limits, logs["reference"]
        )
    outcome, cand_out = run_candidate(
        candidate,
        task_file,
        settings,
        contract,
        device,
        cases,
        ref_out,
        scratch,
        limits,
        logs["candidate"],
        lock,
    )
    runner = _read_json(cand_out / "runner.json") or {}
    witness, witness_outcome = None, None
    builds = witness_builds(runner)
    if device == "cuda" and builds:
        folder = scratch / "witness"
        folder.mkdir()
        env = witness_env(settings)
        with _holding(lock, "shared"):
            witness_outcome = _child(
                "witness", {"builds": builds}, folder, limits, logs["witness"], env
            )
        witness = _read_json(folder / "out" / "witness.json")
    correctness = compare_all(cases, ref_out, cand_out, runner.get("cases_run", []), contract)
    correctness["skipped_cases"] = runner.get("skipped_cases", {})
    return Evidence(info, cases, outcome, runner, witness, witness_outcome, correctness)


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
) -> dict:
    """Check one candidate (see the module docstring) under `contract` (the pinned
    kernelbench_contract record); the verdict record, also at `out`. `lock`: the device's GPU
    lock (kbfuse.workflow.gpulock), or None to take none."""
    settings = check_settings(settings)
    contract = judged_contract(contract, settings)
    candidate, task_file, out = Path(candidate), Path(task_file), Path(out)
    for path, what in ((candidate, "candidate file"), (task_file, "task file")):
        if not path.is_file():
            raise KbfuseError(f"{what} {path} does not exist or is not a file")
    device = device or default_device()
    logs_at = Path(log_dir) if log_dir is not None else out.parent
    logs = {role: logs_at / f"{out.stem}.{role}.log" for role in ROLES}
    for log in logs.values():
        log.unlink(missing_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="kbfuse-check-"))
    try:
        evidence = gather(candidate, task_file, settings, contract, device, scratch, logs, lock)
    finally:
        if keep_scratch:
            print(f"scratch kept: {scratch}")
        else:
            shutil.rmtree(scratch, ignore_errors=True)
    task_record = {
        "level": level,
        "task": task,
        "file": task_file.name,
        "sha256": sha256_file(task_file),
        "commit": commit,
    }
    record = assemble(candidate, task_record, device, settings, survey, evidence, contract)
    verdict.validate(record, f"verdict of {candidate}")
    write_json(out, record)
    return record


def trivial_status(info: dict, survey: str | Path | None) -> tuple[dict | None, str]:
    """The survey's blind spots for the task when a survey record is given, else the
    reference process's own computation (the same predicate on the same inputs)."""
    if survey is not None and Path(survey).is_file():
        data = _read_json(Path(survey)) or {}
        if "blind_spots" in data:
            spots = dict(data["blind_spots"])
            spots["blind_spot"] = bool(data.get("blind_spot"))
            return spots, f"survey record {Path(survey).name}"
    return info.get("trivial"), "computed by the reference process"


def official_block(contract: dict) -> dict:
    """What the verdict says about the judge: the pinned tolerance and where it was read, the
    argument order, the seed and trial count used, the contract's commit."""
    from kbfuse.checks import official

    return {
        **official.tolerance(contract),
        "argument_order": list(contract["argument_order"]),
        "seed": contract["seed"],
        "trials": contract["trials"],
        "contract_commit": contract.get("commit"),
    }


def assemble(
    candidate: Path,
    task: dict,
    device: str,
    settings: dict,
    survey,
    evidence: Evidence,
    judged_by: dict,
) -> dict:
    """The verdict record (kbfuse.candidates.verdict names the checks and decides);
    `judged_by`: the kernelbench contract of the check."""
    runner, outcome, correctness = evidence.runner, evidence.outcome, evidence.correctness
    failure = runner.get("failure")
    trivial, trivial_source = trivial_status(evidence.info, survey)
    guards = None
    if runner.get("patched"):
        guards = {
            "patched": runner["patched"],
            "lazy": runner.get("lazy", []),
            "side_stream": runner.get("side_stream"),
            "unfinished_on_caller_stream": runner.get("unfinished_on_caller_stream"),
        }
    checks: dict[str, dict] = {}
    checks.update(
        verdict.process_checks(outcome.as_dict(), failure, runner.get("stages_done") or [])
    )
    checks.update(verdict.correctness_checks(correctness, evidence.cases))
    checks.update(verdict.guard_checks(guards, device))
    timing = runner.get("timing")
    record = {
        "kind": verdict.KIND,
        "schema_version": verdict.SCHEMA_VERSION,
        "candidate": {"file": candidate.name, "sha256": sha256_file(candidate)},
        "task": task,
        "environment": _environment(device),
        "settings": settings,
        "official": official_block(judged_by),
        "checks": checks,
        "processes": {
            "candidate": outcome.as_dict(),
            "witness": evidence.witness_outcome.as_dict() if evidence.witness_outcome else None,
        },
        "failure": failure and {k: failure[k] for k in ("stage", "error", "message")},
        "trivial": trivial,
        "trivial_source": trivial_source,
        "correctness": correctness,
        "contract": contract(runner, evidence.witness),
        "guards": guards,
        "baselines": runner.get("baselines"),
        "timing": timing,
        "speedup": verdict.speedups(timing),
    }
    record["verdict"], record["failed_checks"] = verdict.decide(checks)
    record["findings"] = verdict.findings(record)
    return record
