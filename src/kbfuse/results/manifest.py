"""A hash manifest of one run's result files, and its verification.

The manifest records, for every result file (path relative to the results directory, sorted),
its sha256 and size, together with the environment fingerprint (env/fingerprint.json), the
resolved config and the KernelBench pin record (kernelbench/pin.json). It holds no timestamps,
so the same results give the same manifest, byte for byte.

`content_sha256` is the sha256 of the manifest's canonical JSON without that key: an edit of
the manifest that does not also recompute it is caught, and so is any byte that departs from
the canonical form (`kbfuse.io.dumps_json`). This detects accidents and careless edits, not a
deliberate forger, who can recompute the hash: it is a checksum, not a signature.
"""

from __future__ import annotations

import copy
import fnmatch
import hashlib
import json
import os
import stat
from collections.abc import Iterable, Mapping
from pathlib import Path, PurePosixPath
from typing import Any

from kbfuse import __version__, untrusted
from kbfuse.errors import KbfuseError
from kbfuse.io import dumps_json, read_json, sha256_bytes, sha256_file, write_text
from kbfuse.layout import RECORDS
from kbfuse.results import records

MANIFEST_KIND = "manifest"
SCHEMA_VERSION = 1
FINGERPRINT = RECORDS["env"].path
PIN = RECORDS["kernelbench_pin"].path
# A survey run alone pins the commit only (its tasks are pinned one by one under survey/pins).
CHECKOUT_PIN = "kernelbench/checkout.json"
QUOTED_PINS = (PIN, CHECKOUT_PIN)
MAX_FILE_BYTES = 256 << 20  # a result file verified in a folder (as a bundle member)


# The survey's records, its cross-device check and its summary (docs/contracts.md, "Survey"),
# hashed when a survey ran: level 2's under survey/, another level's under survey/level<N>/
# (kbfuse.layout.survey_root).
SURVEY_GLOBS = tuple(
    f"{root}/{pattern}"
    for root in ("survey", "survey/level*")
    for pattern in (
        "*/tasks/*.json",
        "floors/*.json",
        "devices.json",
        "summary/*.csv",
        "summary/*.md",
        "summary/*.png",
    )
)


def survey_files(results_dir: str | os.PathLike) -> list[str]:
    """The survey files present under results_dir (relative POSIX paths, sorted); [] when
    no survey ran there. The workflow lists them among the manifest's files."""
    root = Path(results_dir)
    found = {p.relative_to(root).as_posix() for g in SURVEY_GLOBS for p in root.glob(g)}
    return sorted(rel for rel in found if (root / rel).is_file())


def content_sha256(manifest: Mapping[str, Any]) -> str:
    body = {k: v for k, v in manifest.items() if k != "content_sha256"}
    return sha256_bytes(dumps_json(body).encode())


def _relative(root: Path, file: str | os.PathLike) -> str:
    """A result file as a POSIX path relative to root; given relative to cwd or to root."""
    path = Path(file)
    if not path.is_absolute() and not path.exists() and (root / path).exists():
        path = root / path
    if not path.is_file():
        raise KbfuseError(f"manifest input {file} is not a file")
    try:
        rel = path.resolve().relative_to(root.resolve())
    except ValueError:
        raise KbfuseError(f"manifest input {file} is not inside results dir {root}") from None
    return rel.as_posix()


def file_record(path: Path) -> dict[str, Any]:
    return {"sha256": sha256_file(path), "bytes": path.stat().st_size}


def build_manifest(
    results_dir: str | os.PathLike,
    files: Iterable[str | os.PathLike],
    config: Mapping[str, Any],
    out: str | os.PathLike,
    pin: str = PIN,
) -> dict[str, Any]:
    """Hash every result file and write the manifest to `out`; return it.

    env/fingerprint.json and the pin record (`pin`: kernelbench/pin.json for the study,
    kernelbench/checkout.json for a survey run on its own) are always included (the manifest
    quotes them, so verification can check the quotes against the files).
    """
    if pin not in QUOTED_PINS:
        raise KbfuseError(f"manifest pin record {pin!r}: one of {list(QUOTED_PINS)}")
    root = Path(results_dir)
    rels = {_relative(root, f) for f in files}
    for required in (FINGERPRINT, pin):
        if not (root / required).is_file():
            raise KbfuseError(f"manifest needs {root / required}, which is missing")
        rels.add(required)
    out_path = Path(out)
    if out_path.resolve().parent.is_relative_to(root.resolve()):
        out_rel = out_path.resolve().relative_to(root.resolve()).as_posix()
        if out_rel in rels:
            raise KbfuseError(f"manifest output {out} is also listed as one of its inputs")
    manifest: dict[str, Any] = {
        "kind": MANIFEST_KIND,
        "schema_version": SCHEMA_VERSION,
        "generator": {"kbfuse": __version__},
        "config": json.loads(dumps_json(dict(config))),
        "fingerprint": read_json(root / FINGERPRINT),
        "kernelbench_pin": read_json(root / pin),
        "files": {rel: file_record(root / rel) for rel in sorted(rels)},
    }
    manifest["content_sha256"] = content_sha256(manifest)
    write_text(out_path, dumps_json(manifest))
    return manifest


def _first(node: Any, *paths: str) -> Any:
    """The first scalar found at one of the dotted paths (fingerprint fields vary in depth)."""
    for path in paths:
        value = node
        for part in path.split("."):
            value = value.get(part) if isinstance(value, Mapping) else None
        if value is not None and not isinstance(value, Mapping | list):
            return value
    return None


def environment_of(manifest: Mapping[str, Any]) -> dict[str, Any]:
    """Which machine produced the results: GPU, driver, CUDA, torch (and friends)."""
    fp = manifest.get("fingerprint") or {}
    return {
        "gpu": _first(fp, "gpu.name"),
        "compute_capability": _first(fp, "gpu.compute_capability"),
        "driver": _first(fp, "driver.nvidia_smi.driver_version", "driver"),
        "driver_cuda": _first(fp, "driver.cuda_driver_api.cuda"),
        "cuda": _first(fp, "cuda_runtime.cuda", "cuda_runtime"),
        "torch": _first(fp, "torch"),
        "torch_cuda": _first(fp, "torch_cuda"),
        "cupy": _first(fp, "cupy"),
        "nvrtc": _first(fp, "nvrtc.version", "nvrtc"),
        "triton": _first(fp, "triton"),
        "python": _first(fp, "python"),
    }


def is_safe_relpath(rel: str) -> bool:
    p = PurePosixPath(rel)
    return bool(rel) and not p.is_absolute() and ".." not in p.parts and "\\" not in rel


def _walk_files(root: Path) -> list[str]:
    """Every entry under root that is not a folder, as a relative POSIX path: a symbolic link
    (to a folder too: it is not followed) and a FIFO or device are listed, never opened."""
    found = []
    for dirpath, dirs, names in os.walk(root):
        links = [d for d in dirs if os.path.islink(os.path.join(dirpath, d))]
        for name in names + links:
            found.append((Path(dirpath) / name).relative_to(root).as_posix())
    return sorted(found)


def found_record(path: Path, expected_bytes: int, limit: int) -> dict[str, Any]:
    """A file found in a results folder, as `file_record` has it, read within bounds: a
    regular file whose size is the expected one (and at most `limit` bytes) is hashed; for
    anything else sha256 is None and `not_hashed` says why (a symbolic link, a FIFO or a
    device is never opened; a file of another size differs whatever its bytes)."""
    st = os.lstat(path)
    if not stat.S_ISREG(st.st_mode):
        return {"sha256": None, "bytes": None, "not_hashed": untrusted.kind_of(st.st_mode)}
    if st.st_size != expected_bytes or st.st_size > limit:
        why = "size differs" if st.st_size != expected_bytes else f"over {limit} bytes"
        return {"sha256": None, "bytes": st.st_size, "not_hashed": why}
    digest, size = hashlib.sha256(), 0
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as fh:
        while size <= limit and (block := fh.read(1 << 20)):
            digest.update(block)
            size += len(block)
    return {"sha256": digest.hexdigest(), "bytes": size}


def _check_config(data: Mapping[str, Any], label: str) -> None:
    """The quoted config must pass the study's config schema: its variant names become paths.
    A key retired since the run (kbfuse.workflow.config.RETIRED_KEYS) was valid when it was
    recorded: it is left out of the check, not refused."""
    from kbfuse.workflow.config import RETIRED_KEYS, validate_schema

    config = {k: v for k, v in dict(data["config"]).items() if k not in RETIRED_KEYS}
    try:
        validate_schema(copy.deepcopy(config))
    except KbfuseError as exc:
        raise KbfuseError(f"manifest {label}: field config: {exc}") from None


def _check_form(data: Any, label: str, problems: list[str]) -> dict:
    """Schema (KbfuseError) and content hash (a problem) of a parsed manifest."""
    if not isinstance(data, Mapping):
        raise KbfuseError(f"manifest {label}: expected a JSON object")
    if data.get("kind") != MANIFEST_KIND:
        raise KbfuseError(f"manifest {label}: field kind is {data.get('kind')!r}, not 'manifest'")
    records.validate_record(data, "manifest", f"manifest {label}")
    _check_config(data, label)
    if data["content_sha256"] != content_sha256(data):
        problems.append(f"{label}: field content_sha256 does not match its content (edited)")
    return dict(data)


def manifest_from_bytes(raw: bytes, label: str) -> tuple[dict, list[str]]:
    """A manifest's bytes parsed and checked; (manifest, problems with its form)."""
    data = records.parse_json(raw, f"manifest {label}")
    problems: list[str] = []
    if isinstance(data, dict) and dumps_json(data).encode() != raw:
        problems.append(f"{label}: bytes differ from the canonical form (edited)")
    return _check_form(data, label, problems), problems


def load_manifest(manifest: str | os.PathLike | Mapping[str, Any]) -> tuple[dict, list[str]]:
    """The manifest and the problems with its own form (canonical bytes, content hash).

    KbfuseError when it is not a manifest at all: not JSON, or against its schema
    (`kbfuse/schemas/manifest.schema.json`, its config against the config schema).
    """
    if isinstance(manifest, Mapping):
        problems: list[str] = []
        return _check_form(manifest, "manifest", problems), problems
    try:
        raw = records.read_limited(manifest)
    except KbfuseError as exc:
        raise KbfuseError(f"manifest {exc}") from None
    return manifest_from_bytes(raw, str(manifest))


def compare_with_manifest(
    data: Mapping[str, Any],
    problems: list[str],
    actual: Mapping[str, Mapping[str, Any] | None],
    quoted: Mapping[str, bytes | None],
) -> dict[str, Any]:
    """The verification report of files found (relative path -> sha256 and bytes; None for
    a file the manifest does not list) against the manifest; `quoted` holds the bytes of the
    fingerprint and pin files found."""
    listed = data["files"]
    problems = list(problems)
    changed, missing = [], []
    for rel in sorted(listed):
        if not is_safe_relpath(rel):
            problems.append(f"manifest lists an unsafe path {rel!r}")
            continue
        if rel not in actual:
            missing.append(rel)
            continue
        got, expected = actual[rel], listed[rel]
        if got["sha256"] != expected["sha256"] or got["bytes"] != expected["bytes"]:
            change = {
                "path": rel,
                "expected_sha256": expected["sha256"],
                "actual_sha256": got["sha256"],
                "expected_bytes": expected["bytes"],
                "actual_bytes": got["bytes"],
            }
            if "not_hashed" in got:
                change["not_hashed"] = got["not_hashed"]
            changed.append(change)
    quotes = [(FINGERPRINT, "fingerprint"), *((rel, "kernelbench_pin") for rel in QUOTED_PINS)]
    for rel, key in quotes:
        raw = quoted.get(rel)
        if rel not in listed or raw is None:
            continue
        try:
            on_disk = records.parse_json(raw, rel)
        except KbfuseError:
            continue  # already reported as changed
        if on_disk != data.get(key):
            problems.append(f"manifest field {key} differs from {rel}")
    extra = sorted(rel for rel in actual if rel not in listed)
    return {
        "ok": not (changed or missing or extra or problems),
        "checked": len(listed),
        "changed": changed,
        "missing": missing,
        "extra": extra,
        "manifest_problems": problems,
        "environment": environment_of(data),
        "pin": {k: (data.get("kernelbench_pin") or {}).get(k) for k in ("url", "commit")},
    }


def verify_manifest(
    root: str | os.PathLike,
    manifest: str | os.PathLike | Mapping[str, Any],
    *,
    ignore: Iterable[str] = (),
    limit: int = MAX_FILE_BYTES,
) -> dict[str, Any]:
    """Compare the files under `root` with the manifest, reading within bounds: a symbolic
    link, FIFO or device under `root` is named, never followed or opened; a listed file is
    hashed only when its size is the one listed and at most `limit` bytes.

    Returns a report: `changed` (sha256 or size differ), `missing`, `extra` (files under root
    the manifest does not list; `ignore` holds glob patterns of relative paths to skip),
    `manifest_problems` (its form, or quotes of fingerprint/pin that differ from the files),
    `environment` and `ok`.
    """
    root = Path(root)
    data, problems = load_manifest(manifest)
    patterns, listed = list(ignore), data["files"]
    actual = {  # only listed files are hashed; others are named as extra
        rel: found_record(root / rel, listed[rel]["bytes"], limit) if rel in listed else None
        for rel in _walk_files(root)
        if rel in listed or not any(fnmatch.fnmatch(rel, pat) for pat in patterns)
    }
    quoted = {rel: _quoted(root / rel) for rel in (FINGERPRINT, *QUOTED_PINS) if rel in actual}
    return compare_with_manifest(data, problems, actual, quoted)


def _quoted(path: Path) -> bytes | None:
    """A quoted record's bytes, or None when it is not a regular file within the limit (it is
    then reported as changed, not read)."""
    try:
        return untrusted.read_bytes(path, records.MAX_RECORD_BYTES)
    except KbfuseError:
        return None
