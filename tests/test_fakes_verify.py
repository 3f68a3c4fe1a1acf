"""The verify stage against a fake device whose artifacts can contradict their metadata.

The stand-in of test_gpu_verify's CPU part derives the "measured" FTZ from the metadata, so
its "no mismatch" cannot fail. Here each fake artifact has its own numerical mode, set apart
from the metadata (as a stale compute-cache cubin is), and the fake device computes the
witness product the way that mode would: 0 when it flushes, the float32 product when it keeps
subnormals. verify must report the disagreement; the record is built by the real code.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from kbfuse.checks import verify
from kbfuse.checks.numerics import f32_bits_hex
from kbfuse.errors import KbfuseError
from kbfuse.io import read_json, write_json

PRODUCT = float(np.float32(verify.WITNESS_INPUT) * np.float32(verify.WITNESS_SCALE))


def fake_device_output(mod) -> float:
    """witness_mul(1e-10, 1e-30) as the artifact's own mode computes it."""
    return 0.0 if mod.flushes else PRODUCT


@pytest.fixture
def fake_device(tmp_path, monkeypatch):
    """(write(name, options_ftz, artifact_flushes) -> (artifact, meta), tmp_path)."""
    modes: dict[Path, bool] = {}

    def load(artifact, meta, kernels=()):
        return SimpleNamespace(variant=meta["variant"], device=0, flushes=modes[Path(artifact)])

    monkeypatch.setattr(verify.LoadedModule, "load", staticmethod(load))
    monkeypatch.setattr(verify, "witness_output", fake_device_output)

    def write(name: str, options_ftz: bool | None, artifact_flushes: bool, route="nvrtc-cubin"):
        options = ["--std=c++11", "--fmad=false"]
        if options_ftz is not None:
            options.append(f"--ftz={str(options_ftz).lower()}")
        meta = {
            "kind": "compile",
            "variant": name,
            "route": route,
            "kernel": "tail_81",
            "requested_options": options,
            "actual_options": options,
            "implicit_options": [],
            "expected_ftz": bool(options_ftz),
            "artifact_sha256": "e" * 64,
        }
        artifact = tmp_path / name / "tails.bin"
        write_json(tmp_path / name / "meta.json", meta)
        modes[artifact] = artifact_flushes
        return artifact, tmp_path / name / "meta.json"

    return write, tmp_path


def test_an_artifact_that_flushes_against_its_metadata_is_a_mismatch(fake_device):
    write, root = fake_device
    artifact, meta = write("stale", options_ftz=False, artifact_flushes=True)
    out = root / "verify" / "stale.json"
    record = verify.verify_variant(artifact, meta, root, None, out)
    assert record["expected_ftz"] is False and record["effective_ftz"] is True
    assert record["mismatch"] is True and record["requested_mismatch"] is True
    assert record["witness"]["output"] == 0.0 and record["witness"]["subnormal_kept"] is False
    assert record["finding"] == (
        "stale: options request FTZ off, but the artifact flushes subnormals to zero (actual "
        "options: --std=c++11 --fmad=false --ftz=false); stale: the options actually passed "
        "imply FTZ off, but the loaded artifact flushes subnormals to zero on the device; the "
        "artifact does not match its compile options (a CUDA compute-cache entry from another "
        "FTZ setting is one known cause: see cuda_cache)"
    )
    assert read_json(out) == record


def test_an_artifact_that_keeps_subnormals_against_its_metadata_is_a_mismatch(fake_device):
    write, root = fake_device
    artifact, meta = write("lost-ftz", options_ftz=True, artifact_flushes=False)
    record = verify.verify_variant(artifact, meta, root, None, root / "v.json")
    assert record["expected_ftz"] is True and record["effective_ftz"] is False
    assert record["mismatch"] is True and record["requested_mismatch"] is True
    assert record["witness"]["output_bits"] == f32_bits_hex(PRODUCT)
    assert "but the loaded artifact keeps subnormals on the device" in record["finding"]


def test_unrequested_flushing_is_a_requested_mismatch_only(fake_device):
    """Options naming no FTZ request the default (off); an artifact that flushes anyway
    contradicts the request, and here its expected FTZ too."""
    write, root = fake_device
    artifact, meta = write("silent", options_ftz=None, artifact_flushes=True)
    record = verify.verify_variant(artifact, meta, root, None, root / "v.json")
    assert record["requested_ftz"] is None
    assert record["requested_mismatch"] is False  # nothing was requested
    assert record["mismatch"] is True
    assert record["finding"].startswith("silent: options do not request FTZ, but the artifact")


def test_agreeing_and_disagreeing_artifacts_in_one_job(fake_device):
    write, root = fake_device
    variants = {
        "keep": write("keep", options_ftz=False, artifact_flushes=False),
        "stale": write("stale", options_ftz=False, artifact_flushes=True),
        "flush": write("flush", options_ftz=True, artifact_flushes=True),
    }
    outs = {name: root / "out" / f"{name}.json" for name in variants}
    records = verify.verify_variants(variants, root, None, outs)
    assert {n: r["mismatch"] for n, r in records.items()} == {
        "keep": False,
        "stale": True,
        "flush": False,
    }
    assert {n: r["effective_ftz"] for n, r in records.items()} == {
        "keep": False,
        "stale": True,
        "flush": True,
    }
    assert records["keep"]["finding"] is None and records["flush"]["finding"] is None
    assert all(r["task81"] == [] for r in records.values())
    assert records["keep"]["task81_note"] == (
        "task 81 is not in the study: no task-81 tail witness was run"
    )


def test_witness_record_reads_zero_as_flushed_and_the_product_as_kept():
    flushed_record, flushed = verify.witness_record(0.0, "v")
    assert flushed is True and flushed_record["subnormal_kept"] is False
    assert flushed_record["output_bits"] == "0x00000000"
    kept_record, kept = verify.witness_record(PRODUCT, "v")
    assert kept is False and kept_record["subnormal_kept"] is True
    assert kept_record["output_bits"] == kept_record["host_product_bits"] == f32_bits_hex(PRODUCT)
    assert kept_record["input_bits"] == f32_bits_hex(verify.WITNESS_INPUT)
    assert kept_record["scale_bits"] == f32_bits_hex(verify.WITNESS_SCALE)
    negative_zero, flushed = verify.witness_record(-0.0, "v")
    assert flushed is True and negative_zero["output_bits"] == "0x80000000"


@pytest.mark.parametrize("output", [float("nan"), 1.0, 2 * PRODUCT])
def test_a_witness_that_is_neither_zero_nor_the_product_is_refused(output):
    with pytest.raises(KbfuseError, match=r"variant 'odd': witness_mul\(1e-10, 1e-30\) gave"):
        verify.witness_record(output, "odd")
