"""What the parent of a check reads back from its children's folders, within bounds.

Every file a child leaves was made by code the parent does not trust (the candidate's above
all; the reference runs the task's own code). The parent reads it only after every process
of that child is gone (kbfuse.candidates.sandbox), and only through kbfuse.untrusted: regular
files inside the child's folder with no symbolic link on the way (a link, to a file or to a
folder, could point at the reference's outputs next door: the candidate knows its own path),
no FIFO or device, each under a byte limit checked before reading; JSON strictly (no key
given twice, bounded nesting).

Tensor files are torch.save archives, read with `torch.load(weights_only=True)` only after
the archive itself is checked (`check_archive`): a zip whose members are all stored
uncompressed (torch.save never compresses; a deflated member of 3 MB can declare GiBs), with
declared sizes that add up to at most the file's limit, at most MAX_MEMBERS members, and a
pickle of at most PICKLE_BYTES (a tensor's takes a few hundred bytes; a large one could
build millions of Python objects from a small file). The checked file is mapped into memory
(`mmap=True`, through the descriptor that was checked: /proc/self/fd), not copied: a case of
GiBs is then read once, by whatever reads its values, instead of three times (into bytes,
into one buffer, into the tensor); no process is left that could change it, and torch
refuses a storage that reaches past the file's end.
"""

from __future__ import annotations

import io
import os
import zipfile
from pathlib import Path
from typing import Any, BinaryIO

from kbfuse import untrusted
from kbfuse.errors import KbfuseError

JSON_BYTES = 16 << 20
MAX_MEMBERS = 4096
PICKLE_BYTES = 1 << 20


def read_json(path: Path, folder: Path, limit: int = JSON_BYTES) -> Any:
    """A JSON file a child left in its `folder` (KbfuseError naming the problem; a missing
    file included)."""
    return untrusted.read_json(path, limit, within=folder)


def read_json_or_none(path: Path, folder: Path, limit: int = JSON_BYTES) -> tuple[Any, str | None]:
    """(data, None), or (None, why) when the file is missing or refused."""
    if not os.path.lexists(path):
        return None, f"{path.name} was not written"
    try:
        return read_json(path, folder, limit), None
    except KbfuseError as exc:
        return None, str(exc)


def check_archive(raw: bytes | BinaryIO, label: str, limit: int) -> None:
    """KbfuseError unless `raw` (its bytes, or a file open for reading) is a torch.save
    archive within the limits of the docstring."""
    try:
        archive = zipfile.ZipFile(io.BytesIO(raw) if isinstance(raw, bytes) else raw)
        members = archive.infolist()
    except (zipfile.BadZipFile, ValueError, OSError) as exc:
        raise KbfuseError(f"{label} is not a torch.save archive: {exc}") from None
    if len(members) > MAX_MEMBERS:
        raise KbfuseError(f"{label} has {len(members)} members, over {MAX_MEMBERS}")
    declared = 0
    for member in members:
        if member.compress_type != zipfile.ZIP_STORED or member.compress_size != member.file_size:
            raise KbfuseError(
                f"{label}: member {member.filename[:80]!r} is compressed ({member.file_size} "
                "bytes declared); torch.save stores members uncompressed"
            )
        if member.filename.endswith(".pkl") and member.file_size > PICKLE_BYTES:
            raise KbfuseError(
                f"{label}: its pickle declares {member.file_size} bytes, over {PICKLE_BYTES}"
            )
        declared += member.file_size
    if declared > limit:
        raise KbfuseError(f"{label}: its members declare {declared} bytes, over {limit}")


def load_tensors(path: Path, folder: Path, limit: int) -> Any:
    """A tensor file a child left in its `folder`: a regular file of at most `limit` bytes,
    no linked folder on the way, whose archive passes `check_archive`, mapped (module
    docstring) and loaded with weights_only=True on the CPU."""
    import torch

    fd = untrusted.open_bounded(path, limit, within=folder)
    try:
        with os.fdopen(os.dup(fd), "rb") as handle:
            check_archive(handle, str(path), limit)
        try:
            return torch.load(
                f"/proc/self/fd/{fd}", mmap=True, weights_only=True, map_location="cpu"
            )
        except Exception as exc:  # noqa: BLE001 - whatever torch says of a bad archive
            first = (str(exc).strip().splitlines() or [""])[0][:200]
            raise KbfuseError(f"{path} cannot be loaded: {type(exc).__name__}: {first}") from None
    finally:
        os.close(fd)
