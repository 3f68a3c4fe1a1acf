"""Property tests (Hypothesis): whatever a manifest, record or bundle holds, reading it ends
in a result or a KbfuseError (exit code 1 from the command line), never another exception,
and nothing is written outside the command's --out directory.

The examples are derandomized (the same cases on every run, in CI too) and no example
database is written. Run with `-s` to print how many cases each class tried.
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import os
import tarfile
import tempfile
import zlib
from pathlib import Path

import pytest
from conftest import json_paths
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from test_bundle import members_of, repack, result_files
from test_summary import make_config, write_study

from kbfuse.errors import KbfuseError
from kbfuse.io import dumps_json, read_json
from kbfuse.results import records, summary
from kbfuse.results.bundle import MANIFEST_MEMBER, make_bundle, verify_bundle
from kbfuse.results.manifest import build_manifest, content_sha256, manifest_from_bytes
from kbfuse.workflow import cli

FUZZ = settings(
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
TRIED: dict[str, int] = {}

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.sampled_from(["false", "true", "nan", "inf", "-inf", "../x", "", "0" * 64])
    | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4)
    ),
    max_leaves=12,
)


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    """(results dir, config, bundle, folder for scratch files) of a small study."""
    base = tmp_path_factory.mktemp("fuzz")
    config = make_config(tasks=(53,), variants=("cupy-default", "nvrtc-cubin-noftz"))
    root = base / "results"
    write_study(root, config)
    manifest = base / "manifest.json"
    build_manifest(root, result_files(root, config), config, manifest)
    bundle = make_bundle(root, manifest, base / "good.tar.gz")
    scratch = base / "scratch"
    (scratch / "tmp").mkdir(parents=True)
    return root, config, bundle, scratch


def mutate(data, draw) -> object:
    """A deep copy of data with one value replaced by arbitrary JSON, or one key dropped."""
    data = copy.deepcopy(data)
    paths = [p for p in json_paths(data) if p]
    path = draw(st.sampled_from(paths))
    parent = data
    for part in path[:-1]:
        parent = parent[part]
    if isinstance(parent, dict) and draw(st.booleans()):
        del parent[path[-1]]
    else:
        parent[path[-1]] = draw(json_values)
    return data


@contextlib.contextmanager
def watched(folder: Path):
    """The system temporary directory pointed at `folder`, which must stay empty."""
    saved = os.environ.get("TMPDIR"), tempfile.tempdir
    os.environ["TMPDIR"], tempfile.tempdir = str(folder), None
    try:
        yield
    finally:
        if saved[0] is None:
            del os.environ["TMPDIR"]
        else:
            os.environ["TMPDIR"] = saved[0]
        tempfile.tempdir = saved[1]
    assert list(folder.iterdir()) == [], "something was written to the temporary directory"


def quiet_main(argv: list[str]) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        rc = cli.main(argv)
    assert "Traceback" not in err.getvalue()
    return rc, err.getvalue()


def _count(name: str) -> None:
    TRIED[name] = TRIED.get(name, 0) + 1


@pytest.fixture(scope="module", autouse=True)
def report_counts():
    yield
    for name, n in sorted(TRIED.items()):
        print(f"\nfuzz {name}: {n} cases, all refused with KbfuseError or handled")


# ---------------------------------------------------------------- manifests


@settings(FUZZ, max_examples=300)
@given(data=st.data())
def test_any_manifest_is_read_or_refused(study, data):
    _, _, bundle, _ = study
    manifest = json.loads(members_of(bundle)[MANIFEST_MEMBER])
    bad = mutate(manifest, data.draw)
    if data.draw(st.booleans()) and isinstance(bad, dict):
        bad["content_sha256"] = content_sha256(bad)  # a careful forger
    _count("manifest fields")
    try:
        parsed, _ = manifest_from_bytes(dumps_json(bad).encode(), MANIFEST_MEMBER)
    except KbfuseError as exc:
        assert MANIFEST_MEMBER in str(exc)
        return
    for rel in parsed["files"]:  # what got through is safe to join to a directory
        assert not rel.startswith("/") and ".." not in rel.split("/")
    for variant in parsed["config"]["variants"]:
        assert "/" not in variant and "." not in variant


# ---------------------------------------------------------------- records


KINDS_AND_FILES = [
    ("correctness", "correctness/53/cupy-default.json"),
    ("correctness_baselines", "correctness/53/baselines.json"),
    ("timing", "timing/53.json"),
    ("controls", "controls/53.json"),
    ("compile", "compile/nvrtc-cubin-noftz/meta.json"),
    ("verify", "verify/nvrtc-cubin-noftz.json"),
    ("env", "env/fingerprint.json"),
    ("kernelbench_pin", "kernelbench/pin.json"),
    ("margin_audit", "protocol/margin_audit.json"),
    ("direction_witness", "protocol/direction_witness.json"),
]


@settings(FUZZ, max_examples=400)
@given(data=st.data())
def test_any_record_is_validated_or_refused(study, data):
    root, _, _, _ = study
    kind, rel = data.draw(st.sampled_from(KINDS_AND_FILES))
    bad = mutate(read_json(root / rel), data.draw)
    _count("record fields (validation)")
    try:
        records.validate_record(bad, kind, rel)
    except KbfuseError as exc:
        assert rel in str(exc)


@settings(FUZZ, max_examples=60)
@given(data=st.data())
def test_any_record_gives_tables_or_a_kbfuse_error(study, data):
    """The whole summary over a mutated record: tables, or a KbfuseError naming a file."""
    root, config, _, scratch = study
    kind, rel = data.draw(st.sampled_from(KINDS_AND_FILES))
    original = (root / rel).read_bytes()
    bad = mutate(json.loads(original), data.draw)
    _count("record fields (summary tables)")
    try:
        (root / rel).write_text(json.dumps(bad))
        with watched(scratch / "tmp"):
            summary.build_tables(root, config)
    except KbfuseError as exc:
        assert "/" in str(exc)
    finally:
        (root / rel).write_bytes(original)


# ---------------------------------------------------------------- bundle bytes


@settings(FUZZ, max_examples=300)
@given(data=st.data())
def test_any_bundle_bytes_are_verified_or_refused(study, data):
    _, _, bundle, scratch = study
    good = bundle.read_bytes()
    layer = data.draw(st.sampled_from(["gzip", "tar"]))
    raw = bytearray(good if layer == "gzip" else zlib.decompress(good, 31))
    for _ in range(data.draw(st.integers(1, 4))):
        op = data.draw(st.sampled_from(["flip", "cut", "append", "insert"]))
        at = data.draw(st.integers(0, max(len(raw) - 1, 0)))
        if op == "flip" and raw:
            raw[at] ^= data.draw(st.integers(1, 255))
        elif op == "cut":
            del raw[at:]
        elif op == "append":
            raw += data.draw(st.binary(min_size=1, max_size=64))
        else:
            raw[at:at] = data.draw(st.binary(min_size=1, max_size=64))
    blob = bytes(raw) if layer == "gzip" else zlib.compress(bytes(raw), 9, 31)
    assume(blob != good)
    _count(f"bundle bytes ({layer} layer)")
    path = scratch / "fuzz.tar.gz"
    path.write_bytes(blob)
    with watched(scratch / "tmp"):
        rc, err = quiet_main(["verify-bundle", str(path)])
    assert rc in (cli.EXIT_OK, cli.EXIT_PROBLEMS), err
    assert sorted(p.name for p in scratch.iterdir()) == ["fuzz.tar.gz", "tmp"]


# ---------------------------------------------------------------- archive structure


segments = st.sampled_from(
    ["kbfuse-bundle", "results", "timing", "53.json", "..", ".", "", "a\\b", "x\ny", "C:", "é"]
)
member_names = st.lists(segments, min_size=1, max_size=5).map("/".join) | st.sampled_from(
    ["/etc/passwd", "kbfuse-bundle/results/" + "a" * 300, MANIFEST_MEMBER]
)
member_types = st.sampled_from(
    [tarfile.REGTYPE, tarfile.DIRTYPE, tarfile.SYMTYPE, tarfile.LNKTYPE, tarfile.FIFOTYPE]
)


@settings(FUZZ, max_examples=200)
@given(
    extra=st.lists(
        st.tuples(member_names, member_types, st.binary(max_size=32)), min_size=1, max_size=4
    ),
    fmt=st.sampled_from([tarfile.PAX_FORMAT, tarfile.GNU_FORMAT, tarfile.USTAR_FORMAT]),
)
def test_any_member_list_is_verified_or_refused(study, extra, fmt):
    _, _, bundle, scratch = study
    out = io.BytesIO()
    try:
        with tarfile.open(fileobj=out, mode="w:gz", format=fmt) as tar:
            for name, data in sorted(members_of(bundle).items()):
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
            for name, kind, data in extra:
                info = tarfile.TarInfo(name)
                info.type = kind
                info.linkname = "/etc/passwd" if kind in (tarfile.SYMTYPE, tarfile.LNKTYPE) else ""
                info.size = len(data) if kind == tarfile.REGTYPE else 0
                tar.addfile(info, io.BytesIO(data) if kind == tarfile.REGTYPE else None)
    except (ValueError, UnicodeError):
        assume(False)  # tarfile cannot write it (a name too long for ustar, ...)
    _count("member names and types")
    path = scratch / "fuzz.tar.gz"
    path.write_bytes(out.getvalue())
    with watched(scratch / "tmp"):
        try:
            report = verify_bundle(path)
        except KbfuseError:
            return
    assert not report["ok"] or all(kind == tarfile.DIRTYPE for _, kind, _ in extra)


# ---------------------------------------------------------------- compare


@settings(FUZZ, max_examples=20)
@given(data=st.data())
def test_compare_with_any_manifest_writes_only_its_tables(study, data):
    _, _, bundle, scratch = study
    members = members_of(bundle)
    manifest = mutate(json.loads(members[MANIFEST_MEMBER]), data.draw)
    if isinstance(manifest, dict):
        manifest["content_sha256"] = content_sha256(manifest)
    text = json.dumps(manifest, indent=2, sort_keys=True) + "\n"
    other = repack({**members, MANIFEST_MEMBER: text.encode()}, scratch / "other.tar.gz")
    _count("compare with a forged manifest")
    out = scratch / "cmp"
    with watched(scratch / "tmp"):
        rc, err = quiet_main(["compare", str(bundle), str(other), "--out", str(out)])
    assert rc in (cli.EXIT_OK, cli.EXIT_PROBLEMS), err
    names = {p.name for p in out.iterdir()}
    assert all(n.endswith((".csv", ".md")) for n in names) and (names or rc)
    assert not (rc and names)  # refused: nothing in --out
    assert {p.name for p in scratch.iterdir()} <= {"cmp", "other.tar.gz", "fuzz.tar.gz", "tmp"}
    for p in out.iterdir():
        p.unlink()
