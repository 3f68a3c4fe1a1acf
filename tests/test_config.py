"""Config rejection: every invalid config is refused before any job, naming key and value."""

from __future__ import annotations

import copy
import re
import shutil
from pathlib import Path

import pytest
import yaml
from conftest import ROOT, snakemake

from kbfuse.errors import KbfuseError
from kbfuse.workflow.config import check_config, load_config, validate_schema, variant_spec

DEFAULT = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
KERNELS = ROOT / "kernels"


def _set(cfg: dict, dotted: str, value) -> dict:
    node = cfg
    *parents, last = dotted.split(".")
    for key in parents:
        node = node[key]
    if value is _DELETE:
        del node[last]
    else:
        node[last] = value
    return cfg


_DELETE = object()
NRTC = ["--std=c++11", "--fmad=false"]

# (id, dotted key, new value, words the message must contain)
BAD_CONFIGS = [
    ("unknown-task", "tasks", [53, 19], ["tasks[1]", "19"]),
    ("task-without-tail", "tasks", [54], ["tasks[0]", "54"]),
    ("no-tasks", "tasks", [], ["tasks", "[]"]),
    ("negative-seed", "seeds", [0, -1], ["seeds[1]", "-1"]),
    ("duplicate-seed", "seeds", [0, 1, 1], ["seeds", "[0, 1, 1]", "non-unique"]),
    (
        "unknown-distribution",
        "distributions",
        ["uniform", "cauchy"],
        ["distributions[1]", "cauchy"],
    ),
    (
        "unknown-route",
        "variants.bad",
        {"route": "nvrtc-fatbin", "options": NRTC},
        ["variants.bad.route", "nvrtc-fatbin"],
    ),
    (
        "option-contradicts-route",
        "variants.bad",
        {"route": "nvrtc-cubin", "options": [*NRTC, "-arch=sm_80"]},
        ["variants.bad.options", "-arch=sm_80"],
    ),
    (
        "option-contradicts-itself",
        "variants.bad",
        {"route": "nvrtc-cubin", "options": [*NRTC, "--ftz=true", "--ftz=false"]},
        ["variants.bad.options", "--ftz"],
    ),
    (
        "option-given-twice",
        "variants.bad",
        {"route": "nvrtc-ptx", "options": [*NRTC, "--fmad=false"]},
        ["variants.bad.options", "--fmad=false"],
    ),
    (
        "option-not-a-flag",
        "variants.bad",
        {"route": "nvrtc-ptx", "options": ["ftz=true"]},
        ["variants.bad.options[0]", "ftz=true"],
    ),
    (
        "missing-kernel-source",
        "variants.bad",
        {"route": "nvrtc-ptx", "kernel": "nosuch", "options": NRTC},
        ["variants.bad.kernel", "nosuch"],
    ),
    (
        "bad-variant-name",
        "variants.Bad_Name",
        {"route": "nvrtc-ptx", "options": NRTC},
        ["variants", "Bad_Name"],
    ),
    (
        "retired-tolerance",
        "tolerance",
        {"atol": 1e-4, "rtol": 1e-4},
        ["config key tolerance: no longer a setting", "pinned KernelBench"],
    ),
    ("negative-seed", "seeds", [-1], ["seeds[0]", "-1"]),
    ("zero-rounds", "timing.rounds", 0, ["timing.rounds", "0"]),
    ("zero-invocations", "timing.invocations_per_pair", 0, ["timing.invocations_per_pair", "0"]),
    ("malformed-commit", "kernelbench.commit", "423217d9", ["kernelbench.commit", "423217d9"]),
    ("uppercase-commit", "kernelbench.commit", "A" * 40, ["kernelbench.commit", "A" * 40]),
    ("bad-arch", "arch", "sm90", ["arch", "sm90"]),
    ("arch-compute", "arch", "compute_90", ["arch", "compute_90"]),
    ("no-eager-baseline", "baselines", ["inductor"], ["baselines", "inductor"]),
    ("unknown-baseline", "baselines", ["eager", "tvm"], ["baselines[1]", "tvm"]),
    ("unknown-key", "colour", "blue", ["colour"]),
    ("missing-url", "kernelbench.url", _DELETE, ["kernelbench", "url"]),
    ("empty-tiny-range", "controls.tiny_values.low", -50.0, ["controls.tiny_values", "-50.0"]),
    ("seeds-not-a-list", "seeds", "0-4", ["seeds", "0-4"]),
]


@pytest.mark.parametrize(
    "key,value,words", [c[1:] for c in BAD_CONFIGS], ids=[c[0] for c in BAD_CONFIGS]
)
def test_invalid_config_is_rejected_naming_key_and_value(key, value, words):
    cfg = _set(copy.deepcopy(DEFAULT), key, value)
    with pytest.raises(KbfuseError, match=re.escape(words[0])) as err:
        validate_schema(cfg)
        check_config(cfg, KERNELS)
    message = str(err.value)
    for word in words:
        assert word in message, f"{word!r} not in {message!r}"


def test_corpus_is_large_enough():
    assert len(BAD_CONFIGS) >= 15


def test_default_config_is_valid_and_resolves_variants():
    cfg = load_config(ROOT / "config" / "config.yaml", KERNELS)
    assert cfg["kernelbench"]["level"] == 2
    spec = variant_spec(cfg, "nvrtc-cubin-noftz")
    assert spec == {
        "name": "nvrtc-cubin-noftz",
        "route": "nvrtc-cubin",
        "kernel": "naive",
        "options": ["--std=c++11", "--fmad=false", "--ftz=false"],
    }
    with pytest.raises(KbfuseError, match="unknown variant 'nope'"):
        variant_spec(cfg, "nope")


@pytest.mark.parametrize("case", ["unknown-task", "option-contradicts-itself", "malformed-commit"])
def test_snakemake_refuses_bad_config_before_any_job(workflow_copy, case):
    workdir, overlay = workflow_copy
    _, key, value, words = next(c for c in BAD_CONFIGS if c[0] == case)
    cfg = _set(copy.deepcopy(DEFAULT), key, value)
    bad = workdir / "bad.yaml"
    bad.write_text(yaml.safe_dump(cfg))
    proc = snakemake(workdir, "--cores", "1", "cpu", "--configfile", str(bad), check=False)
    assert proc.returncode != 0
    out = proc.stdout + proc.stderr
    for word in words:
        assert word in out
    assert not (workdir / "results").exists(), "a job ran although the config was invalid"
    assert not list(Path(workdir).glob(".snakemake/incomplete/*"))


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    blocks = [b.split("```", 1)[0].strip() for b in readme.split("```bash\n")[1:]]
    test_command = next(b for b in blocks if "pytest" in b)
    study_command = next(b for b in blocks if "snakemake --cores 1 all" in b)
    assert test_command in ci.splitlines()
    assert study_command.startswith("python3 -m venv .venv && ")


@pytest.mark.parametrize(
    ("source", "words"),
    [
        ('#include "gone.cuh"\n', ["variants.bad.kernel", "gone.cuh does not exist"]),
        ("// no launch line\n", ["variants.bad.kernel", "needs exactly one '// kbfuse-launch"]),
        ("// kbfuse-launch: per-element threads=4096\n", ["variants.bad.kernel", "threads=4096"]),
    ],
)
def test_bad_kernel_source_is_named_before_any_job(tmp_path, source, words):
    kernels = tmp_path / "kernels"
    shutil.copytree(KERNELS, kernels)
    (kernels / "bad.cu").write_text(source)
    cfg = copy.deepcopy(DEFAULT)
    cfg["variants"]["bad"] = {"route": "nvrtc-cubin", "kernel": "bad", "options": NRTC}
    with pytest.raises(KbfuseError, match=re.escape(words[0])) as err:
        check_config(cfg, kernels)
    for word in words:
        assert word in str(err.value)
