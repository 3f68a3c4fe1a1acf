"""A result bundle: one deterministic .tar.gz holding a manifest and the files it lists.

Layout inside the archive (a single top directory, so extracting never touches ./results):

    kbfuse-bundle/manifest.json
    kbfuse-bundle/results/<path listed in the manifest>

The archive is reproducible: members sorted by name, mtime 0, uid/gid 0 with empty owner
names, fixed modes, gzip header mtime 0 and no file name.

A bundle to verify or compare is untrusted input (it may come from anyone), so it is read as a
stream, once, in memory bounded whatever it declares:

- the gzip stream is decompressed in bounded steps; data after it is refused, and so is
  anything but zeros after the tar end-of-archive (two zero blocks, which must be there);
- members are refused beyond `Limits`: their number, each one's declared size, the sum of
  the sizes (checked from the header, before the data is read), the size of pax and
  long-name headers; sparse files, links and device files are refused, and so is a name
  that is absolute, has a `..` segment, a backslash or a control character;
- member data is hashed chunk by chunk and never held whole, except the manifest and the two
  files it quotes (at most `kbfuse.results.records.MAX_RECORD_BYTES` each). The manifest is checked
  against its schema (`kbfuse.results.records`), its config against the study's config schema, so
  names it holds are safe to use as paths;
- `verify_bundle` writes nothing; `open_bundle` writes the members under results/ only into
  a fresh directory under the one its caller gives.

The report names every changed, missing, extra or duplicated member, together with the machine
the manifest says produced the results.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import io
import os
import tarfile
import tempfile
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import IO, Any

from kbfuse.errors import KbfuseError
from kbfuse.io import sha256_file, write_bytes
from kbfuse.results.manifest import (
    FINGERPRINT,
    PIN,
    compare_with_manifest,
    file_record,
    is_safe_relpath,
    load_manifest,
    manifest_from_bytes,
)
from kbfuse.results.records import MAX_RECORD_BYTES

BUNDLE_ROOT = "kbfuse-bundle"
MANIFEST_MEMBER = f"{BUNDLE_ROOT}/manifest.json"
RESULTS_PREFIX = f"{BUNDLE_ROOT}/results/"
KEPT_MEMBERS = (MANIFEST_MEMBER, RESULTS_PREFIX + FINGERPRINT, RESULTS_PREFIX + PIN)
CHUNK = 1 << 20
BLOCK = tarfile.BLOCKSIZE


@dataclass(frozen=True)
class Limits:
    """What a bundle may hold; a bundle beyond any of these is refused as it is read."""

    members: int = 10_000
    member_bytes: int = 256 << 20
    total_bytes: int = 1 << 30
    header_bytes: int = 4096  # pax and GNU long-name headers: a path, a size

    @property
    def stream_bytes(self) -> int:
        """Most decompressed bytes a bundle within the limits can take (headers, padding)."""
        return self.total_bytes + (self.members + 2) * (2 * BLOCK + self.header_bytes) + 10240


DEFAULT_LIMITS = Limits()


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


class _GunzipStream(io.RawIOBase):
    """The decompressed bytes of one gzip member, produced in bounded steps.

    Counts what it hands out (refusing more than `cap` bytes), remembers the position of the
    last non-zero byte (to find data after the tar end-of-archive), hashes the raw file, and
    refuses data after the gzip stream.
    """

    STEP = 1 << 16

    def __init__(self, raw: IO[bytes], label: str, cap: int):
        self._raw, self._label, self._cap = raw, label, cap
        self._zlib = zlib.decompressobj(16 + zlib.MAX_WBITS)
        self._tail = b""  # compressed input not yet decompressed
        self._out, self._at = b"", 0  # decompressed, handed out up to _at
        self.position = 0
        self.last_nonzero = -1
        self.raw_sha256 = hashlib.sha256()

    def readable(self) -> bool:
        return True

    def _decompress(self) -> bytes:
        while not self._zlib.eof:
            data = self._tail
            if not data:
                data = self._raw.read(self.STEP)
                if not data:
                    raise KbfuseError(f"bundle {self._label}: the gzip stream is cut short")
                self.raw_sha256.update(data)
            try:
                out = self._zlib.decompress(data, self.STEP)
            except zlib.error as exc:
                msg = f"bundle {self._label} is not a readable .tar.gz: {exc}"
                raise KbfuseError(msg) from None
            self._tail = self._zlib.unconsumed_tail
            if out:
                return out
        if self._zlib.unused_data or self._raw.read(1):
            raise KbfuseError(f"bundle {self._label} has data after the gzip stream; refusing it")
        return b""

    def readinto(self, buffer) -> int:
        if self._at == len(self._out):
            self._out, self._at = self._decompress(), 0
        n = min(len(buffer), len(self._out) - self._at)
        piece = self._out[self._at : self._at + n]
        self._at += n
        buffer[:n] = piece
        stripped = piece.rstrip(b"\0")
        if stripped:
            self.last_nonzero = self.position + len(stripped) - 1
        self.position += n
        if self.position > self._cap:
            raise KbfuseError(
                f"bundle {self._label} decompresses to more than {self._cap} bytes; refusing it"
            )
        return n

    def cap_at(self, position: int) -> None:
        """Refuse the stream once it runs past `position` (or where it already is)."""
        self._cap = min(self._cap, max(position, self.position))

    def drain(self) -> None:
        while self.read(self.STEP):
            pass


class _CheckedTarInfo(tarfile.TarInfo):
    """A tar header that refuses, before its data is read, what a bundle never holds.

    Passed as `tarfile.open(tarinfo=...)`; `_proc_member` is where tarfile dispatches on the
    header type and, for pax and GNU long-name headers, reads `size` bytes in one call: the
    size is checked first, so a header declaring GiBs costs nothing.
    """

    header_limit = DEFAULT_LIMITS.header_bytes

    def _proc_member(self, tarfile_):
        if self.type == tarfile.GNUTYPE_SPARSE:
            raise KbfuseError(f"bundle member {self.name!r} is a sparse file; refusing it")
        if self.type == tarfile.XGLTYPE:
            raise KbfuseError("bundle has a global pax header; refusing it")
        long_header = (tarfile.XHDTYPE, tarfile.SOLARIS_XHDTYPE)
        long_header += (tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK)
        if self.type in long_header and self.size > self.header_limit:
            raise KbfuseError(
                f"bundle has a {self.size}-byte extended header, over the "
                f"{self.header_limit}-byte limit; refusing it"
            )
        return super()._proc_member(tarfile_)


def _member_name(member: tarfile.TarInfo) -> str:
    """The member's normalised name; KbfuseError for anything that could escape or link."""
    name = member.name
    parts = [p for p in PurePosixPath(name).parts if p != "."]
    if (
        not parts
        or len(name) > 1024
        or name.startswith("/")
        or ".." in parts
        or "\\" in name
        or any(ord(c) < 0x20 or ord(c) == 0x7F for c in name)
        or (len(parts[0]) == 2 and parts[0][1] == ":")
    ):
        raise KbfuseError(f"bundle member {name!r} has an unsafe path; refusing to extract")
    if not (member.isfile() or member.isdir()):
        raise KbfuseError(f"bundle member {name!r} is a link or special file; refusing to extract")
    return "/".join(parts)


@dataclass
class BundleContents:
    """What one pass over a bundle found: each regular member's sha256 and size (first copy
    of a name), duplicates, the kept members' bytes, the raw file's sha256."""

    records: dict[str, dict[str, Any]] = field(default_factory=dict)
    duplicates: set[str] = field(default_factory=set)
    kept: dict[str, bytes] = field(default_factory=dict)
    sha256: str = ""


def _copy_member(tar, member, name: str, sink: Path | None, keep: bool) -> tuple[dict, bytes]:
    """Hash the member's data in chunks; write it under sink and/or keep it when asked."""
    fh = tar.extractfile(member)
    digest, size, kept = hashlib.sha256(), 0, []
    out = None
    try:
        if sink is not None:
            target = sink / name
            target.parent.mkdir(parents=True, exist_ok=True)
            out = open(target, "wb")  # noqa: SIM115 - closed below
        while chunk := fh.read(CHUNK):
            digest.update(chunk)
            size += len(chunk)
            if keep:
                kept.append(chunk)
            if out is not None:
                out.write(chunk)
    except OSError as exc:  # e.g. a member named like a folder another one needs
        raise KbfuseError(f"bundle member {name!r} cannot be extracted: {exc}") from None
    finally:
        if out is not None:
            out.close()
    return {"sha256": digest.hexdigest(), "bytes": size}, b"".join(kept)


def read_bundle(
    path: str | os.PathLike,
    extract_to: str | os.PathLike | None = None,
    limits: Limits = DEFAULT_LIMITS,
) -> BundleContents:
    """One bounded pass over a bundle (see the module docstring for what is refused).

    With extract_to, the first copy of every member under kbfuse-bundle/results/ is written
    there (as results/<path>); nothing else is ever written.
    """
    path = Path(path)
    sink = Path(extract_to) if extract_to is not None else None
    found = BundleContents()
    total = count = 0
    try:
        with open(path, "rb") as raw:
            stream = _GunzipStream(raw, str(path), limits.stream_bytes)
            # the header class carries this call's limit (tarfile takes a class, not a value)
            tarinfo = type("_Limited", (_CheckedTarInfo,), {"header_limit": limits.header_bytes})
            with tarfile.open(fileobj=stream, mode="r|", tarinfo=tarinfo) as tar:
                for member in tar:
                    count += 1
                    if count > limits.members:
                        raise KbfuseError(f"bundle {path} has more than {limits.members} members")
                    name = _member_name(member)
                    if member.isdir():
                        continue
                    total += member.size
                    if member.size > limits.member_bytes or total > limits.total_bytes:
                        raise KbfuseError(
                            f"bundle member {name!r} declares {member.size} bytes (bundle total "
                            f"so far {total}); limits are {limits.member_bytes} per member and "
                            f"{limits.total_bytes} in all; refusing the bundle"
                        )
                    if name in found.records:
                        found.duplicates.add(name)
                        continue
                    keep = name in KEPT_MEMBERS and member.size <= MAX_RECORD_BYTES
                    dest = sink if sink is not None and name.startswith(RESULTS_PREFIX) else None
                    found.records[name], data = _copy_member(tar, member, name, dest, keep)
                    if keep:
                        found.kept[name] = data
                end = tar.offset
            _check_end(stream, end, path)
    except (tarfile.TarError, EOFError, zlib.error, RecursionError) as exc:
        raise KbfuseError(f"bundle {path} is not a readable .tar.gz: {exc}") from None
    except OSError as exc:
        if not path.is_file():
            raise KbfuseError(f"bundle {path} is not a readable .tar.gz: {exc}") from None
        raise
    found.sha256 = stream.raw_sha256.hexdigest()
    return found


def _check_end(stream: _GunzipStream, end: int, path: Path) -> None:
    """After the last member at `end`: two zero blocks, at most a record of zero padding, the
    end of the gzip stream, the end of the file; nothing else."""
    stream.cap_at(end + 2 * BLOCK + tarfile.RECORDSIZE)
    with contextlib.suppress(KbfuseError):  # over the cap: name trailing data first
        stream.drain()
    if stream.last_nonzero >= end:
        raise KbfuseError(f"bundle {path} has data after the tar end-of-archive; refusing it")
    stream.drain()  # raises again what the first drain met (long padding, gzip trailing data)
    if stream.position < end + 2 * BLOCK:
        raise KbfuseError(f"bundle {path} has no tar end-of-archive (cut short?); refusing it")


def _report(path: Path, found: BundleContents) -> tuple[dict[str, Any], dict]:
    if MANIFEST_MEMBER not in found.records:
        raise KbfuseError(f"bundle {path} has no {MANIFEST_MEMBER}; not a kbfuse bundle")
    if MANIFEST_MEMBER not in found.kept:
        raise KbfuseError(f"bundle {path}: {MANIFEST_MEMBER} is over {MAX_RECORD_BYTES} bytes")
    manifest, problems = manifest_from_bytes(found.kept[MANIFEST_MEMBER], MANIFEST_MEMBER)
    actual = {
        name[len(RESULTS_PREFIX) :]: rec
        for name, rec in found.records.items()
        if name.startswith(RESULTS_PREFIX)
    }
    quoted = {
        rel: found.kept.get(RESULTS_PREFIX + rel) for rel in (FINGERPRINT, PIN) if rel in actual
    }
    report = compare_with_manifest(manifest, problems, actual, quoted)
    outside = [
        n for n in found.records if n != MANIFEST_MEMBER and not n.startswith(RESULTS_PREFIX)
    ]
    report.update(
        bundle=str(path),
        bundle_sha256=found.sha256,
        changed=[{**c, "path": RESULTS_PREFIX + c["path"]} for c in report["changed"]],
        missing=[RESULTS_PREFIX + m for m in report["missing"]],
        extra=sorted([RESULTS_PREFIX + e for e in report["extra"]] + outside),
        duplicates=sorted(found.duplicates),
    )
    report["ok"] = not any(
        report[k] for k in ("changed", "missing", "extra", "duplicates", "manifest_problems")
    )
    return report, manifest


def verify_bundle(path: str | os.PathLike, limits: Limits = DEFAULT_LIMITS) -> dict[str, Any]:
    """Verify a bundle against the manifest inside it, writing nothing; the report says what
    is wrong. KbfuseError when it is not a kbfuse bundle or breaks a limit."""
    path = Path(path)
    report, _ = _report(path, read_bundle(path, limits=limits))
    return report


@contextlib.contextmanager
def open_bundle(
    path: str | os.PathLike, workdir: str | os.PathLike | None = None
) -> Iterator[tuple[dict[str, Any], Path, dict]]:
    """Verify a bundle and extract its results into a fresh directory under workdir (the
    system's temporary directory when None); yield (report, results dir, manifest) while
    extracted, remove them afterwards."""
    path = Path(path)
    with tempfile.TemporaryDirectory(prefix="kbfuse-bundle-", dir=workdir) as tmp:
        dest = Path(tmp)
        report, manifest = _report(path, read_bundle(path, extract_to=dest))
        yield report, dest / RESULTS_PREFIX, manifest


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
        found = (
            f"sha256 {c['actual_sha256']} ({c['actual_bytes']} bytes)"
            if "not_hashed" not in c
            else f"not hashed: {c['not_hashed']} ({c['actual_bytes']} bytes)"
        )
        lines.append(
            f"  CHANGED {c['path']}: {found}, "
            f"manifest says {c['expected_sha256']} ({c['expected_bytes']} bytes)"
        )
    lines += [f"  MISSING {m}" for m in report["missing"]]
    lines += [f"  EXTRA {e}" for e in report["extra"]]
    lines += [f"  DUPLICATE member {d}" for d in report.get("duplicates", [])]
    lines += [f"  MANIFEST {p}" for p in report["manifest_problems"]]
    lines.append("  OK: every file matches the manifest" if report["ok"] else "  FAILED")
    return "\n".join(lines) + "\n"
