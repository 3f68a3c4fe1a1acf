"""Pin a KernelBench checkout at one commit and load its level-N task files.

`pin_kernelbench` fetches exactly the pinned commit (shallow when the server allows fetching
by SHA, a full fetch otherwise), verifies HEAD, and records the sha256 of every task file.
`load_task` re-hashes a task file against that record before importing it, so a result can
always name the exact task source it ran.

The commit (and each task file's sha256) is the identity; the URL is only transport. So a
record names the URL as given only when it is a network URL (without any user name or password
in it); a local path or file:// URL is recorded as `LOCAL_MIRROR`, since a path of this
machine means nothing elsewhere. The job's log names the URL the same way.

Every git call is bounded: an unreachable or silent remote fails after `KBFUSE_GIT_TIMEOUT_S`
seconds (default 60), with the URL in the message, and git and its helpers are killed.
"""

from __future__ import annotations

import copy
import importlib.util
import itertools
import math
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import types
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any
from urllib.parse import urlsplit

from kbfuse.errors import KbfuseError
from kbfuse.faults import checkpoint
from kbfuse.io import read_json, sha256_file, write_json

PIN_KIND = "kernelbench_pin"
SCHEMA_VERSION = 1
GIT_TIMEOUT_ENV = "KBFUSE_GIT_TIMEOUT_S"
GIT_TIMEOUT_S = 60.0  # default for each git call; a shallow fetch of KernelBench takes seconds
LOCAL_MIRROR = "local mirror"
_NETWORK_SCHEMES = {"http", "https", "git", "ssh", "git+ssh", "ssh+git"}
_LOOPBACK_HOSTS = {"localhost", "127.0.0.1", "::1"}
_SCP_LIKE_RE = re.compile(r"(?:(?P<user>[^@/:]+)@)?(?P<host>[A-Za-z0-9.-]{2,}):(?!//)(?P<path>.+)")
TASK_FUNCTIONS = ("Model", "get_inputs", "get_init_inputs")

_COMMIT_RE = re.compile(r"[0-9a-f]{40}")
_SHA256_RE = re.compile(r"[0-9a-f]{64}")
_module_counter = itertools.count()

# Variables that would point git at another repository than the one named by `-C`.
_GIT_LOCATION_VARS = (
    "GIT_DIR",
    "GIT_WORK_TREE",
    "GIT_INDEX_FILE",
    "GIT_OBJECT_DIRECTORY",
    "GIT_ALTERNATE_OBJECT_DIRECTORIES",
    "GIT_COMMON_DIR",
    "GIT_NAMESPACE",
)


# --------------------------------------------------------------------------- git


def git_timeout_s() -> float:
    """Seconds each git call may take: $KBFUSE_GIT_TIMEOUT_S, or GIT_TIMEOUT_S when unset."""
    raw = os.environ.get(GIT_TIMEOUT_ENV, "").strip()
    if not raw:
        return GIT_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise KbfuseError(f"{GIT_TIMEOUT_ENV}={raw!r} must be a positive number of seconds")
    return value


def recorded_url(url: str) -> str:
    """How records name the KernelBench URL `url` (see the module docstring)."""
    parts = urlsplit(url)
    if parts.scheme in _NETWORK_SCHEMES and parts.hostname:
        if parts.hostname in _LOOPBACK_HOSTS:
            return LOCAL_MIRROR
        host = parts.hostname if ":" not in parts.hostname else f"[{parts.hostname}]"
        if parts.port is not None:
            host += f":{parts.port}"
        # https tokens often sit in the user name; an ssh user name is part of the address.
        if parts.username and parts.scheme not in {"http", "https"}:
            host = f"{parts.username}@{host}"
        return parts._replace(netloc=host).geturl()
    scp = _SCP_LIKE_RE.fullmatch(url)
    if "://" not in url and scp and not Path(url).exists():  # [user@]host:path, git's ssh form
        return LOCAL_MIRROR if scp["host"] in _LOOPBACK_HOSTS else url
    return LOCAL_MIRROR


def recorded_config(config: dict) -> dict:
    """A copy of the workflow config as results record it: the KernelBench URL as
    recorded_url names it, so no path of this machine is recorded and moving to another local
    mirror changes nothing that the summary and manifest jobs are given. The `survey` block is
    left out: it configures the survey, whose records name their own settings, so changing it
    reruns none of the study's summary, manifest or bundle; so is the `fused2` block, the second
    fused study's, which records its own config (kbfuse.workflow.studies.fused2_config)."""
    recorded = copy.deepcopy(config)
    recorded.pop("survey", None)
    recorded.pop("fused2", None)
    recorded["kernelbench"]["url"] = recorded_url(config["kernelbench"]["url"])
    return recorded


class _GitFailed(Exception):
    def __init__(self, args: list[str], returncode: int, output: str):
        super().__init__(f"git {' '.join(args)} exited {returncode}")
        self.args_ = args
        self.returncode = returncode
        self.output = output


class _GitTimeout(KbfuseError):
    """A git call ran past its time limit (and was killed)."""


class _GitRunner:
    """Runs git non-interactively with a timeout, echoing commands and output to a log.

    `hide` maps strings (a local URL, say) to what the log shows instead."""

    def __init__(self, log: IO[str] | None, timeout_s: float, hide: dict[str, str] | None = None):
        self.log = log
        self.timeout_s = timeout_s
        self.hide = {k: v for k, v in (hide or {}).items() if k and k != v}
        self.env = {k: v for k, v in os.environ.items() if k not in _GIT_LOCATION_VARS}
        self.env["GIT_TERMINAL_PROMPT"] = "0"
        self.env["GIT_ASKPASS"] = "true"  # never wait for a password, fail instead
        self.env["GIT_SSH_COMMAND"] = self.env.get("GIT_SSH_COMMAND", "ssh -o BatchMode=yes")

    def __call__(self, *args: str, cwd: Path | None = None) -> str:
        argv = ["git", *args]
        self.note(f"$ {shlex.join(argv)}" + (f"    (in {cwd})" if cwd else ""))
        try:
            returncode, stdout, stderr = self._run(argv, cwd)
        except FileNotFoundError as exc:
            raise KbfuseError("the git executable was not found on PATH") from exc
        output = (stdout + stderr).strip()
        if output:
            self.note(output)
        self.note(f"exit {returncode}")
        if returncode != 0:
            raise _GitFailed(list(args), returncode, output)
        return stdout.strip()

    def _run(self, argv: list[str], cwd: Path | None) -> tuple[int, str, str]:
        # git runs its transport helpers (git-remote-https, ssh) as children: on a timeout the
        # whole process group goes, since killing git alone leaves them waiting on the remote
        # and holding git's pipes open (so reading them would never end).
        with subprocess.Popen(
            argv,
            cwd=cwd,
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        ) as proc:
            try:
                stdout, stderr = proc.communicate(timeout=self.timeout_s)
            except subprocess.TimeoutExpired as exc:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.communicate()
                self.note(f"timed out after {self.timeout_s:g} s")
                raise _GitTimeout(f"git {argv[1]} timed out after {self.timeout_s:g} s") from exc
            except BaseException:
                os.killpg(proc.pid, signal.SIGKILL)
                raise
        return proc.returncode, stdout, stderr

    def note(self, text: str) -> None:
        if self.log is not None:
            for secret, shown in self.hide.items():
                text = text.replace(secret, shown)
            self.log.write(text + "\n")
            self.log.flush()


def _fetch_url(url: str) -> str:
    """A local path becomes a file:// URL, so that `--depth` is honoured for it too."""
    if "://" not in url and Path(url).exists():
        return Path(url).resolve().as_uri()
    return url


# --------------------------------------------------------------------------- pinning


def check_commit(commit: Any) -> str:
    if not isinstance(commit, str) or not _COMMIT_RE.fullmatch(commit):
        raise KbfuseError(
            f"kernelbench.commit {commit!r} is malformed: it must be a full commit id "
            "of 40 lowercase hex digits"
        )
    return commit


def _check_level_and_tasks(level: Any, tasks: Any) -> list[int]:
    if isinstance(level, bool) or not isinstance(level, int) or level < 1:
        raise KbfuseError(f"kernelbench.level {level!r} must be a positive integer")
    if isinstance(tasks, str | bytes) or not hasattr(tasks, "__iter__"):
        raise KbfuseError(f"tasks {tasks!r} must be a list of positive integers")
    tasks = list(tasks)
    if not tasks:
        raise KbfuseError("tasks is empty: name at least one KernelBench task")
    for task in tasks:
        if isinstance(task, bool) or not isinstance(task, int) or task < 1:
            raise KbfuseError(f"task {task!r} in tasks must be a positive integer")
    duplicates = sorted({t for t in tasks if tasks.count(t) > 1})
    if duplicates:
        raise KbfuseError(f"tasks lists {duplicates} more than once")
    return tasks


def _clear_stale_checkout(checkout: Path) -> None:
    if not checkout.exists() and not checkout.is_symlink():
        return
    if not checkout.is_dir() or checkout.is_symlink():
        raise KbfuseError(f"checkout path {checkout} exists and is not a directory")
    # Only remove what looks like an earlier (possibly partial) checkout of ours.
    if any(checkout.iterdir()) and not (checkout / ".git").is_dir():
        raise KbfuseError(
            f"checkout directory {checkout} is not empty and is not a git checkout; "
            "refusing to remove it"
        )
    shutil.rmtree(checkout)


def _hidden_in_log(url: str, shown: str) -> dict[str, str]:
    """What the log shows instead of the URL's spellings (longest first, see _GitRunner)."""
    if shown == url:
        return {}
    spellings = [_fetch_url(url), url]
    if "://" not in url and Path(url).exists():
        resolved = str(Path(url).resolve())
        spellings += [resolved, f"file://{resolved}"]
    # git shows a repository's URL without its ".git" ("From file:///srv/KernelBench").
    spellings += [s.removesuffix(".git") for s in spellings if s.endswith(".git")]
    # A bare relative name ("KernelBench") is also a word of ordinary paths: left as it is.
    spellings = [s for s in spellings if "/" in s or "@" in s]
    return {s: shown for s in sorted(set(spellings), key=len, reverse=True)}


def _fetch_commit(git: _GitRunner, url: str, commit: str, checkout: Path) -> str:
    """Bring `commit` into the fresh repository at `checkout`; returns "shallow" or "full"."""
    try:
        return _fetch_commit_unbounded(git, url, commit, checkout)
    except _GitTimeout as exc:
        raise KbfuseError(
            f"kernelbench.url {url!r} did not answer: {exc}. Check the URL and the network, "
            f"or allow more time with {GIT_TIMEOUT_ENV}=<seconds>"
        ) from exc


def _fetch_commit_unbounded(git: _GitRunner, url: str, commit: str, checkout: Path) -> str:
    fetch_url = _fetch_url(url)
    try:
        git("ls-remote", "--", fetch_url, "HEAD", cwd=checkout)
    except _GitFailed as exc:
        raise KbfuseError(
            f"kernelbench.url {url!r} is unreachable or not a git repository: "
            f"{_last_line(exc.output)}"
        ) from exc
    try:
        git("fetch", "--no-tags", "--depth", "1", "--", fetch_url, commit, cwd=checkout)
        method = "shallow"
    except _GitFailed:
        # The server refused fetching by SHA (unadvertised object) or does not have the
        # commit: fetch all branches and tags, then see whether the commit is among them.
        try:
            git(
                "fetch",
                "--",
                fetch_url,
                "+refs/heads/*:refs/remotes/origin/*",
                "+refs/tags/*:refs/tags/*",
                cwd=checkout,
            )
        except _GitFailed as exc:
            raise KbfuseError(
                f"fetching kernelbench.url {url!r} failed: {_last_line(exc.output)}"
            ) from exc
        method = "full"
    try:
        kind = git("cat-file", "-t", commit, cwd=checkout)
    except _GitFailed as exc:
        raise KbfuseError(
            f"kernelbench.commit {commit} is not in the repository {url!r} "
            "(no branch or tag contains it)"
        ) from exc
    if kind != "commit":
        raise KbfuseError(f"kernelbench.commit {commit} names a {kind} in {url!r}, not a commit")
    return method


def _find_task_file(checkout: Path, level: int, task: int, commit: str) -> Path:
    level_dir = checkout / "KernelBench" / f"level{level}"
    pattern = f"{task}_*.py"
    matches = sorted(p for p in level_dir.glob(pattern) if p.is_file())
    where = f"KernelBench/level{level}/{pattern}"
    if not matches:
        raise KbfuseError(f"task {task}: no file matches {where} at commit {commit}")
    if len(matches) > 1:
        names = ", ".join(p.name for p in matches)
        raise KbfuseError(f"task {task}: {where} is ambiguous at commit {commit}: matches {names}")
    return matches[0]


def _task_record(checkout: Path, path: Path) -> dict:
    return {
        "path": path.relative_to(checkout).as_posix(),
        "name": path.stem,
        "sha256": sha256_file(path),
    }


def _last_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else "(no output)"


def pin_kernelbench(
    url: str,
    commit: str,
    level: int,
    tasks,
    checkout: str | os.PathLike,
    pin_json: str | os.PathLike,
    log: str | os.PathLike | None = None,
    timeout_s: float | None = None,
) -> dict:
    """Check out `commit` of `url` into `checkout`, write and return the pin record.

    `url` may be a remote URL, a local repository path or a local (bare) mirror; the record
    names it as `recorded_url` says. `timeout_s` bounds each git call (default: git_timeout_s()).
    On any error neither `checkout` nor `pin_json` is left behind.
    """
    if not isinstance(url, str) or not url.strip():
        raise KbfuseError(f"kernelbench.url {url!r} must be a non-empty string")
    timeout_s = git_timeout_s() if timeout_s is None else timeout_s
    check_commit(commit)
    tasks = _check_level_and_tasks(level, tasks)
    checkout = Path(checkout)
    pin_json = Path(pin_json)

    _clear_stale_checkout(checkout)
    pin_json.unlink(missing_ok=True)
    log_file = None
    owns_log = False
    if hasattr(log, "write"):  # an open stream, e.g. the job's redirected stdout
        log_file = log
    elif log is not None:
        Path(log).parent.mkdir(parents=True, exist_ok=True)
        log_file = open(log, "w")  # noqa: SIM115 - closed in the finally below
        owns_log = True
    try:
        shown = recorded_url(url)
        git = _GitRunner(log_file, timeout_s, hide=_hidden_in_log(url, shown))
        checkout.mkdir(parents=True)
        git("-c", "init.defaultBranch=kbfuse-pin", "init", "-q", cwd=checkout)
        method = _fetch_commit(git, url, commit, checkout)
        checkpoint("clone", str(checkout))
        try:
            git(
                "-c",
                "advice.detachedHead=false",
                "-c",
                "core.autocrlf=false",
                "checkout",
                "-q",
                "--detach",
                commit,
                cwd=checkout,
            )
        except _GitFailed as exc:
            raise KbfuseError(
                f"checking out kernelbench.commit {commit} failed: {_last_line(exc.output)}"
            ) from exc
        head = git("rev-parse", "HEAD", cwd=checkout)
        if head != commit:
            raise KbfuseError(
                f"checkout {checkout}: HEAD is {head!r} after checking out "
                f"kernelbench.commit {commit}"
            )
        task_records = {}
        for task in tasks:
            task_records[str(task)] = _task_record(
                checkout, _find_task_file(checkout, level, task, commit)
            )
        pin = {
            "kind": PIN_KIND,
            "schema_version": SCHEMA_VERSION,
            "url": shown,
            "commit": commit,
            "head": head,
            "level": level,
            "tasks": task_records,
        }
        write_json(pin_json, pin)
        git.note(f"pinned {commit} ({method} fetch); wrote {pin_json}")
        return pin
    except BaseException:
        shutil.rmtree(checkout, ignore_errors=True)
        pin_json.unlink(missing_ok=True)
        raise
    finally:
        if owns_log:
            log_file.close()


# --------------------------------------------------------------------------- pin record


def read_pin(path: str | os.PathLike) -> dict:
    """Read a pin record and check its keys; KbfuseError naming the file and key otherwise."""
    try:
        pin = read_json(path)
    except FileNotFoundError as exc:
        raise KbfuseError(f"pin record {path} does not exist") from exc
    except ValueError as exc:
        raise KbfuseError(f"pin record {path} is not valid JSON: {exc}") from exc
    check_pin(pin, source=str(path))
    return pin


def check_pin(pin: Any, source: str = "pin record") -> None:
    def bad(what: str) -> KbfuseError:
        return KbfuseError(f"{source}: {what}")

    if not isinstance(pin, dict):
        raise bad("must be a JSON object")
    required = ("kind", "schema_version", "url", "commit", "head", "level", "tasks")
    missing = [key for key in required if key not in pin]
    if missing:
        raise bad(f"missing key(s) {missing}")
    if pin["kind"] != PIN_KIND:
        raise bad(f"kind is {pin['kind']!r}, expected {PIN_KIND!r}")
    if pin["schema_version"] != SCHEMA_VERSION:
        raise bad(f"schema_version is {pin['schema_version']!r}, expected {SCHEMA_VERSION}")
    if not isinstance(pin["url"], str) or not pin["url"]:
        raise bad(f"url {pin['url']!r} must be a non-empty string")
    for key in ("commit", "head"):
        if not isinstance(pin[key], str) or not _COMMIT_RE.fullmatch(pin[key]):
            raise bad(f"{key} {pin[key]!r} is not a 40-hex commit id")
    if pin["head"] != pin["commit"]:
        raise bad(f"head {pin['head']} differs from commit {pin['commit']}")
    level = pin["level"]
    if isinstance(level, bool) or not isinstance(level, int) or level < 1:
        raise bad(f"level {level!r} must be a positive integer")
    if not isinstance(pin["tasks"], dict) or not pin["tasks"]:
        raise bad("tasks must be a non-empty object")
    for key, record in pin["tasks"].items():
        if not key.isdigit():
            raise bad(f"tasks key {key!r} is not a task number")
        if not isinstance(record, dict):
            raise bad(f"tasks[{key!r}] must be an object")
        for field in ("path", "name", "sha256"):
            if not isinstance(record.get(field), str) or not record[field]:
                raise bad(f"tasks[{key!r}].{field} is missing or not a string")
        if not _SHA256_RE.fullmatch(record["sha256"]):
            raise bad(f"tasks[{key!r}].sha256 {record['sha256']!r} is not 64 hex digits")
        rel = Path(record["path"])
        if rel.is_absolute() or ".." in rel.parts:
            raise bad(f"tasks[{key!r}].path {record['path']!r} must be relative to the checkout")
        if rel.stem != record["name"] or not rel.name.startswith(f"{key}_"):
            raise bad(
                f"tasks[{key!r}] path {record['path']!r} and name {record['name']!r} disagree"
            )


# --------------------------------------------------------------------------- tasks


@dataclass(frozen=True)
class TaskSpec:
    task: int
    name: str
    path: Path
    sha256: str
    pin_commit: str
    module: types.ModuleType

    def init_inputs(self) -> list:
        return list(self.module.get_init_inputs())

    def input_shape(self) -> tuple[int, int]:
        """(batch_size, in_features), the task file's module-level constants."""
        return (self._int_constant("batch_size"), self._int_constant("in_features"))

    def _int_constant(self, name: str) -> int:
        value = getattr(self.module, name, None)
        if isinstance(value, bool) or not isinstance(value, int):
            raise KbfuseError(
                f"task {self.task} file {self.path} has no integer module constant {name!r} "
                f"(found {value!r})"
            )
        return value


def load_task(checkout: str | os.PathLike, pin: dict, task: int) -> TaskSpec:
    """Import the pinned task file after checking it still has the pinned sha256."""
    check_pin(pin)
    record = pin["tasks"].get(str(task))
    if record is None:
        raise KbfuseError(
            f"task {task} is not in the pin record (pinned tasks: {sorted(pin['tasks'], key=int)})"
        )
    path = Path(checkout) / record["path"]
    if not path.is_file():
        raise KbfuseError(f"task {task} file {path} (from the pin record) does not exist")
    actual = sha256_file(path)
    if actual != record["sha256"]:
        raise KbfuseError(
            f"task {task} file {path} changed after pinning: sha256 is {actual}, "
            f"the pin record says {record['sha256']}"
        )
    module = _import_task_file(path, task, actual)
    missing = [name for name in TASK_FUNCTIONS if not callable(getattr(module, name, None))]
    if missing:
        raise KbfuseError(f"task {task} file {path} does not define {', '.join(missing)}")
    return TaskSpec(
        task=int(task),
        name=record["name"],
        path=path,
        sha256=actual,
        pin_commit=pin["commit"],
        module=module,
    )


def import_task_file(path: str | os.PathLike, task: int, sha256: str) -> types.ModuleType:
    """Import task file `path` whose sha256 the caller has checked (a survey record names
    it), under a name of its own."""
    return _import_task_file(Path(path), int(task), sha256)


def _import_task_file(path: Path, task: int, sha256: str) -> types.ModuleType:
    # A unique name per import: two loads (other commit, other checkout) never share state.
    name = f"kbfuse_task_{task}_{sha256[:12]}_{next(_module_counter)}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise KbfuseError(f"task {task} file {path} cannot be imported as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # inspect/pickle/torch.jit look modules up here
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        del sys.modules[name]
        raise KbfuseError(f"importing task {task} file {path} failed: {exc!r}") from exc
    return module


def build_model(spec: TaskSpec, seed: int, device="cuda"):
    """Model(*init_inputs) built under torch.manual_seed(seed), float32, eval mode, on device.

    The model is constructed on the CPU (as KernelBench's evaluator does) and then moved, so
    the weights for a seed are the same whatever the device.
    """
    import torch

    torch.manual_seed(seed)
    model = spec.module.Model(*spec.init_inputs())
    return model.to(device=device, dtype=torch.float32).eval()


# --------------------------------------------------------------------------- workflow steps
#
# The workflow pins in three steps so that adding a task adds only that task's jobs: one
# checkout (which also fails fast on any configured task that is missing), one pin record
# per task (what per-task jobs depend on), and the combined record for the manifest.


# Keys every pin record shares, whatever tasks it lists.
_PIN_HEADER = ("kind", "schema_version", "url", "commit", "head", "level")


def pin_task(
    checkout: str | os.PathLike,
    record: str | os.PathLike,
    task: int,
    out,
    level: int | None = None,
) -> dict:
    """Pin one task of an existing checkout; the record has the pin format with one task. The
    task is of level `level` (the survey's), by default the checkout record's (the study's)."""
    base = read_pin(record)
    if level is not None:
        if isinstance(level, bool) or not isinstance(level, int) or level < 1:
            raise KbfuseError(f"survey.level {level!r} must be a positive integer")
        base = {**base, "level": level}
    checkout = Path(checkout)
    try:
        head = _GitRunner(None, git_timeout_s())("rev-parse", "HEAD", cwd=checkout)
    except _GitFailed as exc:
        raise KbfuseError(
            f"checkout {checkout} is not a git checkout: {_last_line(exc.output)}"
        ) from exc
    if head != base["commit"]:
        raise KbfuseError(
            f"checkout {checkout}: HEAD is {head!r}, the checkout record {record} says "
            f"{base['commit']}; rerun the kernelbench_checkout rule"
        )
    path = _find_task_file(checkout, base["level"], int(task), base["commit"])
    pin = {k: base[k] for k in _PIN_HEADER}
    pin["tasks"] = {str(task): _task_record(checkout, path)}
    write_json(out, pin)
    return pin


def combine_pins(record: str | os.PathLike, tasks, out) -> dict:
    """Merge the per-task pin records into one pin record of the whole study."""
    base = read_pin(record)
    merged = {k: base[k] for k in _PIN_HEADER}
    merged["tasks"] = {}
    for path in tasks:
        pin = read_pin(path)
        if pin["commit"] != base["commit"] or pin["url"] != base["url"]:
            raise KbfuseError(
                f"task pin {path} is for {pin['url']}@{pin['commit']}, "
                f"the checkout is {base['url']}@{base['commit']}"
            )
        merged["tasks"].update(pin["tasks"])
    write_json(out, merged)
    return merged
