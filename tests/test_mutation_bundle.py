"""Tests written for mutants of the rewritten bundle.py and manifest.py that survived the run
of docs/mutation.md: members larger than one read chunk (counted and kept whole), the limits
a caller passes to verify_bundle, an oversized manifest named, and comparison that reads on
past an unsafe path and a file that is not quoted.
"""

from __future__ import annotations

import gzip
import io
import re
import tarfile
import zlib
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


# --- survivors of the run of 2026-12-01 ----------------------------------------------------------


def _raw_member(name: str, data: bytes) -> bytes:
    """One ustar header and its data padded to whole blocks."""
    info = tarfile.TarInfo(name)
    info.size = len(data)
    padding = -len(data) % tarfile.BLOCKSIZE
    return info.tobuf(format=tarfile.USTAR_FORMAT) + data + b"\0" * padding


def _gz(tmp_path: Path, raw: bytes) -> Path:
    out = tmp_path / "b.tar.gz"
    out.write_bytes(gzip.compress(raw, mtime=0))
    return out


# one member ending 512 bytes before a tar record: its end-of-archive runs into the next record
END = tarfile.BLOCKSIZE + 18 * tarfile.BLOCKSIZE
MEMBER = _raw_member(RESULTS_PREFIX + "x", b"x" * 18 * tarfile.BLOCKSIZE)


def test_end_of_archive_and_record_padding_past_a_record_boundary_are_accepted(tmp_path):
    assert len(MEMBER) == END == tarfile.RECORDSIZE - tarfile.BLOCKSIZE
    out = _gz(tmp_path, MEMBER + b"\0" * (2 * tarfile.RECORDSIZE - END))
    assert list(bundle_module.read_bundle(out).records) == [RESULTS_PREFIX + "x"]


def test_padding_past_two_zero_blocks_and_a_record_is_refused(tmp_path):
    allowed = END + 2 * tarfile.BLOCKSIZE + tarfile.RECORDSIZE
    out = _gz(tmp_path, MEMBER + b"\0" * (allowed + 1000 - END))
    message = f"bundle {out} decompresses to more than {allowed} bytes; refusing it"
    with pytest.raises(KbfuseError, match=f"^{re.escape(message)}$"):
        bundle_module.read_bundle(out)


def test_a_non_zero_byte_right_after_the_last_member_is_refused(tmp_path):
    out = _gz(tmp_path, MEMBER + b"\1" + b"\0" * (2 * tarfile.RECORDSIZE - END - 1))
    message = f"bundle {out} has data after the tar end-of-archive; refusing it"
    with pytest.raises(KbfuseError, match=f"^{re.escape(message)}$"):
        bundle_module.read_bundle(out)


def test_a_single_zero_block_is_no_end_of_archive(tmp_path):
    out = _gz(tmp_path, MEMBER + b"\0" * tarfile.BLOCKSIZE)
    message = f"bundle {out} has no tar end-of-archive (cut short?); refusing it"
    with pytest.raises(KbfuseError, match=f"^{re.escape(message)}$"):
        bundle_module.read_bundle(out)


def test_a_global_pax_header_is_refused(tmp_path):
    out = tmp_path / "b.tar.gz"
    with tarfile.open(out, "w:gz", format=tarfile.PAX_FORMAT, pax_headers={"c": "1"}) as tar:
        tar.addfile(tarfile.TarInfo(MANIFEST_MEMBER), io.BytesIO(b""))
    with pytest.raises(KbfuseError, match="^bundle has a global pax header; refusing it$"):
        verify_bundle(out)


def test_a_pax_header_is_accepted_up_to_its_limit_exactly(tmp_path):
    out = tmp_path / "b.tar.gz"
    name = RESULTS_PREFIX + "a" * 200  # over ustar's 100 characters: the name goes in a pax header
    with tarfile.open(out, "w:gz", format=tarfile.PAX_FORMAT) as tar:
        tar.addfile(tarfile.TarInfo(name), io.BytesIO(b""))
    size = len(f" path={name}\n") + 3  # the record's own length, 3 digits
    assert list(bundle_module.read_bundle(out, limits=Limits(header_bytes=size)).records) == [name]
    message = (
        f"bundle has a {size}-byte extended header, over the {size - 1}-byte limit; refusing it"
    )
    with pytest.raises(KbfuseError, match=f"^{re.escape(message)}$"):
        verify_bundle(out, Limits(header_bytes=size - 1))


def test_a_zlib_stream_is_not_a_tar_gz(tmp_path):
    out = tmp_path / "b.tar.gz"
    out.write_bytes(zlib.compress(MEMBER + b"\0" * (2 * tarfile.RECORDSIZE - END)))
    message = f"bundle {out} is not a readable .tar.gz: Error -3 while decompressing data: "
    with pytest.raises(KbfuseError, match=f"^{re.escape(message)}"):
        bundle_module.read_bundle(out)


class _SpyFile(io.BytesIO):
    def __init__(self, data: bytes):
        super().__init__(data)
        self.sizes: list = []

    def read(self, size=-1):
        self.sizes.append(size)
        return super().read(size)


def test_member_data_is_read_in_chunks_never_whole():
    data = b"y" * (2 * CHUNK + 1)
    spy = _SpyFile(data)

    class Tar:
        def extractfile(self, member):
            return spy

    record, kept = bundle_module._copy_member(Tar(), None, "x", None, keep=True)
    assert record == {"sha256": sha256_bytes(data), "bytes": len(data)}
    assert kept == data
    assert spy.sizes == [CHUNK] * 4


def test_the_gunzip_stream_is_readable():
    assert bundle_module._GunzipStream(io.BytesIO(), "b", 0).readable() is True


def _one_member_bundle(tmp_path: Path, name: str) -> Path:
    out = tmp_path / "n.tar.gz"
    with tarfile.open(out, "w:gz", format=tarfile.PAX_FORMAT) as tar:
        tar.addfile(tarfile.TarInfo(name), io.BytesIO(b""))
    return out


def test_member_names_up_to_1024_characters_with_spaces_are_accepted(tmp_path):
    name = RESULTS_PREFIX + "a b" + "c" * (1024 - len(RESULTS_PREFIX) - 3)
    assert len(name) == 1024
    out = _one_member_bundle(tmp_path, name)
    assert list(bundle_module.read_bundle(out).records) == [name]
    longer = _one_member_bundle(tmp_path, name + "d")
    message = f"bundle member {name + 'd'!r} has an unsafe path; refusing to extract"
    with pytest.raises(KbfuseError, match=f"^{re.escape(message)}$"):
        bundle_module.read_bundle(longer)


def test_the_gunzip_stream_reads_and_inflates_in_bounded_steps():
    step = bundle_module._GunzipStream.STEP
    raw = _SpyFile(gzip.compress(b"\0" * (3 * step), mtime=0))
    stream = bundle_module._GunzipStream(raw, "b", 10 * step)
    pieces = [len(stream._decompress()) for _ in range(3)]
    assert pieces == [step, step, step]
    assert stream._decompress() == b""
    assert raw.sizes == [step, 1]  # one step of the small file, then one byte past its end
