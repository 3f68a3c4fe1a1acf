"""The verify stage: findings on the CPU, measured FTZ and the task-81 witness on the GPU.

The workflow verifies every variant in one job (`verify_variants`); `verify_variant` is that
call for one artifact, and each variant's file must not depend on which others share the job.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from test_gpu_launch import BASE_OPTIONS, compile_artifact, host_witness_product, pin_tasks

from kbfuse.checks.numerics import f32_bits_hex
from kbfuse.checks.verify import (
    REQUIRED_META_KEYS,
    describe_finding,
    verify_variant,
    verify_variants,
)
from kbfuse.compilation import cudacache
from kbfuse.errors import KbfuseError
from kbfuse.io import read_json, write_json

# --------------------------------------------------------------------------- CPU


def test_no_finding_when_requested_expected_and_effective_agree():
    for ftz in (False, True):
        opts = [f"--ftz={str(ftz).lower()}"]
        assert describe_finding("v", "nvrtc-cubin", ftz, ftz, ftz, opts, []) is None
    # nothing requested: the compilers' default, FTZ off
    assert describe_finding("v", "nvrtc-cubin", None, False, False, ["--fmad=false"], []) is None


def test_cupy_implicit_ftz_is_a_finding():
    finding = describe_finding(
        "cupy-default",
        "cupy-default",
        None,
        True,
        True,
        ["--std=c++11", "--fmad=false", "-ftz=true"],
        ["-ftz=true"],
    )
    assert finding == (
        "cupy-default: options do not request FTZ, but CuPy's implicit -ftz=true "
        "flushes subnormals to zero"
    )
    overridden = describe_finding(
        "cupy-noftz", "cupy-default", False, True, True, ["--ftz=false", "-ftz=true"], ["-ftz=true"]
    )
    assert overridden.startswith("cupy-noftz: options request FTZ off, but CuPy's implicit -ftz")


def test_artifact_that_contradicts_its_options_is_a_finding():
    finding = describe_finding("stale", "nvrtc-cubin", False, False, True, ["--ftz=false"], [])
    assert finding.startswith(
        "stale: options request FTZ off, but the artifact flushes subnormals to zero "
        "(actual options: --ftz=false); stale: the options actually passed imply FTZ off"
    )
    assert "compute-cache" in finding
    kept = describe_finding("odd", "nvrtc-ptx", True, True, False, ["--ftz=true"], [])
    assert "options request FTZ on, but the artifact keeps subnormals" in kept


def test_bad_metadata_fails_before_cuda_and_writes_no_result(tmp_path):
    meta = tmp_path / "meta.json"
    write_json(meta, {"kind": "env"})
    out, log = tmp_path / "verify.json", tmp_path / "verify.log"
    with pytest.raises(KbfuseError, match="is not a compile record"):
        verify_variant(tmp_path / "tails.bin", meta, tmp_path, None, out, log)
    assert not out.exists()
    assert "failed: compile metadata" in log.read_text()
    write_json(meta, {"kind": "compile", "variant": "v"})
    with pytest.raises(KbfuseError, match=r"lacks key\(s\) \['route', 'kernel'"):
        verify_variant(tmp_path / "tails.bin", meta, tmp_path, None, out, log)
    assert not out.exists()


def compile_meta(variant: str) -> dict:
    meta = {key: None for key in REQUIRED_META_KEYS}
    options = ["--std=c++11", "--ftz=false"]
    meta.update(kind="compile", variant=variant, route="nvrtc-cubin", kernel="naive")
    meta.update(requested_options=options, actual_options=options, implicit_options=[])
    meta.update(expected_ftz=False, artifact_sha256="0" * 64)
    return meta


def test_verify_variants_checks_every_metadata_file_before_cuda(tmp_path):
    metas = {name: tmp_path / name / "meta.json" for name in ("good", "bad")}
    write_json(metas["good"], compile_meta("good"))
    write_json(metas["bad"], {"kind": "compile", "variant": "bad"})
    variants = {name: (tmp_path / name / "tails.bin", meta) for name, meta in metas.items()}
    outs = {name: tmp_path / "verify" / f"{name}.json" for name in metas}
    log = tmp_path / "verify.log"
    with pytest.raises(KbfuseError, match=r"bad/meta.json lacks key\(s\) \['route'"):
        verify_variants(variants, tmp_path, None, outs, log)
    assert "failed: compile metadata" in log.read_text()
    write_json(metas["bad"], compile_meta("other"))
    with pytest.raises(KbfuseError, match="bad/meta.json is for variant 'other', not 'bad'"):
        verify_variants(variants, tmp_path, None, outs, log)
    with pytest.raises(KbfuseError, match="outs must map exactly the variants"):
        verify_variants(variants, tmp_path, None, {"good": outs["good"]}, log)
    with pytest.raises(KbfuseError, match="two variants share an output path"):
        verify_variants(variants, tmp_path, None, {"good": outs["good"], "bad": outs["good"]})
    with pytest.raises(KbfuseError, match="variants must be a non-empty mapping"):
        verify_variants({}, tmp_path, None, {}, log)
    assert not (tmp_path / "verify").exists()


@pytest.fixture
def cpu_verify(tmp_path, monkeypatch):
    """verify_variants on the CPU: modules, the witness and the task-81 tail are stand-ins
    (the witness "flushes" as the metadata expects), so the stage's plumbing is checked."""
    from kbfuse.checks import verify

    class FakeModule:
        device = 0

        def __init__(self, meta):
            self.variant, self.meta = meta["variant"], meta

    class FakeTask81:
        built = 0

        def __init__(self, checkout, pin, device):
            FakeTask81.built += 1

        def measure(self, mod):
            ref = "0x8007434c"
            bits = "0x80000000" if mod.meta["expected_ftz"] else ref
            record = {"input": -88.0, "output": 0.0, "output_bits": bits, "reference": 0.0}
            return [{**record, "reference_bits": ref, "bit_equal": bits == ref}]

    def witness(mod):
        flushed = mod.meta["expected_ftz"]
        output = 0.0 if flushed else 1e-40
        record = {"output": output, "output_bits": f32_bits_hex(output)}
        return {**record, "subnormal_kept": not flushed}, flushed

    monkeypatch.setattr(
        verify.LoadedModule, "load", staticmethod(lambda a, m, kernels=(): FakeModule(m))
    )
    monkeypatch.setattr(verify, "measure_witness", witness)
    monkeypatch.setattr(verify, "Task81Witness", FakeTask81)
    monkeypatch.setattr(verify, "read_pin", lambda path: {"tasks": {"81": {}}})
    variants = {}
    for name, ftz in (("keep", False), ("flush", True), ("keep-too", False)):
        meta = compile_meta(name)
        options = ["--std=c++11", f"--ftz={str(ftz).lower()}"]
        meta.update(requested_options=options, actual_options=options, expected_ftz=ftz)
        write_json(tmp_path / name / "meta.json", meta)
        variants[name] = (tmp_path / name / "tails.bin", tmp_path / name / "meta.json")
    return variants, FakeTask81


def test_verify_variants_on_a_cpu_stand_in_matches_single_variant_runs(cpu_verify, tmp_path):
    variants, task81 = cpu_verify
    outs = {name: tmp_path / "together" / f"{name}.json" for name in variants}
    log = tmp_path / "together.log"
    records = verify_variants(variants, tmp_path, tmp_path / "pin.json", outs, log)
    assert task81.built == 1  # one task-81 model for every variant
    assert list(records) == list(variants)
    assert {n: r["effective_ftz"] for n, r in records.items()} == {
        "keep": False,
        "flush": True,
        "keep-too": False,
    }
    assert all(r["finding"] is None and not r["mismatch"] for r in records.values())
    for name, (artifact, meta) in variants.items():
        alone = tmp_path / "alone" / f"{name}.json"
        assert (
            verify_variant(artifact, meta, tmp_path, tmp_path / "pin.json", alone)
            == (records[name])
        )
        assert outs[name].read_bytes() == alone.read_bytes(), name
    assert log.read_text().splitlines()[-3:] == [f"wrote {outs[n]}" for n in variants]


def test_verify_variants_writes_no_file_when_one_write_fails(cpu_verify, tmp_path, monkeypatch):
    from kbfuse import stage

    variants, _ = cpu_verify
    outs = {name: tmp_path / "out" / f"{name}.json" for name in variants}
    real_write = stage.write_json

    def failing_write(path, record):
        if Path(path).name == "keep-too.json":
            raise OSError("disk full")
        real_write(path, record)

    monkeypatch.setattr(stage, "write_json", failing_write)
    log = tmp_path / "verify.log"
    with pytest.raises(OSError, match="disk full"):
        verify_variants(variants, tmp_path, None, outs, log)
    assert not [p for p in (tmp_path / "out").rglob("*") if p.is_file()]
    assert log.read_text().splitlines()[-1] == "failed: disk full"


# --------------------------------------------------------------------------- GPU


@pytest.fixture(scope="module")
def verify_env(kb_repo, tmp_path_factory):
    root = tmp_path_factory.mktemp("gpu-verify")
    checkout, _, pin_path = pin_tasks(kb_repo, root)
    return root, checkout, pin_path


def run_verify(root, checkout, pin_path, name, artifact, meta):
    meta_path = root / name / "meta.json"
    out, log = root / "verify" / f"{name}.json", root / "verify" / f"{name}.log"
    record = verify_variant(artifact, meta_path, checkout, pin_path, out, log)
    saved = read_json(out)
    assert saved["effective_ftz"] == record["effective_ftz"]
    assert log.read_text().splitlines()[-1] == f"wrote {out}"
    assert meta["artifact_sha256"] == record["artifact_sha256"]
    return record, saved


@pytest.mark.gpu
def test_verify_noftz_cubin_keeps_subnormals_and_matches_eager(verify_env):
    root, checkout, pin_path = verify_env
    options = [*BASE_OPTIONS, "--ftz=false"]
    artifact, meta = compile_artifact(root, "noftz", "nvrtc-cubin", options)
    _, saved = run_verify(root, checkout, pin_path, "noftz", artifact, meta)
    assert saved["kind"] == "verify" and saved["variant"] == "noftz"
    assert saved["requested_ftz"] is False
    assert saved["expected_ftz"] is False
    assert saved["effective_ftz"] is False
    assert saved["mismatch"] is False and saved["requested_mismatch"] is False
    assert saved["finding"] is None
    witness = saved["witness"]
    assert witness["subnormal_kept"] is True
    assert witness["output_bits"] == f32_bits_hex(float(host_witness_product())) == "0x000116c2"
    assert [r["input"] for r in saved["task81"]] == [-88.0, -87.5]
    assert all(r["bit_equal"] for r in saved["task81"])
    assert saved["task81"][0]["reference"] == -2.6640246534862188e-37
    assert saved["task81"][0]["output"] == -2.6640246534862188e-37
    assert saved["task81_note"] is None
    assert saved["cuda_cache"] == cudacache.current_setting()


@pytest.mark.gpu
def test_verify_ftz_cubin_flushes(verify_env):
    root, checkout, pin_path = verify_env
    artifact, meta = compile_artifact(root, "ftz", "nvrtc-cubin", [*BASE_OPTIONS, "--ftz=true"])
    _, saved = run_verify(root, checkout, pin_path, "ftz", artifact, meta)
    assert (saved["requested_ftz"], saved["expected_ftz"], saved["effective_ftz"]) == (
        True,
        True,
        True,
    )
    assert saved["witness"]["output"] == 0.0 and saved["witness"]["subnormal_kept"] is False
    at88 = saved["task81"][0]
    assert at88["output_bits"] == "0x80000000" and at88["bit_equal"] is False
    assert at88["reference"] == -2.6640246534862188e-37
    assert saved["finding"] is None and saved["mismatch"] is False


@pytest.mark.gpu
def test_verify_cupy_default_reports_the_implicit_ftz(verify_env):
    root, checkout, pin_path = verify_env
    artifact, meta = compile_artifact(root, "cupy-default", "cupy-default", BASE_OPTIONS)
    assert "-ftz=true" in meta["implicit_options"]
    _, saved = run_verify(root, checkout, pin_path, "cupy-default", artifact, meta)
    assert saved["requested_ftz"] is None
    assert saved["expected_ftz"] is True and saved["effective_ftz"] is True
    assert saved["requested_mismatch"] is False and saved["mismatch"] is False
    assert saved["finding"] == (
        "cupy-default: options do not request FTZ, but CuPy's implicit -ftz=true "
        "flushes subnormals to zero"
    )


@pytest.mark.gpu
def test_verify_reports_an_artifact_that_contradicts_its_options(verify_env):
    """A flushing cubin whose metadata says --ftz=false: what a stale compute cache produces."""
    root, checkout, pin_path = verify_env
    artifact, meta = compile_artifact(root, "src-ftz", "nvrtc-cubin", [*BASE_OPTIONS, "--ftz=true"])
    stale = root / "stale"
    stale.mkdir()
    shutil.copy(artifact, stale / "tails.bin")
    options = [*BASE_OPTIONS, "--ftz=false"]
    meta = {
        **meta,
        "variant": "stale",
        "requested_options": options,
        "actual_options": options,
        "expected_ftz": False,
    }
    write_json(stale / "meta.json", meta)
    _, saved = run_verify(root, checkout, pin_path, "stale", stale / "tails.bin", meta)
    assert saved["effective_ftz"] is True
    assert saved["mismatch"] is True and saved["requested_mismatch"] is True
    assert saved["finding"].startswith("stale: options request FTZ off, but the artifact flushes")
    assert "the options actually passed imply FTZ off" in saved["finding"]


@pytest.mark.gpu
def test_verify_without_task81_records_why(verify_env):
    root, checkout, _ = verify_env
    artifact, meta = compile_artifact(root, "no81", "nvrtc-ptx", [*BASE_OPTIONS, "--ftz=false"])
    out = root / "verify" / "no81.json"
    record = verify_variant(artifact, root / "no81" / "meta.json", checkout, None, out)
    assert record["task81"] == []
    assert record["task81_note"] == "task 81 is not in the study: no task-81 tail witness was run"
    assert record["effective_ftz"] is False and record["finding"] is None


@pytest.mark.gpu
def test_one_job_for_every_variant_writes_what_single_variant_jobs_write(verify_env):
    """verify_variants (the workflow's job: every module in one process, one task-81 model)
    writes, byte for byte, the file verify_variant writes for each artifact alone."""
    root, checkout, pin_path = verify_env
    specs = {
        "all-cubin-noftz": ("nvrtc-cubin", [*BASE_OPTIONS, "--ftz=false"]),
        "all-cubin-ftz": ("nvrtc-cubin", [*BASE_OPTIONS, "--ftz=true"]),
        "all-ptx-ftz": ("nvrtc-ptx", [*BASE_OPTIONS, "--ftz=true"]),
        "all-cupy": ("cupy-default", BASE_OPTIONS),
    }
    variants = {}
    for name, (route, options) in specs.items():
        artifact, _ = compile_artifact(root, name, route, options)
        variants[name] = (artifact, root / name / "meta.json")
    outs = {name: root / "together" / f"{name}.json" for name in specs}
    log = root / "together.log"
    records = verify_variants(variants, checkout, pin_path, outs, log)
    assert list(records) == list(specs)
    for name, (artifact, meta_path) in variants.items():
        alone = root / "alone" / f"{name}.json"
        assert verify_variant(artifact, meta_path, checkout, pin_path, alone) == records[name]
        assert outs[name].read_bytes() == alone.read_bytes(), name
        assert f"wrote {outs[name]}" in log.read_text()
    effective = {name: record["effective_ftz"] for name, record in records.items()}
    assert effective == {
        "all-cubin-noftz": False,
        "all-cubin-ftz": True,
        "all-ptx-ftz": True,
        "all-cupy": True,
    }
    assert [r["bit_equal"] for r in records["all-cubin-noftz"]["task81"]] == [True, True]
    assert records["all-cubin-ftz"]["task81"][0]["output_bits"] == "0x80000000"
    assert records["all-cupy"]["finding"].startswith("all-cupy: options do not request FTZ")
