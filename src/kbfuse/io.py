"""Atomic, deterministic file writing and hashing shared by every stage."""

from __future__ import annotations

import hashlib
import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any

from kbfuse.errors import KbfuseError
from kbfuse.faults import checkpoint

NONFINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


def jsonable(obj: Any) -> Any:
    """Convert to plain JSON types; non-finite floats become "nan"/"inf"/"-inf"."""
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [jsonable(v) for v in obj]
    if isinstance(obj, Path):
        return str(obj)
    if hasattr(obj, "item") and callable(obj.item) and getattr(obj, "ndim", 0) == 0:
        obj = obj.item()  # numpy / torch scalars
    if isinstance(obj, float):
        if math.isnan(obj):
            return "nan"
        if math.isinf(obj):
            return "inf" if obj > 0 else "-inf"
    return obj


def as_float(value: Any) -> float:
    """Inverse of `jsonable` for one float field."""
    if isinstance(value, str):
        return NONFINITE[value]
    return float(value)


def number_field(value: Any, where: str) -> float:
    """`as_float` of a field read from a record, or KbfuseError naming `where` when it is not a
    number (a boolean is not a number here, though Python's float() takes it)."""
    try:
        if isinstance(value, bool):
            raise TypeError
        return as_float(value)
    except (KeyError, TypeError, ValueError):
        raise KbfuseError(f"{where} is not a number: {value!r}") from None


def _atomic_write(path: str | os.PathLike, data: bytes) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        checkpoint("write", str(path))  # the temp file is complete, the target not yet there
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_bytes(path: str | os.PathLike, data: bytes) -> None:
    _atomic_write(path, data)


def write_text(path: str | os.PathLike, text: str) -> None:
    _atomic_write(path, text.encode())


def dumps_json(obj: Any) -> str:
    return json.dumps(jsonable(obj), indent=2, sort_keys=True, allow_nan=False) + "\n"


def write_json(path: str | os.PathLike, obj: Any) -> None:
    write_text(path, dumps_json(obj))


def copy_files(root: str | os.PathLike, rels: list[str], out: str | os.PathLike) -> None:
    """Copy the files `rels` (paths relative to `root`) under `out` at the same relative
    paths, `out` emptied first (a reference folder made anew)."""
    import shutil

    out = Path(out)
    if out.exists():
        shutil.rmtree(out)
    for rel in rels:
        target = out / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(Path(root) / rel, target)


def read_json(path: str | os.PathLike) -> Any:
    with open(path) as fh:
        return json.load(fh)


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()
