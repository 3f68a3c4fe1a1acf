"""A rebuilt summary against a committed one (the reference tests of both studies)."""

from __future__ import annotations

import struct
from pathlib import Path


def png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def assert_same_summary(committed_dir: Path, outdir: Path) -> None:
    """Tables byte for byte; plots the same size (their bytes depend on matplotlib)."""
    committed = {p.name: p.read_bytes() for p in committed_dir.iterdir()}
    written = {p.name: p.read_bytes() for p in outdir.iterdir()}
    assert sorted(written) == sorted(committed)
    for name, data in committed.items():
        if name.endswith(".png"):
            assert png_size(written[name]) == png_size(data), name
        else:
            assert written[name] == data, f"{name} differs from the committed table"
