"""Manifest and bundle: deterministic, and every change, deletion or addition is named."""

from __future__ import annotations

import gzip
import io
import json
import os
import tarfile
from pathlib import Path

import pytest
from test_summary import make_config, write_study

from kbfuse.errors import KbfuseError
from kbfuse.io import read_json
from kbfuse.layout import summary_inputs
from kbfuse.results.bundle import (
    BUNDLE_ROOT,
    MANIFEST_MEMBER,
    RESULTS_PREFIX,
    format_report,
    make_bundle,
    pack,
    verify_bundle,
)
from kbfuse.results.manifest import build_manifest, verify_manifest
from kbfuse.workflow import cli


def result_files(root: Path, config: dict) -> list[str]:
    """What a bundle rule would list: the summary's inputs and the compiled artifacts."""
    files = summary_inputs(config, root)
    files += [str(root / f"compile/{v}/tails.bin") for v in config["variants"]]
    return files


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """(results dir, config, manifest path, bundle path) of one complete study."""
    base = tmp_path_factory.mktemp("bundle")
    config = make_config(variants=("cupy-default", "nvrtc-cubin-noftz", "nvrtc-cubin-ftz"))
    root = base / "results"
    write_study(root, config)
    manifest = base / "manifest.json"
    build_manifest(root, result_files(root, config), config, manifest)
    bundle = make_bundle(root, manifest, base / "h200.tar.gz")
    return root, config, manifest, bundle


def members_of(bundle: Path) -> dict[str, bytes]:
    with tarfile.open(bundle, "r:gz") as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}


def repack(members: dict[str, bytes], out: Path) -> Path:
    out.write_bytes(pack(members))
    return out


# ---------------------------------------------------------------- manifest


def test_manifest_lists_every_file_and_quotes_fingerprint_config_pin(made):
    root, config, manifest_path, _ = made
    manifest = read_json(manifest_path)
    listed = manifest["files"]
    assert list(listed) == sorted(listed)
    expected = {str(Path(f).relative_to(root)) for f in result_files(root, config)}
    assert set(listed) == expected
    for rel, rec in listed.items():
        assert rec["bytes"] == (root / rel).stat().st_size
    assert manifest["fingerprint"] == read_json(root / "env/fingerprint.json")
    assert manifest["kernelbench_pin"] == read_json(root / "kernelbench/pin.json")
    assert manifest["config"] == config
    text = manifest_path.read_text()
    assert "mtime" not in text and "time" not in set(manifest)


def test_manifest_is_reproducible(made, tmp_path):
    root, config, manifest_path, _ = made
    for path in root.rglob("*"):
        os.utime(path, (1_000_000_000, 1_000_000_000))  # file times do not matter
    again = tmp_path / "again.json"
    build_manifest(root, reversed(result_files(root, config)), config, again)
    assert again.read_bytes() == manifest_path.read_bytes()


def test_manifest_refuses_files_outside_results_or_not_files(made, tmp_path):
    root, config, _, _ = made
    outside = tmp_path / "notes.json"
    outside.write_text("{}")
    with pytest.raises(KbfuseError, match="not inside results dir"):
        build_manifest(root, [outside], config, tmp_path / "m.json")
    with pytest.raises(KbfuseError, match="is not a file"):
        build_manifest(root, [root / "verify"], config, tmp_path / "m.json")
    with pytest.raises(KbfuseError, match="also listed as one of its inputs"):
        build_manifest(root, [root / "env/fingerprint.json"], config, root / "env/fingerprint.json")


def test_verify_manifest_in_place(made, tmp_path):
    root, config, manifest_path, _ = made
    report = verify_manifest(root, manifest_path)
    assert report["ok"], report
    stray = root / "logs" / "stray.log"
    stray.parent.mkdir()
    stray.write_text("log")
    try:
        report = verify_manifest(root, manifest_path)
        assert report["extra"] == ["logs/stray.log"] and not report["ok"]
        assert verify_manifest(root, manifest_path, ignore=["logs/*"])["ok"]
    finally:
        stray.unlink()
        stray.parent.rmdir()


# ---------------------------------------------------------------- bundle


def test_bundle_verifies_and_names_its_environment(made):
    _, config, manifest_path, bundle = made
    report = verify_bundle(bundle)
    assert report["ok"], report
    assert report["checked"] == len(read_json(manifest_path)["files"])
    env = report["environment"]
    assert env["gpu"] == "NVIDIA H200"
    assert env["driver"] == "580.95.05"
    assert env["cuda"] == "13.0"
    assert env["torch"] == "2.11.0+cu130"
    assert report["pin"]["commit"] == config["kernelbench"]["commit"]
    text = format_report(report)
    assert "NVIDIA H200" in text and "580.95.05" in text and "OK" in text


def test_bundle_is_deterministic(made, tmp_path):
    root, _, manifest_path, bundle = made
    for path in root.rglob("*"):
        os.utime(path, (1_234_567_890, 1_234_567_890))
    again = make_bundle(root, manifest_path, tmp_path / "again.tar.gz")
    assert again.read_bytes() == bundle.read_bytes()
    raw = bundle.read_bytes()
    assert raw[4:8] == b"\0\0\0\0"  # gzip header mtime
    with gzip.open(bundle) as gz, tarfile.open(fileobj=io.BytesIO(gz.read())) as tar:
        infos = tar.getmembers()
    names = [i.name for i in infos]
    assert names == sorted(names)
    assert names[0] == MANIFEST_MEMBER
    assert all(n.startswith(f"{BUNDLE_ROOT}/") for n in names)
    assert {(i.mtime, i.uid, i.gid, i.uname, i.gname, i.mode) for i in infos} == {
        (0, 0, 0, "", "", 0o644)
    }


def test_make_bundle_refuses_files_changed_since_the_manifest(made, tmp_path):
    root, _, manifest_path, _ = made
    target = root / "timing/81.json"
    original = target.read_bytes()
    try:
        target.write_bytes(original + b" ")
        with pytest.raises(KbfuseError, match="timing/81.json changed since"):
            make_bundle(root, manifest_path, tmp_path / "b.tar.gz")
        target.unlink()
        with pytest.raises(KbfuseError, match="timing/81.json is listed .* but missing"):
            make_bundle(root, manifest_path, tmp_path / "b.tar.gz")
    finally:
        target.write_bytes(original)
    assert not (tmp_path / "b.tar.gz").exists()


def _flip_middle(data: bytes) -> bytes:
    i = len(data) // 2
    return data[:i] + bytes([data[i] ^ 0x01]) + data[i + 1 :]


@pytest.mark.parametrize(
    "change", [lambda d: d + b"\n", _flip_middle, lambda d: d[:-1]], ids=["append", "flip", "cut"]
)
def test_every_single_file_change_is_named(made, tmp_path, change):
    _, _, manifest_path, bundle = made
    members = members_of(bundle)
    assert len(members) == 1 + len(read_json(manifest_path)["files"])
    for name, data in members.items():
        tampered = repack({**members, name: change(data)}, tmp_path / "t.tar.gz")
        if name == MANIFEST_MEMBER:
            try:
                report = verify_bundle(tampered)
            except KbfuseError as exc:  # the edit broke the JSON itself
                assert MANIFEST_MEMBER in str(exc)
                continue
            assert not report["ok"]
            assert any(MANIFEST_MEMBER in p for p in report["manifest_problems"])
            continue
        report = verify_bundle(tampered)
        assert not report["ok"], name
        assert [c["path"] for c in report["changed"]] == [name]
        assert report["missing"] == [] and report["extra"] == [] and report["duplicates"] == []
        if not name.endswith(("env/fingerprint.json", "kernelbench/pin.json")):
            assert report["manifest_problems"] == [], name  # only these two are quoted


def test_every_single_file_deletion_is_named(made, tmp_path):
    _, _, _, bundle = made
    members = members_of(bundle)
    for name in members:
        rest = {k: v for k, v in members.items() if k != name}
        tampered = repack(rest, tmp_path / "t.tar.gz")
        if name == MANIFEST_MEMBER:
            with pytest.raises(KbfuseError, match="has no kbfuse-bundle/manifest.json"):
                verify_bundle(tampered)
            continue
        report = verify_bundle(tampered)
        assert not report["ok"]
        assert report["missing"] == [name]
        assert report["changed"] == [] and report["extra"] == []


def test_every_single_file_addition_is_named(made, tmp_path):
    _, _, _, bundle = made
    members = members_of(bundle)
    folders = {n.rsplit("/", 1)[0] for n in members} | {BUNDLE_ROOT, ""}
    for folder in sorted(folders):
        name = f"{folder}/added.json" if folder else "added.json"
        tampered = repack({**members, name: b"{}\n"}, tmp_path / "t.tar.gz")
        report = verify_bundle(tampered)
        assert not report["ok"]
        assert report["extra"] == [name], folder
        assert report["changed"] == [] and report["missing"] == []


def _raw_tar(out: Path, entries: list[tarfile.TarInfo], data: dict[str, bytes]) -> Path:
    with tarfile.open(out, "w:gz") as tar:
        for info in entries:
            payload = data.get(info.name)
            if payload is not None:
                info.size = len(payload)
            tar.addfile(info, io.BytesIO(payload) if payload is not None else None)
    return out


def test_duplicate_member_is_named(made, tmp_path):
    _, _, _, bundle = made
    members = members_of(bundle)
    name = RESULTS_PREFIX + "timing/53.json"
    out = tmp_path / "dup.tar.gz"
    with tarfile.open(out, "w:gz") as tar:
        for member, payload in [*sorted(members.items()), (name, b"{}")]:
            info = tarfile.TarInfo(member)
            info.size = len(payload)
            tar.addfile(info, io.BytesIO(payload))
    report = verify_bundle(out)
    assert report["duplicates"] == [name] and not report["ok"]
    assert report["changed"] == []  # the first copy is the one checked


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("../evil.json", tarfile.REGTYPE),
        ("/tmp/evil.json", tarfile.REGTYPE),
        (f"{BUNDLE_ROOT}/../../evil.json", tarfile.REGTYPE),
        (f"{RESULTS_PREFIX}link.json", tarfile.SYMTYPE),
        (f"{RESULTS_PREFIX}hard.json", tarfile.LNKTYPE),
        (f"{RESULTS_PREFIX}fifo", tarfile.FIFOTYPE),
    ],
)
def test_unsafe_members_are_refused(made, tmp_path, name, kind):
    _, _, _, bundle = made
    members = members_of(bundle)
    info = tarfile.TarInfo(name)
    info.type = kind
    if kind in (tarfile.SYMTYPE, tarfile.LNKTYPE):
        info.linkname = "/etc/passwd"
    entries = [tarfile.TarInfo(n) for n in sorted(members)] + [info]
    payloads = {**members, name: b"owned"} if kind == tarfile.REGTYPE else members
    out = _raw_tar(tmp_path / "unsafe.tar.gz", entries, payloads)
    with pytest.raises(KbfuseError, match="unsafe path|link or special file"):
        verify_bundle(out)
    assert not (tmp_path.parent / "evil.json").exists()
    assert cli.main(["verify-bundle", str(out)]) == cli.EXIT_PROBLEMS


def test_not_a_bundle_is_refused(tmp_path):
    junk = tmp_path / "junk.tar.gz"
    junk.write_bytes(b"not a tarball at all")
    with pytest.raises(KbfuseError, match="not a readable .tar.gz"):
        verify_bundle(junk)
    empty = repack({f"{RESULTS_PREFIX}x.json": b"{}"}, tmp_path / "empty.tar.gz")
    with pytest.raises(KbfuseError, match="has no kbfuse-bundle/manifest.json"):
        verify_bundle(empty)


# ---------------------------------------------------------------- command line


def test_cli_verify_bundle_exit_codes(made, tmp_path, capsys):
    _, _, _, bundle = made
    assert cli.main(["verify-bundle", str(bundle)]) == cli.EXIT_OK
    out = capsys.readouterr().out
    assert "OK" in out and "NVIDIA H200" in out

    members = members_of(bundle)
    name = RESULTS_PREFIX + "verify/nvrtc-cubin-ftz.json"
    tampered = repack({**members, name: members[name] + b" "}, tmp_path / "t.tar.gz")
    assert cli.main(["verify-bundle", str(tampered)]) == cli.EXIT_PROBLEMS
    out = capsys.readouterr().out
    assert f"CHANGED {name}" in out and "FAILED" in out

    assert cli.main(["verify-bundle", "--json", str(tampered)]) == cli.EXIT_PROBLEMS
    report = json.loads(capsys.readouterr().out)
    assert [c["path"] for c in report["changed"]] == [name]

    assert cli.main(["verify-bundle", str(tmp_path / "absent.tar.gz")]) == cli.EXIT_CANNOT_RUN
    assert "does not exist" in capsys.readouterr().err


def test_fingerprint_edit_is_caught_twice(made, tmp_path):
    """Editing env/fingerprint.json changes its hash and contradicts the manifest's quote."""
    _, _, _, bundle = made
    members = members_of(bundle)
    name = RESULTS_PREFIX + "env/fingerprint.json"
    fingerprint = json.loads(members[name])
    fingerprint["gpu"]["name"] = "NVIDIA A100"
    edited = json.dumps(fingerprint, indent=2, sort_keys=True).encode() + b"\n"
    report = verify_bundle(repack({**members, name: edited}, tmp_path / "t.tar.gz"))
    assert [c["path"] for c in report["changed"]] == [name]
    assert report["manifest_problems"] == [
        "manifest field fingerprint differs from env/fingerprint.json"
    ]
    assert report["environment"]["gpu"] == "NVIDIA H200"  # the manifest's word, now contradicted
