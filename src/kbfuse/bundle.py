"""A result bundle: one deterministic .tar.gz holding a manifest and the files it lists.

Layout inside the archive (a single top directory, so extracting never touches ./results):

    kbfuse-bundle/manifest.json
    kbfuse-bundle/results/<path listed in the manifest>

The archive is reproducible: members sorted by name, mtime 0, uid/gid 0 with empty owner
names, fixed modes, gzip header mtime 0 and no file name. Verification extracts the regular
files to a temporary directory (refusing absolute paths, `..`, links and device files),
re-hashes them against the manifest inside and names every changed, missing, extra or
duplicated member, together with the machine the manifest says produced the results.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import os
import tarfile
import tempfile
import zlib
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import Any

from kbfuse.errors import KbfuseError
from kbfuse.io import sha256_file, write_bytes
from kbfuse.manifest import file_record, is_safe_relpath, load_manifest, verify_manifest

BUNDLE_ROOT = "kbfuse-bundle"
MANIFEST_MEMBER = f"{BUNDLE_ROOT}/manifest.json"
RESULTS_PREFIX = f"{BUNDLE_ROOT}/results/"


def _tarinfo(name: str, size: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size = size
    info.mtime = 0
    info.mode = 0o644
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.type = tarfile.REGTYPE
    return info


def pack(members: dict[str, bytes]) -> bytes:
    """Deterministic .tar.gz bytes of {member name: content}, sorted by name."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name in sorted(members):
            data = members[name]
            tar.addfile(_tarinfo(name, len(data)), io.BytesIO(data))
    out = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=out, mtime=0, compresslevel=9) as gz:
        gz.write(raw.getvalue())
    return out.getvalue()


def make_bundle(
    results_dir: str | os.PathLike, manifest_path: str | os.PathLike, out_tar_gz: str | os.PathLike
) -> Path:
    """Pack the manifest and every file it lists; refuse files changed since the manifest."""
    root = Path(results_dir)
    manifest, problems = load_manifest(manifest_path)
    if problems:
        raise KbfuseError("refusing to bundle: " + "; ".join(problems))
    members = {MANIFEST_MEMBER: Path(manifest_path).read_bytes()}
    for rel, expected in sorted(manifest["files"].items()):
        if not is_safe_relpath(rel):
            raise KbfuseError(f"refusing to bundle: {manifest_path} lists an unsafe path {rel!r}")
        path = root / rel
        if not path.is_file():
            raise KbfuseError(
                f"refusing to bundle: {path} is listed in {manifest_path} but missing"
            )
        if file_record(path) != {"sha256": expected["sha256"], "bytes": expected["bytes"]}:
            raise KbfuseError(
                f"refusing to bundle: {path} changed since {manifest_path} was written "
                f"(sha256 {sha256_file(path)}, manifest says {expected['sha256']})"
            )
        members[RESULTS_PREFIX + rel] = path.read_bytes()
    out = Path(out_tar_gz)
    write_bytes(out, pack(members))
    return out


def _member_name(member: tarfile.TarInfo) -> str:
    """The member's normalised name; KbfuseError for anything that could escape or link."""
    name = member.name
    parts = [p for p in PurePosixPath(name).parts if p != "."]
    if (
        not parts
        or name.startswith("/")
        or ".." in parts
        or "\\" in name
        or "\x00" in name
        or (len(parts[0]) == 2 and parts[0][1] == ":")
    ):
        raise KbfuseError(f"bundle member {name!r} has an unsafe path; refusing to extract")
    if not (member.isfile() or member.isdir()):
        raise KbfuseError(f"bundle member {name!r} is a link or special file; refusing to extract")
    return "/".join(parts)


def _read_members(path: str | os.PathLike) -> list[tuple[str, bytes]]:
    """The archive's regular files in archive order; refuses unreadable or unsafe archives."""
    files: list[tuple[str, bytes]] = []
    try:
        with tarfile.open(path, mode="r:gz") as tar:
            for member in tar:
                name = _member_name(member)
                if member.isdir():
                    continue
                fh = tar.extractfile(member)
                if fh is None:
                    raise KbfuseError(f"bundle member {name!r} cannot be read")
                files.append((name, fh.read()))
    except (tarfile.TarError, OSError, EOFError, zlib.error) as exc:
        raise KbfuseError(f"bundle {path} is not a readable .tar.gz: {exc}") from exc
    return files


def extract_bundle(path: str | os.PathLike, dest: str | os.PathLike) -> dict[str, Any]:
    """Write the bundle's regular files under dest; return member names and duplicates.

    A name that occurs twice is extracted once (the first) and reported as a duplicate.
    """
    dest = Path(dest).resolve()
    names: set[str] = set()
    duplicates: set[str] = set()
    for name, data in _read_members(path):
        if name in names:
            duplicates.add(name)
            continue
        target = dest / name
        if not target.resolve().is_relative_to(dest):
            raise KbfuseError(f"bundle member {name!r} resolves outside the extraction dir")
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
        except OSError as exc:
            raise KbfuseError(f"bundle member {name!r} cannot be extracted: {exc}") from exc
        names.add(name)
    return {"members": sorted(names), "duplicates": sorted(duplicates)}


def _verify_extracted(path: Path, dest: Path, extracted: dict[str, Any]) -> dict[str, Any]:
    if MANIFEST_MEMBER not in extracted["members"]:
        raise KbfuseError(f"bundle {path} has no {MANIFEST_MEMBER}; not a kbfuse bundle")
    report = verify_manifest(dest / RESULTS_PREFIX, dest / MANIFEST_MEMBER)
    outside = [
        name
        for name in extracted["members"]
        if name != MANIFEST_MEMBER and not name.startswith(RESULTS_PREFIX)
    ]
    problems = [
        p.replace(str(dest / MANIFEST_MEMBER), MANIFEST_MEMBER) for p in report["manifest_problems"]
    ]
    changed = [{**c, "path": RESULTS_PREFIX + c["path"]} for c in report["changed"]]
    report.update(
        bundle=str(path),
        bundle_sha256=sha256_file(path),
        changed=changed,
        missing=[RESULTS_PREFIX + m for m in report["missing"]],
        extra=sorted([RESULTS_PREFIX + e for e in report["extra"]] + outside),
        duplicates=extracted["duplicates"],
        manifest_problems=problems,
    )
    report["ok"] = not any(
        report[k] for k in ("changed", "missing", "extra", "duplicates", "manifest_problems")
    )
    return report


@contextlib.contextmanager
def open_bundle(path: str | os.PathLike) -> Iterator[tuple[dict[str, Any], Path, dict]]:
    """Extract and verify a bundle; yield (report, results dir, manifest) while extracted."""
    path = Path(path)
    with tempfile.TemporaryDirectory(prefix="kbfuse-bundle-") as tmp:
        dest = Path(tmp)
        report = _verify_extracted(path, dest, extract_bundle(path, dest))
        manifest, _ = load_manifest(dest / MANIFEST_MEMBER)
        yield report, dest / RESULTS_PREFIX, manifest


def verify_bundle(path: str | os.PathLike) -> dict[str, Any]:
    """Verify a bundle against the manifest inside it; the report says what is wrong."""
    with open_bundle(path) as (report, _results, _manifest):
        return report


def format_report(report: dict[str, Any]) -> str:
    """The verification report as text for people."""
    env = report["environment"]
    lines = [
        f"bundle {report.get('bundle', '')}",
        f"  sha256 {report.get('bundle_sha256', '')}",
        f"  produced on: GPU {env.get('gpu')}, driver {env.get('driver')} "
        f"(CUDA {env.get('driver_cuda')}), CUDA runtime {env.get('cuda')}, "
        f"torch {env.get('torch')} (CUDA {env.get('torch_cuda')}), NVRTC {env.get('nvrtc')}",
        f"  KernelBench {report['pin'].get('url')} @ {report['pin'].get('commit')}",
        f"  files listed in manifest: {report['checked']}",
    ]
    for c in report["changed"]:
        lines.append(
            f"  CHANGED {c['path']}: sha256 {c['actual_sha256']} ({c['actual_bytes']} bytes), "
            f"manifest says {c['expected_sha256']} ({c['expected_bytes']} bytes)"
        )
    lines += [f"  MISSING {m}" for m in report["missing"]]
    lines += [f"  EXTRA {e}" for e in report["extra"]]
    lines += [f"  DUPLICATE member {d}" for d in report.get("duplicates", [])]
    lines += [f"  MANIFEST {p}" for p in report["manifest_problems"]]
    lines.append("  OK: every file matches the manifest" if report["ok"] else "  FAILED")
    return "\n".join(lines) + "\n"
