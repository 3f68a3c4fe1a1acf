"""Issue 7: the workflow's compile and verify against a poisoned CUDA compute cache (H200).

The "machine's default cache" is a CUDA_CACHE_PATH directory that the snakemake process and a
careless compiler share. It is poisoned with kernels/naive.cu compiled the opposite way
(NVRTC to a cubin in a process with a live driver, no isolation: first compile wins, the key
ignores --ftz). Then the workflow's own compile and verify rules run for the variants that
the poison would corrupt, and every artifact must show the requested effect.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import ROOT, copy_workflow, snakemake, write_test_config

from kbfuse.compilation import disasm
from kbfuse.io import read_json

pytestmark = pytest.mark.gpu

_CARELESS = """
import ctypes, sys
from pathlib import Path
from kbfuse.compilation import kernelsrc, nvrtc
ctypes.CDLL("libcuda.so.1").cuInit(0)   # a live driver, as in any GPU process
src, ftz, out = sys.argv[1:]
options = ["--std=c++11", "--fmad=false", f"--ftz={ftz}", "-arch=sm_90"]
res = nvrtc.compile_program(kernelsrc.load(src).text, options, "naive.cu")
Path(out).write_bytes(res.cubin)
"""

ISOLATION_PREFIXES = ("CUDA_CACHE", "CUPY_CACHE", "KBFUSE_PRIVATE")
NOFTZ = ["nvrtc-cubin-noftz", "nvrtc-ptx-noftz"]
FTZ = ["cupy-default", "nvrtc-cubin-ftz", "nvrtc-ptx-ftz"]
OPTS = ["--std=c++11", "--fmad=false"]


def _careless_cubin(cache: Path, ftz: str, out: Path) -> bytes:
    env = {k: v for k, v in os.environ.items() if not k.startswith(ISOLATION_PREFIXES)}
    env["CUDA_CACHE_PATH"] = str(cache)
    env["PYTHONPATH"] = str(ROOT / "src")
    proc = subprocess.run(
        [sys.executable, "-c", _CARELESS, str(ROOT / "kernels/naive.cu"), ftz, str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    return out.read_bytes()


def _variants(extra_nvcc: bool) -> dict:
    variants = {
        "cupy-default": {"route": "cupy-default", "options": OPTS},
        **{v: {"route": v.rsplit("-", 1)[0], "options": [*OPTS, "--ftz=false"]} for v in NOFTZ},
        **{v: {"route": v.rsplit("-", 1)[0], "options": [*OPTS, "--ftz=true"]} for v in FTZ[1:]},
    }
    if extra_nvcc:
        variants["nvcc-cubin-noftz"] = {"route": "nvcc-cubin", "options": [*OPTS, "--ftz=false"]}
        variants["nvcc-cubin-ftz"] = {"route": "nvcc-cubin", "options": [*OPTS, "--ftz=true"]}
    return variants


@pytest.mark.parametrize("poison_ftz", ["true", "false"])
def test_compile_and_verify_ignore_a_poisoned_default_cache(tmp_path, kb_repo, poison_ftz):
    cache = tmp_path / "default-compute-cache"
    poison = _careless_cubin(cache, poison_ftz, tmp_path / "poison.cubin")
    # The poison is live: a careless compile asking for the other setting gets it back.
    other = "false" if poison_ftz == "true" else "true"
    stale = _careless_cubin(cache, other, tmp_path / "careless.cubin")
    assert stale == poison, "the compute cache did not serve the stale cubin (hazard gone?)"

    has_nvcc = shutil.which("nvcc") is not None
    variants = _variants(has_nvcc)
    victims = (
        [v for v in variants if v.endswith("-noftz")]
        if poison_ftz == "true"
        else [v for v in variants if not v.endswith("-noftz")]
    )
    workdir = copy_workflow(tmp_path / "wf")
    overlay = write_test_config(workdir, *kb_repo, tasks=[81], arch="auto")
    cfg = yaml.safe_load(overlay.read_text())
    cfg["variants"] = variants
    overlay.write_text(yaml.safe_dump(cfg))
    # The workflow inherits the poisoned cache as its default (and no isolation of ours).
    env = {k: v for k, v in os.environ.items() if not k.startswith(ISOLATION_PREFIXES)}
    env["CUDA_CACHE_PATH"] = str(cache)
    targets = [f"results/verify/{v}.json" for v in victims]
    snakemake(workdir, "--cores", "1", *targets, "--configfile", str(overlay), env=env)
    for v in victims:
        meta = read_json(workdir / f"results/compile/{v}/meta.json")
        verify = read_json(workdir / f"results/verify/{v}.json")
        assert meta["cuda_cache"]["isolated"] is True
        assert verify["cuda_cache"]["isolated"] is True
        assert verify["effective_ftz"] is meta["expected_ftz"], (v, verify)
        assert verify["mismatch"] is False
        if meta["artifact_kind"] == "cubin":
            artifact = (workdir / f"results/compile/{v}/tails.bin").read_bytes()
            assert artifact != poison
            flushes_more = disasm.count_sass_ftz(artifact) > disasm.count_sass_ftz(poison)
            assert flushes_more is meta["expected_ftz"], v
