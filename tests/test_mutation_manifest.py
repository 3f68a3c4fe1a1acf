"""The manifest's details that the bundle tests leave open (found by mutation testing,
docs/mutation.md): which survey files it lists, the pin record it quotes, and that
verification hashes only the files the manifest lists.
"""

from __future__ import annotations

import json

import pytest
from test_summary import make_config, write_study

from kbfuse.errors import KbfuseError
from kbfuse.results import manifest as m


def write(root, rel: str, text: str = "{}") -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_survey_files_are_the_records_and_the_summary_sorted(tmp_path):
    for rel in (
        "survey/kernelbench-defaults/tasks/9.json",
        "survey/kernelbench-defaults/tasks/10.json",
        "survey/tf32/tasks/1.json",
        "survey/summary/ratios.csv",
        "survey/summary/README.md",
        "survey/summary/where.png",
        "survey/summary/notes.txt",  # not a summary kind
        "survey/pins/53.json",  # pins are not survey files
        "survey/kernelbench-defaults/tasks/log/1.json",  # one level too deep
        "verify/53.json",
    ):
        write(tmp_path, rel)
    (tmp_path / "survey/tf32/tasks/folder.json").mkdir()  # a folder, not a file
    assert m.survey_files(tmp_path) == [
        "survey/kernelbench-defaults/tasks/10.json",
        "survey/kernelbench-defaults/tasks/9.json",
        "survey/summary/README.md",
        "survey/summary/ratios.csv",
        "survey/summary/where.png",
        "survey/tf32/tasks/1.json",
    ]
    assert m.survey_files(str(tmp_path / "verify")) == []


@pytest.fixture
def results(tmp_path):
    """A results folder of one study (valid records), its pin's commit and a checkout record
    that pins another commit."""
    root = tmp_path / "results"
    config = make_config(variants=("cupy-default",))
    write_study(root, config)
    pin = json.loads((root / m.PIN).read_text())
    write(root, m.CHECKOUT_PIN, json.dumps({**pin, "commit": "d" * 40}))
    write(root, "verify/53.json", json.dumps({"ok": True}))
    return root, config, pin


def test_a_survey_run_quotes_the_checkout_pin(results, tmp_path):
    root, config, pin = results
    out = tmp_path / "manifest.json"
    made = m.build_manifest(root, [root / "verify/53.json"], config, out, pin=m.CHECKOUT_PIN)
    assert made["kernelbench_pin"] == {**pin, "commit": "d" * 40}
    assert sorted(made["files"]) == [m.FINGERPRINT, m.CHECKOUT_PIN, "verify/53.json"]
    report = m.verify_manifest(root, out, ignore=["*"])
    assert report["pin"] == {"url": pin["url"], "commit": "d" * 40}
    assert report["manifest_problems"] == [] and report["ok"] is True


def test_the_study_quotes_its_pin_by_default(results, tmp_path):
    root, config, pin = results
    made = m.build_manifest(root, [], config, tmp_path / "manifest.json")
    assert made["kernelbench_pin"] == pin
    assert sorted(made["files"]) == [m.FINGERPRINT, m.PIN]


def test_an_unknown_pin_record_is_refused_before_any_file_is_read(results, tmp_path):
    out = tmp_path / "manifest.json"
    with pytest.raises(
        KbfuseError,
        match=r"^manifest pin record 'verify/53\.json': one of "
        r"\['kernelbench/pin\.json', 'kernelbench/checkout\.json'\]$",
    ):
        m.build_manifest(results[0], [], results[1], out, pin="verify/53.json")
    assert not out.exists()


def test_a_changed_checkout_pin_quote_is_named(results, tmp_path):
    root, config, pin = results
    out = tmp_path / "manifest.json"
    m.build_manifest(root, [], config, out, pin=m.CHECKOUT_PIN)
    write(root, m.CHECKOUT_PIN, json.dumps({**pin, "commit": "e" * 40}))
    report = m.verify_manifest(root, out, ignore=["*"])
    assert (
        "manifest field kernelbench_pin differs from kernelbench/checkout.json"
        in (report["manifest_problems"])
    )
    assert [c["path"] for c in report["changed"]] == [m.CHECKOUT_PIN]


def test_verification_hashes_only_the_files_the_manifest_lists(results, tmp_path, monkeypatch):
    root, config, _ = results
    out = tmp_path / "manifest.json"
    m.build_manifest(root, [root / "verify/53.json"], config, out)
    hashed = []
    record = m.found_record

    def spy(path, expected_bytes, limit):
        hashed.append(path.relative_to(root).as_posix())
        return record(path, expected_bytes, limit)

    monkeypatch.setattr(m, "found_record", spy)
    report = m.verify_manifest(root, out)
    assert sorted(hashed) == [m.FINGERPRINT, m.PIN, "verify/53.json"]
    assert m.CHECKOUT_PIN in report["extra"] and "verify/53.json" not in report["extra"]
    assert report["ok"] is False


def test_checking_the_quoted_config_leaves_the_manifest_as_it_was(results, tmp_path):
    """The config check fills defaults (kernelbench.level, each variant's fields) into what it
    checks; that must be a copy, nested levels included, or the manifest read back would no
    longer match its own content hash."""
    root, config, _ = results
    quoted = json.loads(json.dumps(config))
    del quoted["kernelbench"]["level"]  # filled in by the check
    out = tmp_path / "manifest.json"
    m.build_manifest(root, [], quoted, out)
    data, problems = m.load_manifest(out)
    assert problems == []
    assert "level" not in data["config"]["kernelbench"]
    assert data["config"] == quoted
    assert m.verify_manifest(root, out, ignore=["*"])["ok"] is True
