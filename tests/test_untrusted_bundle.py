"""A bundle from someone else: bombs, trailing data, paths from its manifest, limits.

Each bomb is a few MB of gzip that declares GiBs; it is read by `kbfuse verify-bundle` in a
child process whose peak resident memory is measured (`ru_maxrss`) and bounded. Run with
`-s` to print the figures docs/reliability.md quotes.
"""

from __future__ import annotations

import copy
import io
import json
import os
import struct
import subprocess
import sys
import tarfile
import time
import zlib
from pathlib import Path

import pytest
from test_bundle import members_of, repack, result_files
from test_summary import make_config, write_study

from kbfuse.errors import KbfuseError
from kbfuse.io import dumps_json
from kbfuse.results import summary
from kbfuse.results.bundle import (
    BUNDLE_ROOT,
    MANIFEST_MEMBER,
    RESULTS_PREFIX,
    Limits,
    make_bundle,
    open_bundle,
    read_bundle,
    verify_bundle,
)
from kbfuse.results.compare import COMPARISON_TABLES, compare_bundles
from kbfuse.results.manifest import build_manifest, content_sha256
from kbfuse.workflow import cli

REPO = Path(__file__).resolve().parents[1]
GIB = 1 << 30
MIB = 1 << 20
RSS_BOUND_MB = 100  # the interpreter and kbfuse's imports take about 25 MB of it


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    base = tmp_path_factory.mktemp("untrusted")
    config = make_config(variants=("cupy-default", "nvrtc-cubin-noftz"))
    root = base / "results"
    write_study(root, config)
    manifest = base / "manifest.json"
    build_manifest(root, result_files(root, config), config, manifest)
    return make_bundle(root, manifest, base / "good.tar.gz")


# ---------------------------------------------------------------- building bad archives


def _tar_bytes(members: dict[str, bytes]) -> bytes:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return raw.getvalue()


def gzip_bomb(prefix: bytes, zero_mib: int, suffix: bytes = b"") -> bytes:
    """A valid gzip stream of prefix + zero_mib MiB of zeros + suffix, made in milliseconds
    per GiB: one MiB of zeros is deflated once after a full flush and its bytes repeated."""
    c = zlib.compressobj(9, zlib.DEFLATED, -15)
    head = c.compress(prefix) + c.flush(zlib.Z_FULL_FLUSH)
    zeros = bytes(MIB)
    block = c.compress(zeros) + c.flush(zlib.Z_FULL_FLUSH)
    assert block == c.compress(zeros) + c.flush(zlib.Z_FULL_FLUSH)  # position-independent
    crc = zlib.crc32(prefix)
    for _ in range(2 * zero_mib):  # the block was compressed twice above: 2 MiB per repeat
        crc = zlib.crc32(zeros, crc)
    crc = zlib.crc32(suffix, crc)
    size = len(prefix) + 2 * zero_mib * MIB + len(suffix)
    body = head + block * (2 * zero_mib) + c.compress(suffix) + c.flush()
    header = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x02\xff"
    return header + body + struct.pack("<II", crc, size & 0xFFFFFFFF)


def _header(name: str, size: int, kind: bytes = tarfile.REGTYPE) -> bytes:
    info = tarfile.TarInfo(name)
    info.size, info.type = size, kind
    return info.tobuf(tarfile.USTAR_FORMAT)


def bombs(good: bytes) -> dict[str, bytes]:
    """name -> bundle bytes; each declares 3 GiB and holds 3 GiB of zeros."""
    half = 3 * 1024 // 2  # gzip_bomb writes 2 MiB per unit: 3 GiB
    tar = zlib.decompress(good, 31)
    end = len(tar.rstrip(b"\0"))
    end += -end % tarfile.BLOCKSIZE
    return {
        "member declaring 3 GiB": gzip_bomb(_header(f"{RESULTS_PREFIX}big.bin", 3 * GIB), half),
        "pax header declaring 3 GiB": gzip_bomb(_header("pax", 3 * GIB, tarfile.XHDTYPE), half),
        "GNU long name of 3 GiB": gzip_bomb(
            _header("././@LongLink", 3 * GIB, tarfile.GNUTYPE_LONGNAME), half
        ),
        "3 GiB of zeros after the end-of-archive": gzip_bomb(tar[:end], half),
    }


def rss_of_verify(path: Path) -> tuple[int, float, float, str]:
    """(exit code, peak RSS in MB, seconds, stderr) of `kbfuse verify-bundle path`."""
    code = (  # VmHWM: the peak of this process alone (ru_maxrss can carry the parent's)
        "import sys\n"
        "from kbfuse.workflow import cli\n"
        "rc = cli.main(['verify-bundle', sys.argv[1]])\n"
        "hwm = [l for l in open('/proc/self/status') if l.startswith('VmHWM')][0].split()[1]\n"
        "sys.stderr.write(f'\\nRSS_KB {hwm}\\n')\n"
        "sys.exit(rc)\n"
    )
    env = dict(os.environ, PYTHONPATH=str(REPO / "src"))
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-c", code, str(path)], capture_output=True, text=True, env=env
    )
    seconds = time.perf_counter() - start
    rss_kb = int(proc.stderr.rsplit("RSS_KB ", 1)[1].split()[0])
    return proc.returncode, rss_kb / 1024, seconds, proc.stderr


def test_bundle_bombs_are_refused_in_bounded_memory(bundle, tmp_path):
    rc, rss_good, _, _ = rss_of_verify(bundle)
    assert rc == cli.EXIT_OK
    expected = {
        "member declaring 3 GiB": "declares 3221225472 bytes",
        "pax header declaring 3 GiB": "3221225472-byte extended header",
        "GNU long name of 3 GiB": "3221225472-byte extended header",
        "3 GiB of zeros after the end-of-archive": "decompresses to more than",
    }
    for name, data in bombs(bundle.read_bytes()).items():
        path = tmp_path / "bomb.tar.gz"
        path.write_bytes(data)
        rc, rss, seconds, err = rss_of_verify(path)
        print(
            f"\n{name}: {len(data) / MIB:.1f} MB file, exit {rc}, peak RSS {rss:.0f} MB "
            f"(good bundle: {rss_good:.0f} MB), {seconds:.1f} s"
        )
        assert rc == cli.EXIT_PROBLEMS, err
        assert expected[name] in err and "Traceback" not in err
        assert rss < RSS_BOUND_MB
        assert len(data) < 8 * MIB


# ---------------------------------------------------------------- trailing and cut data


def test_data_after_the_gzip_stream_is_refused(bundle, tmp_path):
    good = bundle.read_bytes()
    for tail in (b"x", good, b"\0" * 10):  # junk, a second gzip member, zeros
        path = tmp_path / "t.tar.gz"
        path.write_bytes(good + tail)
        with pytest.raises(KbfuseError, match="data after the gzip stream"):
            verify_bundle(path)


def test_data_after_the_tar_end_of_archive_is_refused(bundle, tmp_path):
    tar = zlib.decompress(bundle.read_bytes(), 31)
    for tail in (b"hidden", _tar_bytes({f"{RESULTS_PREFIX}late.json": b"{}"})):
        path = tmp_path / "t.tar.gz"
        path.write_bytes(gzip_bomb(tar + tail, 0))
        with pytest.raises(KbfuseError, match="data after the tar end-of-archive"):
            verify_bundle(path)


def test_a_cut_archive_is_refused(bundle, tmp_path):
    good = bundle.read_bytes()
    tar = zlib.decompress(good, 31)
    end = len(tar.rstrip(b"\0"))
    end += -end % tarfile.BLOCKSIZE
    cases = {
        "cut gzip": (good[: len(good) // 2], "cut short|not a readable"),
        "no end-of-archive": (gzip_bomb(tar[:end], 0), "no tar end-of-archive"),
        "not gzip": (tar, "not a readable"),
        "empty": (b"", "cut short"),
    }
    for name, (data, message) in cases.items():
        path = tmp_path / "t.tar.gz"
        path.write_bytes(data)
        with pytest.raises(KbfuseError, match=message):
            verify_bundle(path)
        assert cli.main(["verify-bundle", str(path)]) == cli.EXIT_PROBLEMS, name


# ---------------------------------------------------------------- limits


def test_limits_on_count_size_and_total(bundle, tmp_path):
    members = members_of(bundle)
    small = dict(members=len(members) + 5, member_bytes=64 * 1024, total_bytes=4 * MIB)
    assert read_bundle(bundle, limits=Limits(**small)).records  # the good bundle fits
    many = {**members, **{f"{RESULTS_PREFIX}x/{i}.json": b"{}" for i in range(6)}}
    cases = {
        "members": (many, "more than"),
        "member_bytes": ({**members, f"{RESULTS_PREFIX}big.bin": bytes(65 * 1024)}, "declares"),
        "total_bytes": (
            {**members, **{f"{RESULTS_PREFIX}b{i}.bin": bytes(60 * 1024) for i in range(4)}},
            "declares",
        ),
    }
    tight = Limits(**{**small, "total_bytes": sum(map(len, members.values())) + 100 * 1024})
    for name, (content, message) in cases.items():
        path = repack(content, tmp_path / f"{name}.tar.gz")
        limits = tight if name == "total_bytes" else Limits(**small)
        with pytest.raises(KbfuseError, match=message):
            read_bundle(path, limits=limits)


@pytest.mark.parametrize(
    ("kind", "message"),
    [
        (tarfile.GNUTYPE_SPARSE, "sparse file"),
        (tarfile.XGLTYPE, "global pax header"),
        (tarfile.CHRTYPE, "link or special file"),
    ],
)
def test_special_members_are_refused(bundle, tmp_path, kind, message):
    tar = zlib.decompress(bundle.read_bytes(), 31)
    end = len(tar.rstrip(b"\0"))
    end += -end % tarfile.BLOCKSIZE
    extra = _header(f"{RESULTS_PREFIX}odd", 0, kind)
    path = tmp_path / "t.tar.gz"
    path.write_bytes(gzip_bomb(tar[:end] + extra + bytes(1024), 0))
    with pytest.raises(KbfuseError, match=message):
        verify_bundle(path)


@pytest.mark.parametrize(
    "name",
    [
        f"{RESULTS_PREFIX}a\nb.json",
        f"{RESULTS_PREFIX}a\x7fb.json",
        f"{RESULTS_PREFIX}{'a' * 1100}.json",
        "C:/evil.json",
        f"{RESULTS_PREFIX}..\\..\\evil.json",
    ],
)
def test_odd_member_names_are_refused(bundle, tmp_path, name):
    path = repack({**members_of(bundle), name: b"{}"}, tmp_path / "t.tar.gz")
    with pytest.raises(KbfuseError, match="unsafe path"):
        verify_bundle(path)


# ---------------------------------------------------------------- names from the manifest


def _with_manifest(members: dict[str, bytes], edit) -> dict[str, bytes]:
    manifest = json.loads(members[MANIFEST_MEMBER])
    edit(manifest)
    manifest["content_sha256"] = content_sha256(manifest)
    return {**members, MANIFEST_MEMBER: dumps_json(manifest).encode()}


def _escaping_variant(manifest: dict) -> None:
    variants = manifest["config"]["variants"]
    variants["../../../../outside"] = variants.pop("nvrtc-cubin-noftz")


def test_a_variant_name_that_climbs_out_is_refused_before_any_read(bundle, tmp_path, capsys):
    """The manifest's config names paths (compile/<variant>/meta.json, ...): a `../` name
    must not make compare open a file outside the bundle."""
    bad = repack(_with_manifest(members_of(bundle), _escaping_variant), tmp_path / "bad.tar.gz")
    with pytest.raises(KbfuseError, match=r"(?s)field config: .*\.\./\.\./\.\./\.\./outside"):
        verify_bundle(bad)
    out = tmp_path / "cmp"
    assert cli.main(["compare", str(bundle), str(bad), "--out", str(out)]) == cli.EXIT_PROBLEMS
    assert "field config" in capsys.readouterr().err
    assert [p.name for p in out.iterdir()] == []  # nothing written, nothing left behind


def test_result_paths_are_confined_even_if_a_config_gets_through(bundle, tmp_path):
    """Second line of defence: the summary refuses a result path outside the results dir."""
    with open_bundle(bundle, tmp_path) as (report, results, manifest):
        assert report["ok"]
        config = copy.deepcopy(manifest["config"])
        _escaping_variant({"config": config})
        with pytest.raises(KbfuseError, match="leaves the directory"):
            summary.build_tables(results, config)


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda m: m["files"].update({"../x.json": m["files"]["timing/53.json"]}), "files"),
        (lambda m: m["files"].update({"/etc/passwd": m["files"]["timing/53.json"]}), "files"),
        (lambda m: m["files"]["timing/53.json"].update(bytes=-1), "bytes"),
        (lambda m: m["files"]["timing/53.json"].update(sha256="zz"), "sha256"),
        (lambda m: m.update(files=[]), "files"),
        (lambda m: m["fingerprint"]["gpu"].update(name=["list"]), "fingerprint.gpu.name"),
        (lambda m: m["fingerprint"]["gpu"].update(name="\x1b[2J H200"), "fingerprint.gpu.name"),
        (lambda m: m["config"].update(tasks="53"), "field config"),
        (lambda m: m.pop("kernelbench_pin"), "kernelbench_pin is missing"),
    ],
)
def test_malformed_manifest_fields_are_named(bundle, tmp_path, edit, message):
    path = repack(_with_manifest(members_of(bundle), edit), tmp_path / "t.tar.gz")
    with pytest.raises(KbfuseError, match=message) as err:
        verify_bundle(path)
    assert MANIFEST_MEMBER in str(err.value)


# ---------------------------------------------------------------- nothing written outside


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def test_commands_write_only_under_out(bundle, tmp_path, monkeypatch):
    """verify-bundle writes nothing; compare and summarize only under --out (the system
    temporary directory included: it is pointed at an empty folder that must stay empty)."""
    config = tmp_path / "config.yaml"
    config.write_text(json.dumps(json.loads(members_of(bundle)[MANIFEST_MEMBER])["config"]))
    spool = tmp_path / "tmp"
    spool.mkdir()
    monkeypatch.setenv("TMPDIR", str(spool))
    monkeypatch.setattr("tempfile.tempdir", None)
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    before = _tree(tmp_path)
    assert cli.main(["verify-bundle", str(bundle)]) == cli.EXIT_OK
    assert _tree(tmp_path) == before
    assert cli.main(["compare", str(bundle), str(bundle), "--out", "cmp"]) == cli.EXIT_OK
    after = _tree(tmp_path)
    assert {k for k in after if k not in before} == {
        f"work/cmp/{name}.{ext}" for name in COMPARISON_TABLES for ext in ("csv", "md")
    }
    results = bundle.parent / "results"
    argv = ["summarize", str(results), "--config", str(config), "--out", "sum"]
    assert cli.main([*argv, "--kernels", str(REPO / "kernels")]) == cli.EXIT_OK
    added = {k for k in _tree(tmp_path) if k not in after}
    assert added and all(k.startswith("work/sum/") for k in added)
    assert list(spool.iterdir()) == []


def test_extraction_stays_in_the_work_directory(bundle, tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    tables = compare_bundles([bundle, bundle], ["a", "b"], workdir=work)
    assert list(tables["ftz"].columns)[:2] == ["variant", "route"]
    assert list(work.iterdir()) == []
    assert not (tmp_path / BUNDLE_ROOT).exists()


def test_a_bundle_recorded_with_a_key_retired_since_still_verifies(bundle, tmp_path):
    """Runs made before the official tolerance was read from the pin recorded `tolerance` in
    their config: valid then, so left out of the check; a wrong value elsewhere still fails."""
    old = tmp_path / "old.tar.gz"
    edit = lambda m: m["config"].update(tolerance={"atol": 1e-4, "rtol": 1e-4})  # noqa: E731
    repack(_with_manifest(members_of(bundle), edit), old)
    assert verify_bundle(old)["ok"]
    both = lambda m: (edit(m), m["config"].update(tasks="53"))  # noqa: E731
    bad = repack(_with_manifest(members_of(bundle), both), tmp_path / "bad.tar.gz")
    with pytest.raises(KbfuseError, match="field config"):
        verify_bundle(bad)
