"""Reading a file that untrusted code or another machine could have made, within bounds.

A candidate's scratch folder, a results folder handed over for verification, a folder of
candidate files scanned at every Snakemake start: each may hold a FIFO (an `open` that blocks
for ever), a device or a symbolic link to one (`/dev/zero` reads without end), a sparse file
of many GiB, or JSON nested deeply enough to exhaust Python's stack. So every such read here

- looks at the file first (`os.lstat`, or `os.stat` where a link to a regular file is
  allowed) and takes regular files only;
- refuses a file over its caller's byte limit before reading a byte, opens it with
  O_NONBLOCK (and O_NOFOLLOW unless links are allowed), checks the opened file again
  (`fstat`: what was checked is what is read) and reads at most limit + 1 bytes;
- parses JSON strictly: UTF-8, no NaN/Infinity literals, no key given twice in one object
  (Python keeps the last one silently), at most MAX_JSON_DEPTH levels of nesting (checked
  without recursion, before recursive code such as a schema validator walks it: 600 levels
  are within what the parser takes, but not what jsonschema's validator does).

Every refusal is a KbfuseError naming the file and the reason.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

from kbfuse.errors import KbfuseError

MAX_JSON_DEPTH = 64  # kbfuse's records nest about 8 levels; a config about 6
_CHUNK = 1 << 20
_KINDS = (
    (stat.S_ISLNK, "a symbolic link"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISDIR, "a folder"),
)


def kind_of(mode: int) -> str:
    """What a file of this st_mode is, in words ("a regular file", "a FIFO", ...)."""
    for test, name in _KINDS:
        if test(mode):
            return name
    return "a regular file" if stat.S_ISREG(mode) else "a special file"


def regular_file(path: str | os.PathLike, *, follow: bool = False) -> os.stat_result:
    """The file's stat; KbfuseError unless it is a regular file (a symbolic link is refused,
    or with `follow` taken for what it points to)."""
    try:
        st = os.stat(path) if follow else os.lstat(path)
    except OSError as exc:
        raise KbfuseError(f"{path} cannot be read: {exc.strerror}") from None
    if not stat.S_ISREG(st.st_mode):
        raise KbfuseError(f"{path} is {kind_of(st.st_mode)}, not a regular file; not read")
    return st


def no_link_below(root: str | os.PathLike, path: str | os.PathLike) -> None:
    """KbfuseError unless `path` lies inside `root` and no folder between them is a symbolic
    link (O_NOFOLLOW guards only the last component: a linked folder could lead anywhere)."""
    root, path = Path(root), Path(path)
    try:
        parts = path.relative_to(root).parts
    except ValueError:
        raise KbfuseError(f"{path} is not inside {root}; not read") from None
    if ".." in parts:
        raise KbfuseError(f"{path} climbs out of {root}; not read")
    here = root
    for part in parts[:-1]:
        here = here / part
        try:
            mode = os.lstat(here).st_mode
        except OSError as exc:
            raise KbfuseError(f"{path} cannot be read: {here}: {exc.strerror}") from None
        if not stat.S_ISDIR(mode):
            raise KbfuseError(f"{path}: {here} is {kind_of(mode)}, not a folder; not read")


def _open_regular(path: str | os.PathLike, follow: bool) -> int:
    """A descriptor of `path` opened without blocking (a FIFO swapped in after the check
    cannot hang the open), refused unless it is still a regular file."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        raise KbfuseError(f"{path} cannot be read: {exc.strerror}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise KbfuseError(f"{path} changed into a special file while it was read; not read")
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_bytes(
    path: str | os.PathLike, limit: int, *, follow: bool = False, within: Path | None = None
) -> bytes:
    """The bytes of a regular file of at most `limit` bytes (see the module docstring);
    `within`: the file must lie in that folder with no linked folder on the way."""
    fd = open_bounded(path, limit, follow=follow, within=within)
    try:
        chunks, size = [], 0
        while size <= limit:
            chunk = os.read(fd, min(_CHUNK, limit + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    finally:
        os.close(fd)
    if size > limit:
        raise KbfuseError(f"{path} grew over the {limit}-byte limit while it was read; not read")
    return b"".join(chunks)


def open_bounded(
    path: str | os.PathLike, limit: int, *, follow: bool = False, within: Path | None = None
) -> int:
    """A read-only descriptor of a regular file of at most `limit` bytes, checked as
    `read_bytes` checks it before reading (the caller closes it)."""
    if within is not None:
        no_link_below(within, path)
    st = regular_file(path, follow=follow)
    if st.st_size > limit:
        raise KbfuseError(f"{path} is {st.st_size} bytes, over the {limit}-byte limit")
    return _open_regular(path, follow)


def read_head(path: str | os.PathLike, size: int, *, follow: bool = False) -> bytes:
    """At most the first `size` bytes of a regular file (see the module docstring)."""
    regular_file(path, follow=follow)
    fd = _open_regular(path, follow)
    try:
        return os.read(fd, size)
    finally:
        os.close(fd)


def read_tail(path: str | os.PathLike, limit: int) -> bytes:
    """The last `limit` bytes of a regular file (b"" when it is missing or not regular)."""
    try:
        regular_file(path)
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except (KbfuseError, OSError):
        return b""
    try:
        size = os.fstat(fd).st_size
        os.lseek(fd, max(0, size - limit), os.SEEK_SET)
        return os.read(fd, limit)
    finally:
        os.close(fd)


def _refuse_constant(name: str) -> float:
    raise ValueError(f"{name} is not JSON (kbfuse writes non-finite floats as strings)")


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"key {key[:80]!r} is given twice in one object")
        out[key] = value
    return out


def too_deep(value: Any, limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether parsed JSON nests arrays and objects more than `limit` levels deep (walked
    with a stack of its own, never by recursion)."""
    if not isinstance(value, dict | list):
        return False
    pending = [(value, 1)]
    while pending:
        node, depth = pending.pop()
        if depth > limit:
            return True
        children = node.values() if isinstance(node, dict) else node
        pending += [(child, depth + 1) for child in children if isinstance(child, dict | list)]
    return False


def parse_json(raw: bytes, label: str, limit: int) -> Any:
    """Strict JSON of at most `limit` bytes (see the module docstring)."""
    if len(raw) > limit:
        raise KbfuseError(f"{label} is {len(raw)} bytes, over the {limit}-byte limit")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise KbfuseError(f"{label} is not valid JSON: {exc}") from None
    try:
        data = json.loads(text, parse_constant=_refuse_constant, object_pairs_hook=_unique_keys)
    except (ValueError, RecursionError) as exc:
        raise KbfuseError(f"{label} is not valid JSON: {exc}") from None
    if too_deep(data):
        raise KbfuseError(f"{label} nests arrays and objects more than {MAX_JSON_DEPTH} deep")
    return data


def read_json(
    path: str | os.PathLike, limit: int, *, follow: bool = False, within: Path | None = None
) -> Any:
    """A regular JSON file of at most `limit` bytes, parsed strictly (`within`: as read_bytes)."""
    raw = read_bytes(path, limit, follow=follow, within=within)
    return parse_json(raw, str(Path(path)), limit)
