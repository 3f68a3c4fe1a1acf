"""Running `kbfuse check` on the hostile candidates of tests/candidates/hostile, in a process
of its own (tests/checker.py), with the exit status, the checker's peak memory and the verdict
for the tests to assert."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml
from contracts import contract_file

HERE = Path(__file__).parent
HOSTILE = HERE / "candidates" / "hostile"
TASK53 = HERE / "candidates" / "cpu" / "task53_small.py"
SRC = HERE.parent / "src"
# The checker holds torch (about 250 MB resident); a file it read whole, a tensor it inflated
# or a log it held would each add hundreds of MB.
CHECKER_MB = 400
SETTINGS = {
    "official_trials": 2,
    "seeds": [0],
    "distributions": ["uniform"],
    "baselines": ["eager"],
    "time_limit_s": 60,
    "memory_limit_mb": 2048,
    "timing": {"warmup": 1, "rounds": 2, "invocations_per_pair": 1},
}


@dataclass
class Checked:
    rc: int
    max_rss_mb: float
    verdict: dict | None
    out: Path
    stderr: str

    def log(self, role: str = "candidate") -> Path:
        return self.out.parent / f"{self.out.stem}.{role}.log"


def run_checker(
    tmp_path: Path,
    candidate: str | Path,
    *options: str,
    env: dict[str, str] | None = None,
    lock_dir: Path | None = None,
    settings: dict | None = None,
    timeout: float = 180,
) -> Checked:
    """`kbfuse check CANDIDATE` (a name in tests/candidates/hostile or a path) on the small
    task 53, in a process of its own; the verdict is None when none was written."""
    candidate = Path(candidate) if os.sep in str(candidate) else HOSTILE / f"{candidate}.py"
    config = tmp_path / "check.yaml"
    config.write_text(yaml.safe_dump({"check": {**SETTINGS, **(settings or {})}}))
    out = tmp_path / "verdicts" / f"{candidate.stem}.json"
    report = tmp_path / "checker.json"
    command = [sys.executable, str(HERE / "checker.py"), str(report)]
    command += ["--lock-dir", str(lock_dir)] if lock_dir is not None else []
    command += ["--", "check", str(candidate), "--task", "2/53", "--task-file", str(TASK53)]
    command += ["--device", "cpu", "--config", str(config), "--out", str(out), *options]
    command += ["--contract", contract_file(tmp_path)]
    path = os.pathsep.join(p for p in (str(SRC), os.environ.get("PYTHONPATH")) if p)
    done = subprocess.run(
        command,
        env={**os.environ, "PYTHONPATH": path, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    measured = json.loads(report.read_text())
    assert measured["rc"] == done.returncode, done.stderr
    verdict = json.loads(out.read_text()) if out.is_file() else None
    return Checked(done.returncode, measured["max_rss_mb"], verdict, out, done.stderr)


def processes_with(marker: str) -> list[int]:
    """The pids of live processes whose command line holds `marker`."""
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                with open(f"/proc/{entry.name}/cmdline", "rb") as handle:
                    command = handle.read()
                with open(f"/proc/{entry.name}/stat", "rb") as handle:
                    state = handle.read().rsplit(b")", 1)[1].split()[0]
            except OSError:
                continue
            if marker.encode() in command and state != b"Z":
                found.append(int(entry.name))
    return found
