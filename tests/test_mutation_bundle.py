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


# --- read_bundle, pack, the gunzip stream: limits at their boundary, messages word for word ---


def test_pack_writes_sorted_members_with_fixed_owner_mode_and_time():
    data = bundle_module.pack({"b/2": b"22", "a/1": b"1", "c": b""})
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        members = tar.getmembers()
        contents = [tar.extractfile(m).read() for m in members]
    assert [m.name for m in members] == ["a/1", "b/2", "c"]
    assert contents == [b"1", b"22", b""]
    for m in members:
        fields = (m.size, m.mtime, m.mode, m.uid, m.gid, m.uname, m.gname, m.type)
        assert fields == (len(contents[members.index(m)]), 0, 0o644, 0, 0, "", "", tarfile.REGTYPE)
    assert data == bundle_module.pack({"c": b"", "b/2": b"22", "a/1": b"1"})


def test_tarinfo_fields_are_fixed():
    info = bundle_module._tarinfo("x/y", 7)
    assert (info.name, info.size, info.mtime, info.mode) == ("x/y", 7, 0, 0o644)
    assert (info.uid, info.gid, info.uname, info.gname, info.type) == (0, 0, "", "", b"0")


def _members(tmp_path: Path, members, name="m.tar.gz") -> Path:
    out = tmp_path / name
    out.write_bytes(bundle_module.pack(dict(members)))
    return out


def test_the_member_limit_admits_exactly_that_many(tmp_path):
    out = _members(tmp_path, [(RESULTS_PREFIX + "a", b"1"), (RESULTS_PREFIX + "b", b"2")])
    assert len(bundle_module.read_bundle(out, limits=Limits(members=2)).records) == 2
    with pytest.raises(
        KbfuseError, match=f"^bundle {re.escape(str(out))} has more than 1 members$"
    ):
        bundle_module.read_bundle(out, limits=Limits(members=1))


def test_member_and_total_sizes_are_limited_at_their_boundary(tmp_path):
    a, b = RESULTS_PREFIX + "a", RESULTS_PREFIX + "b"
    out = _members(tmp_path, [(a, b"1234"), (b, b"567")])
    fits = Limits(member_bytes=4, total_bytes=7)
    assert bundle_module.read_bundle(out, limits=fits).records[b]["bytes"] == 3
    message = (
        f"bundle member {a!r} declares 4 bytes (bundle total so far 4); limits are 3 per member "
        "and 7 in all; refusing the bundle"
    )
    with pytest.raises(KbfuseError, match=f"^{re.escape(message)}$"):
        bundle_module.read_bundle(out, limits=Limits(member_bytes=3, total_bytes=7))
    message = (
        f"bundle member {b!r} declares 3 bytes (bundle total so far 7); limits are 4 per member "
        "and 6 in all; refusing the bundle"
    )
    with pytest.raises(KbfuseError, match=f"^{re.escape(message)}$"):
        bundle_module.read_bundle(out, limits=Limits(member_bytes=4, total_bytes=6))


def test_folders_count_as_members_but_not_as_bytes(tmp_path):
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        folder = tarfile.TarInfo(RESULTS_PREFIX + "d")
        folder.type, folder.size = tarfile.DIRTYPE, 0
        tar.addfile(folder)
        tar.addfile(bundle_module._tarinfo(RESULTS_PREFIX + "d/x", 2), io.BytesIO(b"xy"))
    out = _gz(tmp_path, raw.getvalue())
    found = bundle_module.read_bundle(out, limits=Limits(members=2, total_bytes=2))
    assert list(found.records) == [RESULTS_PREFIX + "d/x"]
    with pytest.raises(KbfuseError, match=r"has more than 1 members$"):
        bundle_module.read_bundle(out, limits=Limits(members=1))


def test_a_duplicate_keeps_its_first_copy_and_is_named(tmp_path):
    raw = io.BytesIO()
    name = RESULTS_PREFIX + FINGERPRINT
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for data in (b"first", b"second!"):
            tar.addfile(bundle_module._tarinfo(name, len(data)), io.BytesIO(data))
    found = bundle_module.read_bundle(_gz(tmp_path, raw.getvalue()))
    assert found.records == {name: {"sha256": sha256_bytes(b"first"), "bytes": 5}}
    assert found.duplicates == {name}
    assert found.kept == {name: b"first"}


def test_only_the_quoted_members_within_the_record_limit_are_kept(tmp_path, monkeypatch):
    monkeypatch.setattr(bundle_module, "MAX_RECORD_BYTES", 4)
    members = {
        MANIFEST_MEMBER: b"1234",
        RESULTS_PREFIX + FINGERPRINT: b"12345",
        RESULTS_PREFIX + PIN: b"",
        RESULTS_PREFIX + "other.json": b"1",
    }
    found = bundle_module.read_bundle(_members(tmp_path, members.items()))
    assert found.kept == {MANIFEST_MEMBER: b"1234", RESULTS_PREFIX + PIN: b""}
    assert set(found.records) == set(members)


def test_only_results_are_extracted_and_the_raw_file_is_hashed(tmp_path):
    members = {MANIFEST_MEMBER: b"{}", RESULTS_PREFIX + "t/1.json": b"one", "kbfuse-bundle/x": b"2"}
    out = _members(tmp_path, members.items())
    sink = tmp_path / "sink"
    found = bundle_module.read_bundle(str(out), extract_to=str(sink))
    written = sorted(p.relative_to(sink).as_posix() for p in sink.rglob("*") if p.is_file())
    assert written == [RESULTS_PREFIX + "t/1.json"]
    assert (sink / RESULTS_PREFIX / "t/1.json").read_bytes() == b"one"
    assert found.sha256 == sha256_bytes(out.read_bytes())
    assert bundle_module.read_bundle(out).sha256 == found.sha256


def test_a_bundle_that_is_missing_or_a_folder_is_named(tmp_path):
    missing = tmp_path / "none.tar.gz"
    message = f"bundle {missing} is not a readable .tar.gz: [Errno 2] No such file or directory"
    with pytest.raises(KbfuseError, match=f"^{re.escape(message)}"):
        bundle_module.read_bundle(missing)
    message = f"bundle {tmp_path} is not a readable .tar.gz: [Errno 21] Is a directory"
    with pytest.raises(KbfuseError, match=f"^{re.escape(message)}"):
        bundle_module.read_bundle(tmp_path)


def test_a_cut_tar_inside_a_whole_gzip_stream_is_named(tmp_path):
    out = _gz(tmp_path, MEMBER[: tarfile.BLOCKSIZE + 10])
    with pytest.raises(KbfuseError, match=f"^bundle {re.escape(str(out))} is not a readable "):
        bundle_module.read_bundle(out)


def test_the_gunzip_stream_hands_out_pieces_counting_position_and_last_nonzero():
    raw = io.BytesIO(gzip.compress(b"ab\0\0cd\0\0\0", mtime=0))
    stream = bundle_module._GunzipStream(raw, "lbl", 9)
    assert (stream.position, stream.last_nonzero) == (0, -1)
    buffer = bytearray(4)
    assert stream.readinto(buffer) == 4
    assert (bytes(buffer), stream.position, stream.last_nonzero) == (b"ab\0\0", 4, 1)
    assert stream.readinto(buffer) == 4
    assert (bytes(buffer), stream.position, stream.last_nonzero) == (b"cd\0\0", 8, 5)
    assert stream.readinto(buffer) == 1
    assert (bytes(buffer[:1]), stream.position, stream.last_nonzero) == (b"\0", 9, 5)
    assert stream.readinto(buffer) == 0
    assert stream.raw_sha256.hexdigest() == sha256_bytes(raw.getvalue())


def test_the_gunzip_stream_refuses_one_byte_over_its_cap_naming_the_label():
    raw = io.BytesIO(gzip.compress(b"123456789", mtime=0))
    stream = bundle_module._GunzipStream(raw, "lbl", 8)
    assert stream.read(8) == b"12345678"
    message = "bundle lbl decompresses to more than 8 bytes; refusing it"
    with pytest.raises(KbfuseError, match=f"^{re.escape(message)}$"):
        stream.read(1)


def test_the_gunzip_stream_names_a_cut_stream_and_trailing_data():
    whole = gzip.compress(b"x" * 100, mtime=0)
    cut = bundle_module._GunzipStream(io.BytesIO(whole[:-4]), "lbl", 1000)
    with pytest.raises(KbfuseError, match=r"^bundle lbl: the gzip stream is cut short$"):
        cut.drain()
    trailing = bundle_module._GunzipStream(io.BytesIO(whole + b"\0"), "lbl", 1000)
    message = "bundle lbl has data after the gzip stream; refusing it"
    with pytest.raises(KbfuseError, match=f"^{re.escape(message)}$"):
        trailing.drain()


def test_only_zero_bytes_are_trailing_zeros():
    raw = io.BytesIO(gzip.compress(b"aXX\0", mtime=0))
    stream = bundle_module._GunzipStream(raw, "lbl", 9)
    assert stream.read(4) == b"aXX\0"
    assert (stream.position, stream.last_nonzero) == (4, 2)
