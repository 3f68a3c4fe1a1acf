"""Tests written for mutants of the rewritten bundle.py and manifest.py that survived the run
of docs/mutation.md: members larger than one read chunk (counted and kept whole), the limits
a caller passes to verify_bundle, an oversized manifest named, and comparison that reads on
past an unsafe path and a file that is not quoted.
"""

from __future__ import annotations

import io
import re
import tarfile
from pathlib import Path

import pytest

from kbfuse.errors import KbfuseError
from kbfuse.io import sha256_bytes
from kbfuse.results import bundle as bundle_module
from kbfuse.results.bundle import CHUNK, MANIFEST_MEMBER, RESULTS_PREFIX, Limits, verify_bundle
from kbfuse.results.manifest import FINGERPRINT, PIN, compare_with_manifest


def _tar(out: Path, members: list[tuple[str, bytes]]) -> Path:
    with tarfile.open(out, "w:gz") as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out


def test_a_member_over_one_chunk_is_counted_and_kept_whole(tmp_path):
    big = bytes(range(256)) * (CHUNK // 256) + b"tail"
    out = _tar(tmp_path / "b.tar.gz", [(MANIFEST_MEMBER, big), (RESULTS_PREFIX + "x", big)])
    found = bundle_module.read_bundle(out)
    record = {"sha256": sha256_bytes(big), "bytes": CHUNK + 4}
    assert found.records == {MANIFEST_MEMBER: record, RESULTS_PREFIX + "x": record}
    assert found.kept == {MANIFEST_MEMBER: big}


def test_verify_bundle_applies_the_callers_limits(tmp_path):
    out = _tar(tmp_path / "b.tar.gz", [(MANIFEST_MEMBER, b"{}"), (RESULTS_PREFIX + "x", b"1")])
    with pytest.raises(
        KbfuseError, match=rf"^bundle {re.escape(str(out))} has more than 1 members$"
    ):
        verify_bundle(out, Limits(members=1))


def test_an_oversized_manifest_is_named(tmp_path, monkeypatch):
    monkeypatch.setattr(bundle_module, "MAX_RECORD_BYTES", 8)
    out = _tar(tmp_path / "b.tar.gz", [(MANIFEST_MEMBER, b"{" + b" " * 10 + b"}")])
    message = f"bundle {out}: {MANIFEST_MEMBER} is over 8 bytes"
    with pytest.raises(KbfuseError, match=f"^{re.escape(message)}$"):
        verify_bundle(out)


def _manifest(files: dict) -> dict:
    return {"files": files, "fingerprint": {"gpu": "a"}, "kernelbench_pin": {"commit": "b"}}


def test_compare_reads_on_after_an_unsafe_path():
    record = {"sha256": "0" * 64, "bytes": 1}
    data = _manifest({"../escape.json": record, "timing/81.json": record, "zz/a.json": record})
    report = compare_with_manifest(data, [], {"timing/81.json": record}, {})
    assert report["manifest_problems"] == ["manifest lists an unsafe path '../escape.json'"]
    assert report["missing"] == ["zz/a.json"]


def test_compare_checks_the_pin_when_the_fingerprint_is_not_quoted():
    record = {"sha256": "0" * 64, "bytes": 1}
    data = _manifest({PIN: record})
    quoted = {FINGERPRINT: None, PIN: b'{"commit": "c"}'}
    report = compare_with_manifest(data, [], {PIN: record}, quoted)
    assert report["manifest_problems"] == [f"manifest field kernelbench_pin differs from {PIN}"]
