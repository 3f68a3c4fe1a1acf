"""Checks whose boundary a planted bug once slipped past: same-size edits, equal bounds.

- a results file edited in place without changing its size must still be refused by
  make_bundle and named by verify_manifest (the sha256, not the size, catches it);
- the tiny-value range needs low strictly below high: `low == high` is refused.
"""

from __future__ import annotations

import json

import pytest
from test_bundle import result_files
from test_summary import make_config, write_study

from kbfuse.checks.controls import check_controls_cfg
from kbfuse.errors import KbfuseError
from kbfuse.results.bundle import make_bundle
from kbfuse.results.manifest import build_manifest, verify_manifest

CONTROLS = {
    "small_shape": {"batch": 128, "in_features": 1024, "out_features": 1024},
    "tiny_values": {"low": -110.0, "high": -60.0, "dense_count": 1048576},
    "ftz_cost": {"rounds": 35, "replays_per_pair": 10},
}


@pytest.fixture
def study(tmp_path):
    """(results dir, manifest path) of one small complete study."""
    config = make_config(variants=("nvrtc-cubin-noftz",))
    root = tmp_path / "results"
    write_study(root, config)
    manifest = tmp_path / "manifest.json"
    build_manifest(root, result_files(root, config), config, manifest)
    return root, manifest


def _same_size_edit(path) -> tuple[bytes, bytes]:
    original = path.read_bytes()
    i = len(original) // 2
    edited = original[:i] + bytes([original[i] ^ 0x01]) + original[i + 1 :]
    path.write_bytes(edited)
    return original, edited


def test_make_bundle_refuses_a_same_size_edit(study, tmp_path):
    root, manifest = study
    original, edited = _same_size_edit(root / "timing/81.json")
    assert len(original) == len(edited) and original != edited
    with pytest.raises(KbfuseError, match=r"timing/81.json changed since .*manifest.json"):
        make_bundle(root, manifest, tmp_path / "b.tar.gz")
    assert not (tmp_path / "b.tar.gz").exists()


def test_verify_manifest_names_a_same_size_edit(study):
    root, manifest = study
    _same_size_edit(root / "timing/81.json")
    report = verify_manifest(root, manifest)
    assert report["ok"] is False
    assert [c["path"] for c in report["changed"]] == ["timing/81.json"]
    change = report["changed"][0]
    assert change["expected_bytes"] == change["actual_bytes"]
    assert change["expected_sha256"] != change["actual_sha256"]


def test_an_unchanged_study_bundles(study, tmp_path):
    root, manifest = study
    assert verify_manifest(root, manifest)["ok"] is True
    assert make_bundle(root, manifest, tmp_path / "b.tar.gz").is_file()


def _tiny(low, high) -> dict:
    cfg = json.loads(json.dumps(CONTROLS))
    cfg["tiny_values"].update(low=low, high=high)
    return cfg


@pytest.mark.parametrize("value", [-80.0, -1e-38, 0.0])
def test_tiny_values_refuse_low_equal_to_high(value):
    with pytest.raises(KbfuseError, match=f"low {value!r} must be below high {value!r}"):
        check_controls_cfg(_tiny(value, value))


def test_tiny_values_accept_a_high_just_above_low():
    cfg = check_controls_cfg(_tiny(-80.0, -79.99999))
    assert cfg["tiny_values"]["low"] == -80.0 and cfg["tiny_values"]["high"] == -79.99999
