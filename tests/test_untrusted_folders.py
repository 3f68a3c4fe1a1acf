"""Folders and files someone else made, read by kbfuse outside a check: the check folder that
every Snakemake start scans, a results folder given to `kbfuse verify-bundle`, records and
manifests, config counts. Each is read within bounds (kbfuse.untrusted): a FIFO, a link to
/dev/zero, a sparse file of 8 GiB or JSON nested 600 deep ends in a message naming it, never in
a hang, a traceback or a process of gigabytes."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from conftest import ROOT, copy_workflow, snakemake, write_test_config
from test_bundle import result_files
from test_summary import make_config, write_study

from kbfuse import untrusted
from kbfuse.candidates import spec
from kbfuse.errors import KbfuseError
from kbfuse.results import records
from kbfuse.results.manifest import build_manifest
from kbfuse.workflow.config import check_config, validate_schema

GOOD = ROOT / "tests" / "candidates" / "cpu" / "good.py"
RSS_BOUND_MB = 100  # verify-bundle: the interpreter and kbfuse's imports take about 25 MB


# ---------------------------------------------------------------- the check folder


def _folder(tmp_path: Path, name: str, make) -> Path:
    folder = tmp_path / "candidates"
    folder.mkdir(exist_ok=True)
    (folder / "good.py").write_text(GOOD.read_text())
    make(folder / name)
    return folder


MADE = {
    "fifo": ("fifo.py", os.mkfifo, "is a FIFO, not a regular file; not read"),
    "dev_zero": (
        "zero.py",
        lambda p: p.symlink_to("/dev/zero"),
        "is a character device, not a regular file; not read",
    ),
    "folder": ("dir.py", Path.mkdir, "is a folder, not a regular file; not read"),
}


@pytest.mark.parametrize("kind", sorted(MADE))
def test_the_check_folder_scan_names_special_files_unopened(tmp_path, kind):
    name, make, message = MADE[kind]
    folder = _folder(tmp_path, name, make)
    start = time.monotonic()
    with pytest.raises(KbfuseError, match=f"{name} {message}"):
        spec.scan_folder(folder)
    assert time.monotonic() - start < 5


def test_the_scan_follows_a_link_to_a_regular_file_and_reads_only_the_head(tmp_path):
    folder = _folder(tmp_path, "linked.py", lambda p: p.symlink_to(GOOD))
    assert spec.scan_folder(folder) == {"good": (2, 53), "linked": (2, 53)}
    big = folder / "big.py"
    big.write_text("# kbfuse-task: 2/53\n")
    os.truncate(big, spec.CANDIDATE_BYTES)  # sparse: as large as a candidate may be
    assert spec.scan_folder(folder)["big"] == (2, 53)
    os.truncate(big, spec.CANDIDATE_BYTES + 1)
    with pytest.raises(KbfuseError, match=r"big\.py is 16777217 bytes, over 16777216"):
        spec.scan_folder(folder)


@pytest.mark.parametrize(
    "name", ["a[b]", "a+b", "{candidate}", "x" * 250, ".hidden", "-dash", "sp ace", "ünï"]
)
def test_candidate_names_that_cannot_name_a_job_are_refused(tmp_path, name):
    folder = _folder(tmp_path, f"{name}.py", lambda p: p.write_text(GOOD.read_text()))
    with pytest.raises(KbfuseError, match="its name cannot name a job and its files"):
        spec.scan_folder(folder)


@pytest.mark.parametrize("name", ["a_b", "v2.1-fast", "X" * 100])
def test_plain_names_are_kept(tmp_path, name):
    folder = _folder(tmp_path, f"{name}.py", lambda p: p.write_text(GOOD.read_text()))
    assert spec.scan_folder(folder)[name] == (2, 53)


def test_too_many_candidates_are_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(spec, "MAX_CANDIDATES", 2)
    folder = _folder(tmp_path, "b.py", lambda p: p.write_text(GOOD.read_text()))
    assert len(spec.scan_folder(folder)) == 2
    (folder / "c.py").write_text(GOOD.read_text())
    with pytest.raises(KbfuseError, match="holds more than 2 \\*.py files"):
        spec.scan_folder(folder)


def test_a_folder_path_with_braces_is_refused():
    with pytest.raises(KbfuseError, match=r"check.folder is 'c\{x\}': it must be a folder path"):
        spec.check_settings({"folder": "c{x}"})


@pytest.mark.parametrize(
    "name, make, message",
    [
        ("fifo.py", os.mkfifo, "fifo.py is a FIFO, not a regular file; not read"),
        ("zero.py", lambda p: p.symlink_to("/dev/zero"), "zero.py is a character device"),
        ("a[b.py", lambda p: p.write_text(GOOD.read_text()), "its name cannot name a job"),
    ],
)
def test_snakemake_stops_at_once_on_a_bad_check_folder_naming_the_file(
    tmp_path, kb_repo, name, make, message
):
    workdir = copy_workflow(tmp_path / "wf")
    folder = _folder(workdir, name, make)
    overlay = write_test_config(workdir, *kb_repo, check={"folder": str(folder)})
    proc = snakemake(workdir, "-n", "cpu", "--configfile", str(overlay), check=False, timeout=120)
    assert proc.returncode == 1
    assert message in proc.stderr and "Traceback" not in proc.stderr
    assert not (workdir / "results").exists()


# ---------------------------------------------------------------- verify-bundle on a folder


@pytest.fixture
def folder(tmp_path) -> Path:
    """A results folder of one small study with its manifest.json, as a reference is kept."""
    config = make_config(variants=("nvrtc-cubin-noftz",))
    root = tmp_path / "results"
    write_study(root, config)
    build_manifest(root, result_files(root, config), config, root / "manifest.json")
    return root


def verify(path: Path) -> tuple[int, float, str, str]:
    """(exit status, peak RSS in MB, stdout, stderr) of `kbfuse verify-bundle path`."""
    code = (  # VmHWM: the peak of this process alone
        "import sys\n"
        "from kbfuse.workflow import cli\n"
        "rc = cli.main(['verify-bundle', sys.argv[1]])\n"
        "hwm = [l for l in open('/proc/self/status') if l.startswith('VmHWM')][0].split()[1]\n"
        "sys.stderr.write(f'\\nRSS_KB {hwm}\\n')\n"
        "sys.exit(rc)\n"
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    proc = subprocess.run(
        [sys.executable, "-c", code, str(path)], capture_output=True, text=True, env=env,
        timeout=120,
    )  # fmt: skip
    rss_kb = int(proc.stderr.rsplit("RSS_KB ", 1)[1].split()[0])
    return proc.returncode, rss_kb / 1024, proc.stdout, proc.stderr


def _listed(folder: Path) -> list[str]:
    return sorted(json.loads((folder / "manifest.json").read_text())["files"])


def test_a_good_folder_verifies(folder):
    rc, rss, out, _ = verify(folder)
    assert rc == 0 and "OK: every file matches the manifest" in out
    assert rss < RSS_BOUND_MB


def test_links_fifos_and_devices_in_a_folder_are_named_never_opened(folder):
    zero, fifo, big = _listed(folder)[-3:]
    (folder / zero).unlink()
    (folder / zero).symlink_to("/dev/zero")
    (folder / fifo).unlink()
    os.mkfifo(folder / fifo)
    os.truncate(folder / big, 8 << 30)  # sparse: 8 GiB of another size, never hashed
    os.mkfifo(folder / "extra.fifo")
    (folder / "extra-zero.json").symlink_to("/dev/zero")
    (folder / "linked-dir").symlink_to("/")
    rc, rss, out, err = verify(folder)
    assert rc == 1, err
    assert f"CHANGED {zero}: not hashed: a symbolic link (None bytes)" in out
    assert f"CHANGED {fifo}: not hashed: a FIFO (None bytes)" in out
    assert f"CHANGED {big}: not hashed: size differs ({8 << 30} bytes)" in out
    for extra in ("extra.fifo", "extra-zero.json", "linked-dir"):
        assert f"EXTRA {extra}" in out
    assert rss < RSS_BOUND_MB


def test_an_8_gib_sparse_manifest_is_refused_unread(folder):
    os.truncate(folder / "manifest.json", 8 << 30)
    rc, rss, _, err = verify(folder)
    assert rc == 1
    assert (
        f"manifest {folder}/manifest.json is {8 << 30} bytes, over the 67108864-byte limit" in err
    )
    assert rss < RSS_BOUND_MB


def test_a_manifest_that_is_a_fifo_or_a_link_to_dev_zero_is_refused(folder):
    (folder / "manifest.json").unlink()
    os.mkfifo(folder / "manifest.json")
    rc, _, _, err = verify(folder)
    assert rc == 2 and "does not exist or is not a file" in err  # not opened: is_file() is False
    (folder / "manifest.json").unlink()
    (folder / "manifest.json").symlink_to("/dev/zero")
    rc, _, _, err = verify(folder)
    assert rc == 2 and "does not exist or is not a file" in err


def test_a_manifest_nested_600_deep_is_a_clear_error(folder):
    manifest = json.loads((folder / "manifest.json").read_text())
    nested: list = []
    for _ in range(599):
        nested = [nested]
    manifest["fingerprint"]["deep"] = nested
    (folder / "manifest.json").write_text(json.dumps(manifest))
    rc, _, _, err = verify(folder)
    assert rc == 1 and "Traceback" not in err and "RecursionError" not in err
    assert "nests arrays and objects more than 64 deep" in err


def test_a_manifest_with_a_key_given_twice_is_refused(folder):
    text = (folder / "manifest.json").read_text()
    (folder / "manifest.json").write_text(
        text.replace('{\n  "config"', '{\n  "kind": "x",\n  "config"', 1)
    )
    rc, _, _, err = verify(folder)
    assert rc == 1 and "key 'kind' is given twice in one object" in err


# ---------------------------------------------------------------- records and JSON


def test_a_record_with_a_key_given_twice_is_refused(tmp_path):
    path = tmp_path / "timing.json"
    path.write_text('{"kind": "timing", "schema_version": 1, "kind": "correctness"}')
    with pytest.raises(
        KbfuseError, match=r"timing\.json is not valid JSON: key 'kind' is given twice"
    ):
        records.read_record(path, "timing")


def test_deep_json_is_refused_before_any_recursive_code_walks_it():
    for depth in (600, 10_000):
        raw = ("[" * depth + "]" * depth).encode()
        with pytest.raises(
            KbfuseError, match=r"^r (nests arrays and objects more than 64 deep|is not valid JSON)"
        ):
            untrusted.parse_json(raw, "r", 1 << 20)
    assert untrusted.parse_json(b"[" * 64 + b"]" * 64, "r", 1 << 20) is not None
    with pytest.raises(KbfuseError, match="more than 64 deep"):
        untrusted.parse_json(b'{"a":' * 65 + b"1" + b"}" * 65, "r", 1 << 20)


def test_a_record_that_is_a_fifo_or_a_link_to_dev_zero_is_refused_at_once(tmp_path):
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    with pytest.raises(KbfuseError, match="fifo.json is a FIFO, not a regular file"):
        records.read_limited(fifo)
    zero = tmp_path / "zero.json"
    zero.symlink_to("/dev/zero")
    with pytest.raises(KbfuseError, match="zero.json is a character device"):
        records.read_limited(zero)


# ---------------------------------------------------------------- config counts


DEFAULT = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())


@pytest.mark.parametrize(
    "path, value",
    [
        (("survey", "rounds"), 10**30),
        (("survey", "warmup"), 1001),
        (("survey", "invocations_per_pair"), 100_001),
        (("timing", "rounds"), 10_001),
        (("controls", "small_shape", "batch"), 65_537),
        (("controls", "tiny_values", "dense_count"), 2**28 + 1),
        (("controls", "ftz_cost", "replays_per_pair"), 100_001),
        (("check", "official_trials"), 1001),
        (("check", "memory_limit_mb"), 2**20 + 1),
        (("check", "time_limit_s"), 86_401),
        (("check", "timing"), {"rounds": 10**30}),
        (("seeds",), list(range(1001))),
    ],
)
def test_every_count_in_the_config_has_an_upper_bound(path, value):
    cfg = copy.deepcopy(DEFAULT)
    node = cfg
    for key in path[:-1]:
        node = node.setdefault(key, {})
    node[path[-1]] = value
    key = ".".join(path)
    with pytest.raises(KbfuseError, match=f"config key {key}"):
        validate_schema(cfg)
        check_config(cfg, ROOT / "kernels")


@pytest.mark.parametrize(
    "given, message",
    [
        ({"official_trials": 1001}, "check.official_trials is 1001: at most 1000"),
        ({"timing": {"rounds": 10**30}}, f"check.timing.rounds is {10**30}: at most 10000"),
        ({"seeds": list(range(1001))}, "check.seeds has 1001 entries: at most 1000"),
        ({"time_limit_s": 1e9}, "check.time_limit_s is 1000000000.0: at most 86400"),
        ({"memory_limit_mb": 2**21}, "check.memory_limit_mb is 2097152: at most 1048576"),
    ],
)
def test_check_settings_bound_the_same_counts(given, message):
    with pytest.raises(KbfuseError, match=f"^{message}$".replace("(", r"\(").replace(")", r"\)")):
        spec.check_settings(given)


def test_verification_in_this_process_names_special_files_by_kind(folder):
    from kbfuse.results import manifest as m

    zero, fifo, other = _listed(folder)[-3:]
    (folder / zero).unlink()
    (folder / zero).symlink_to("/dev/zero")
    (folder / fifo).unlink()
    os.mkfifo(folder / fifo)
    (folder / other).write_text("not what was hashed")
    (folder / "sub").mkdir()
    (folder / "sub" / "linked").symlink_to("/")
    report = m.verify_manifest(folder, folder / "manifest.json", ignore=["manifest.json"])
    changed = {c["path"]: c for c in report["changed"]}
    assert changed[zero]["actual_sha256"] is None and changed[zero]["actual_bytes"] is None
    assert changed[zero]["not_hashed"] == "a symbolic link"
    assert changed[fifo]["not_hashed"] == "a FIFO"
    assert changed[other]["not_hashed"] == "size differs"
    assert changed[other]["actual_bytes"] == len("not what was hashed")
    assert report["extra"] == ["sub/linked"]
    assert report["ok"] is False


def test_found_records_hash_a_regular_file_of_the_listed_size_within_the_limit(tmp_path):
    from kbfuse.results import manifest as m

    path = tmp_path / "f"
    path.write_bytes(b"x" * 10)
    assert m.found_record(path, 10, 10) == m.file_record(path)
    assert m.found_record(path, 10, 9) == {
        "sha256": None,
        "bytes": 10,
        "not_hashed": "over 9 bytes",
    }
    assert m.found_record(path, 11, 100) == {
        "sha256": None,
        "bytes": 10,
        "not_hashed": "size differs",
    }
    big = tmp_path / "big"
    big.write_bytes(b"y" * (3 << 20))
    assert m.found_record(big, 3 << 20, 3 << 20) == m.file_record(big)
