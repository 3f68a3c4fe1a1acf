"""Issues 12, 13, 18: a config from someone else, and `--config` overrides as users write them.

Refused before any job, one line per problem naming key and value, never the whole config:
repeated YAML keys, non-finite numbers, blank URLs, unsafe or over-long variant names,
architectures the compiler would refuse, integers written as floats. Accepted: every key
config/README.md documents, overridden with `--config` as Snakemake parses it (strings from
YAML's base loader) and `1e-4` in a YAML overlay.
"""

from __future__ import annotations

import copy
import re
import shlex
from pathlib import Path

import pytest
import yaml
from conftest import ROOT, snakemake
from snakemake.cli import parse_config
from snakemake.utils import update_config

from kbfuse.compilation import nvrtc
from kbfuse.compilation.compile import ARCH_REGEX
from kbfuse.errors import KbfuseError
from kbfuse.workflow.config import (
    SCHEMA,
    check_config,
    check_config_files,
    load_config,
    read_config_file,
    validate_schema,
)

DEFAULT = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
KERNELS = ROOT / "kernels"
COMMIT = "0123456789abcdef0123456789abcdef01234567"


def checked(cfg: dict) -> dict:
    validate_schema(cfg)
    check_config(cfg, KERNELS)
    return cfg


def overridden(*entries: str) -> dict:
    """The default config with `--config` entries applied exactly as Snakemake applies them."""
    cfg = copy.deepcopy(DEFAULT)
    update_config(cfg, parse_config(list(entries)))
    return cfg


def at(cfg: dict, path: tuple):
    for key in path:
        cfg = cfg[key]
    return cfg


# --- --config overrides of every documented key -----------------------------------------------

# (documented key, --config entry, path of the value, value after the check)
OVERRIDES = [
    (
        "kernelbench.url",
        "kernelbench={url: /srv/KernelBench.git}",
        ("kernelbench", "url"),
        "/srv/KernelBench.git",
    ),
    ("kernelbench.commit", f"kernelbench={{commit: {COMMIT}}}", ("kernelbench", "commit"), COMMIT),
    ("kernelbench.level", "kernelbench={level: 2}", ("kernelbench", "level"), 2),
    ("tasks", "tasks=[81]", ("tasks",), [81]),
    ("seeds", "seeds=[0, 7]", ("seeds",), [0, 7]),
    ("distributions", "distributions=[normal, uniform]", ("distributions",), ["normal", "uniform"]),
    ("arch", "arch=sm_90", ("arch",), "sm_90"),
    (
        "variants.<name>.route",
        "variants={mine: {route: nvrtc-ptx, options: [--ftz=true]}}",
        ("variants", "mine", "route"),
        "nvrtc-ptx",
    ),
    (
        "variants.<name>.kernel",
        "variants={mine: {route: nvrtc-cubin, kernel: fast, options: []}}",
        ("variants", "mine", "kernel"),
        "fast",
    ),
    (
        "variants.<name>.options",
        "variants={nvrtc-cubin-ftz: {options: [--std=c++11, --fmad=false, --ftz=true, -DTILE=4]}}",
        ("variants", "nvrtc-cubin-ftz", "options"),
        ["--std=c++11", "--fmad=false", "--ftz=true", "-DTILE=4"],
    ),
    (
        "variants.<name>.nvrtc",
        "variants={nvrtc-ptx-ftz: {nvrtc: '12.9'}}",
        ("variants", "nvrtc-ptx-ftz", "nvrtc"),
        "12.9",
    ),
    ("nvrtc_versions", "nvrtc_versions=['12.9', '13']", ("nvrtc_versions",), ["12.9", "13"]),
    ("baselines", "baselines=[eager]", ("baselines",), ["eager"]),
    (
        "baselines",
        "baselines=[eager, inductor, inductor-max-autotune-no-cudagraphs]",
        ("baselines",),
        ["eager", "inductor", "inductor-max-autotune-no-cudagraphs"],
    ),
    ("numerics", "numerics=kernelbench-defaults", ("numerics",), "kernelbench-defaults"),
    ("survey_summary", "survey_summary=/srv/survey", ("survey_summary",), "/srv/survey"),
    ("timing.warmup", "timing={warmup: 2}", ("timing", "warmup"), 2),
    ("timing.rounds", "timing={rounds: 3}", ("timing", "rounds"), 3),
    (
        "timing.invocations_per_pair",
        "timing={invocations_per_pair: 1}",
        ("timing", "invocations_per_pair"),
        1,
    ),
    ("timing.order_seed", "timing={order_seed: 0}", ("timing", "order_seed"), 0),
    ("timing.input_seed", "timing={input_seed: 7}", ("timing", "input_seed"), 7),
    (
        "controls.small_shape",
        "controls={small_shape: {batch: 64}}",
        ("controls", "small_shape", "batch"),
        64,
    ),
    (
        "controls.tiny_values",
        "controls={tiny_values: {low: -1.5e2}}",
        ("controls", "tiny_values", "low"),
        -150.0,
    ),
    (
        "controls.ftz_cost",
        "controls={ftz_cost: {rounds: 5}}",
        ("controls", "ftz_cost", "rounds"),
        5,
    ),
    (
        "controls.witness81_inputs",
        "controls={witness81_inputs: [-88, -1e1]}",
        ("controls", "witness81_inputs"),
        [-88, -10.0],
    ),
    ("fused2.tasks", "fused2={tasks: [65, 4]}", ("fused2", "tasks"), [65, 4]),
    (
        "fused2.variants",
        "fused2={variants: {mine: {route: nvrtc-ptx, kernel: fused2_fast, options: []}}}",
        ("fused2", "variants", "mine", "kernel"),
        "fused2_fast",
    ),
    ("fused2.numerics", "fused2={numerics: strict}", ("fused2", "numerics"), "strict"),
    (
        "fused2.baselines",
        "fused2={baselines: [eager, torchscript]}",
        ("fused2", "baselines"),
        ["eager", "torchscript"],
    ),
    (
        "fused2.survey_summary",
        "fused2={survey_summary: /srv/survey}",
        ("fused2", "survey_summary"),
        "/srv/survey",
    ),
    (
        "fused2.controls",
        "fused2={controls: {small_shape: {batch: 4}}}",
        ("fused2", "controls", "small_shape", "batch"),
        4,
    ),
    ("check.folder", "check={folder: mine}", ("check", "folder"), "mine"),
    ("check.in_manifest", "check={in_manifest: true}", ("check", "in_manifest"), True),
    ("check.unsandboxed", "check={unsandboxed: true}", ("check", "unsandboxed"), True),
    ("check.witness_cache", "check={witness_cache: wc}", ("check", "witness_cache"), "wc"),
    ("check.time_limit_s", "check={time_limit_s: 30}", ("check", "time_limit_s"), 30),
    ("check.memory_limit_mb", "check={memory_limit_mb: 512}", ("check", "memory_limit_mb"), 512),
    (
        "check.gpu_memory_fraction",
        "check={gpu_memory_fraction: 0.25}",
        ("check", "gpu_memory_fraction"),
        0.25,
    ),
    ("check.official_trials", "check={official_trials: 1}", ("check", "official_trials"), 1),
    ("check.seed", "check={seed: 7}", ("check", "seed"), 7),
    ("check.seeds", "check={seeds: [3, 4]}", ("check", "seeds"), [3, 4]),
    (
        "check.distributions",
        "check={distributions: [normal]}",
        ("check", "distributions"),
        ["normal"],
    ),
    ("check.baselines", "check={baselines: [eager]}", ("check", "baselines"), ["eager"]),
    ("check.numerics", "check={numerics: strict}", ("check", "numerics"), "strict"),
    ("check.timing", "check={timing: {rounds: 4}}", ("check", "timing", "rounds"), 4),
    ("audit.corpus", "audit={corpus: null}", ("audit", "corpus"), None),
    ("audit.mapping", "audit={mapping: cuda_l1}", ("audit", "mapping"), "cuda_l1"),
    ("audit.name", "audit={name: h100}", ("audit", "name"), "h100"),
    ("audit.references", "audit={references: corpus}", ("audit", "references"), "corpus"),
    ("audit.limit", "audit={limit: 5}", ("audit", "limit"), 5),
    ("audit.tasks", "audit={tasks: [2, 53]}", ("audit", "tasks"), [2, 53]),
    (
        "audit.numerics",
        "audit={numerics: [kernelbench-defaults, strict]}",
        ("audit", "numerics"),
        ["kernelbench-defaults", "strict"],
    ),
    ("audit.in_manifest", "audit={in_manifest: true}", ("audit", "in_manifest"), True),
    ("survey.level", "survey={level: 3}", ("survey", "level"), 3),
    ("survey.tasks", "survey={tasks: [1, 53, 81]}", ("survey", "tasks"), [1, 53, 81]),
    ("survey.semantics", "survey={semantics: eval}", ("survey", "semantics"), "eval"),
    ("survey.numerics", "survey={numerics: [strict]}", ("survey", "numerics"), ["strict"]),
    (
        "survey.baselines",
        "survey={baselines: [eager, inductor-max-autotune-no-cudagraphs]}",
        ("survey", "baselines"),
        ["eager", "inductor-max-autotune-no-cudagraphs"],
    ),
    ("survey.device", "survey={device: cpu}", ("survey", "device"), "cpu"),
    ("survey.seed", "survey={seed: 7}", ("survey", "seed"), 7),
    ("survey.order_seed", "survey={order_seed: 0}", ("survey", "order_seed"), 0),
    ("survey.warmup", "survey={warmup: 1}", ("survey", "warmup"), 1),
    ("survey.rounds", "survey={rounds: 4}", ("survey", "rounds"), 4),
    (
        "survey.invocations_per_pair",
        "survey={invocations_per_pair: 2}",
        ("survey", "invocations_per_pair"),
        2,
    ),
    ("survey.cold_l2", "survey={cold_l2: false}", ("survey", "cold_l2"), False),
    ("survey.profile", "survey={profile: false}", ("survey", "profile"), False),
    (
        "survey.exclude_outlier_devices",
        "survey={exclude_outlier_devices: true}",
        ("survey", "exclude_outlier_devices"),
        True,
    ),
    ("survey.min_sample_ms", "survey={min_sample_ms: null}", ("survey", "min_sample_ms"), None),
    (
        "survey.max_autotune_conv_backends",
        "survey={max_autotune_conv_backends: ATEN}",
        ("survey", "max_autotune_conv_backends"),
        "ATEN",
    ),
]


def documented_keys() -> set[str]:
    readme = (ROOT / "config" / "README.md").read_text()
    rows = [line for line in readme.splitlines() if line.startswith("| `")]
    return {key for row in rows for key in re.findall(r"`([^`]+)`", row.split("|")[1])}


def test_every_documented_key_has_an_override_case():
    assert documented_keys() == {case[0] for case in OVERRIDES}


@pytest.mark.parametrize(
    ("key", "entry", "path", "value"), OVERRIDES, ids=[c[0] for c in OVERRIDES]
)
def test_every_documented_key_can_be_overridden_with_config(key, entry, path, value):
    cfg = checked(overridden(entry))
    assert at(cfg, path) == value
    assert [type(v) for v in (at(cfg, path) if isinstance(value, list) else [at(cfg, path)])] == [
        type(v) for v in (value if isinstance(value, list) else [value])
    ]
    untouched = "rounds" if key == "timing.order_seed" else "order_seed"
    assert cfg["timing"][untouched] == DEFAULT["timing"][untouched]  # merged key by key


def test_yaml_1e_minus_4_in_an_overlay_is_a_number():
    overlay = yaml.safe_load("controls:\n  tiny_values:\n    low: -1e2\n    high: 1E+1\n")
    assert overlay["controls"]["tiny_values"]["low"] == "-1e2"  # YAML 1.1: no dot, a string
    cfg = copy.deepcopy(DEFAULT)
    update_config(cfg, overlay)
    tiny = checked(cfg)["controls"]["tiny_values"]
    assert (tiny["low"], tiny["high"]) == (-100.0, 10.0)


@pytest.mark.parametrize(
    ("entry", "words"),
    [
        ("tasks=81", ["config key tasks: 81 is invalid", "--config 'tasks=[53, 81]'"]),
        ("timing=25", ["config key timing: 25 is invalid", "timing={rounds: 25, warmup: 8}"]),
        ("tasks=[eighty-one]", ["config key tasks[0]: 'eighty-one' is invalid"]),
        (
            "controls={tiny_values: {low: .nan}}",
            ["config key controls.tiny_values.low: '.nan' is invalid"],
        ),
        (
            "controls={tiny_values: {low: -1e999}}",
            ["config key controls.tiny_values.low: -inf is not a finite number"],
        ),
        (
            "tolerance={atol: 1e-4, rtol: 1e-4}",
            ["config key tolerance: no longer a setting", "read from the pinned KernelBench"],
        ),
        ("timing={rounds: 2.5}", ["config key timing.rounds: '2.5' is invalid", "'integer'"]),
        ("timing={warmup: 0}", ["config key timing.warmup: 0 is invalid", "minimum of 1"]),
        (
            "survey={max_autotune_conv_backends: CUDNN}",
            ["config key survey.max_autotune_conv_backends: 'CUDNN' is invalid", "ATEN|TRITON"],
        ),
    ],
)
def test_bad_overrides_are_explained(entry, words):
    with pytest.raises(KbfuseError, match=r"^invalid config:\n  config key ") as err:
        checked(overridden(entry))
    for word in words:
        assert word in str(err.value)


def test_an_unknown_key_is_named_without_dumping_the_config():
    with pytest.raises(KbfuseError, match=r"^invalid config:\n  config key colour: unknown") as err:
        checked(overridden("colour=blue"))
    message = str(err.value)
    assert message == (
        "invalid config:\n  config key colour: unknown key (known here: kernelbench, tasks, "
        "seeds, distributions, arch, variants, nvrtc_versions, baselines, numerics, "
        "survey_summary, timing, check, audit, controls, fused2, survey)"
    )
    with pytest.raises(KbfuseError, match=r"config key timing\.rounds_: unknown key \(known"):
        checked(overridden("timing={rounds_: 3}"))


def test_a_long_value_is_shortened_in_the_message():
    cfg = copy.deepcopy(DEFAULT)
    cfg["seeds"] = list(range(-1, 5000))
    with pytest.raises(KbfuseError, match=r"config key seeds\[0\]: -1 is invalid") as err:
        checked(cfg)
    assert "config key seeds[0]: -1 is invalid" in str(err.value)
    cfg["seeds"] = "x" * 5000
    with pytest.raises(KbfuseError, match=r"config key seeds: 'xxx") as err:
        checked(cfg)
    assert len(str(err.value)) < 400


# --- duplicate keys -----------------------------------------------------------------------------

TWICE = """\
variants:
  nvrtc-cubin-noftz:
    route: nvrtc-cubin
    options: [--std=c++11, --fmad=false, --ftz=false]
  nvrtc-cubin-noftz:
    route: nvrtc-cubin
    options: [--std=c++11, --fmad=false, --ftz=true]
"""


def test_pyyaml_silently_keeps_the_last_of_a_repeated_key():
    """Why the files are re-read: a repeated variant turns `noftz` into an FTZ build."""
    loaded = yaml.safe_load(TWICE)
    assert loaded["variants"]["nvrtc-cubin-noftz"]["options"][-1] == "--ftz=true"


def test_a_repeated_key_in_a_config_file_is_refused(tmp_path):
    overlay = tmp_path / "overlay.yaml"
    overlay.write_text(TWICE)
    expected = (
        rf"config file {overlay}: key 'nvrtc-cubin-noftz' is given twice in one mapping "
        r"\(lines 2 and 5\)"
    )
    with pytest.raises(KbfuseError, match=expected):
        read_config_file(overlay)
    with pytest.raises(KbfuseError, match=r"^invalid config:\n  config file .*given twice"):
        check_config_files([ROOT / "config" / "config.yaml", overlay])
    top = tmp_path / "top.yaml"
    top.write_text("arch: sm_90\ntasks: [81]\narch: auto\n")
    with pytest.raises(KbfuseError, match=r"key 'arch' is given twice .*\(lines 1 and 3\)"):
        load_config(top, KERNELS)


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("- a\n- b\n", ["expected a mapping, got ['a', 'b']"]),
        ("a: [1\n", ["config file", "expected ',' or ']'"]),
        ("a: !!python/object:os.system x\n", ["could not determine a constructor"]),
    ],
)
def test_config_files_that_are_no_mapping_are_refused(tmp_path, text, words):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(
        KbfuseError, match=rf"^invalid config:\n  config file {re.escape(str(path))}: "
    ) as err:
        check_config_files([path])
    for word in words:
        assert word in str(err.value)
    assert "\n  " in str(err.value) and str(err.value).count("\n") == 1  # one line


def test_an_alias_bomb_is_refused_quickly(tmp_path):
    lines = ["a0: &a0 [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 9)]
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text("\n".join(lines) + "\n")  # 10**9 values once expanded, 1 KB on disk
    with pytest.raises(KbfuseError, match=r"bomb\.yaml: more than 100000 values once its YAML"):
        check_config_files([bomb])


def test_an_integer_key_is_explained():
    cfg = copy.deepcopy(DEFAULT)
    cfg["variants"][123] = {"route": "nvrtc-cubin", "options": []}
    with pytest.raises(KbfuseError, match=r"variants: key 123 is not a string \(in YAML, quote"):
        checked(cfg)


def test_the_default_config_file_has_no_repeated_key():
    check_config_files([ROOT / "config" / "config.yaml"])
    assert read_config_file(ROOT / "config" / "config.yaml") == DEFAULT


# --- values refused before any job ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "value", "words"),
    [
        (("controls", "tiny_values", "high"), float("nan"), ["tiny_values.high: nan is not"]),
        (("controls", "ftz_cost", "rounds"), float("inf"), ["ftz_cost.rounds: inf is not"]),
        (("controls", "tiny_values", "low"), float("-inf"), ["tiny_values.low: -inf is not"]),
        (("controls", "witness81_inputs"), [-88.0, float("nan")], ["witness81_inputs[1]: nan"]),
        (("timing", "rounds"), 25.0, ["timing.rounds: 25.0 is invalid", "'integer'"]),
        (("seeds",), [0, True], ["seeds[1]: True is invalid"]),
        (("arch",), "sm_90\n", ["arch: 'sm_90\\n' contains a control character"]),
        (("arch",), "sm_99", ["arch: 'sm_99' is invalid", "a real architecture"]),
        (("arch",), "sm_90x", ["arch: 'sm_90x' is invalid"]),
        (("arch",), "sm_\u0669\u0660", ["arch: 'sm_\u0669\u0660' is invalid"]),
        (("kernelbench", "commit"), COMMIT + "\n", ["commit: '0123", "control character"]),
    ],
)
def test_values_the_jobs_would_refuse_are_refused_first(path, value, words):
    cfg = copy.deepcopy(DEFAULT)
    at(cfg, path[:-1])[path[-1]] = value
    with pytest.raises(KbfuseError, match=r"^invalid config:\n  config key ") as err:
        checked(cfg)
    for word in words:
        assert word in str(err.value)


@pytest.mark.parametrize(
    "url", ["", " ", "\t", " https://x/k.git", "/srv/k.git ", "-uhack", "a\nb"]
)
def test_blank_or_odd_urls_are_refused(url):
    cfg = copy.deepcopy(DEFAULT)
    cfg["kernelbench"]["url"] = url
    with pytest.raises(KbfuseError, match=r"config key kernelbench\.url: "):
        checked(cfg)


@pytest.mark.parametrize("url", ["https://github.com/x/KernelBench.git", "/srv/k.git", "../kb"])
def test_ordinary_urls_are_accepted(url):
    cfg = copy.deepcopy(DEFAULT)
    cfg["kernelbench"]["url"] = url
    assert checked(cfg)["kernelbench"]["url"] == url


@pytest.mark.parametrize(
    "name", ["a" * 65, "../x", "a/b", "A", "\u00e4", "a b", "", "-a", "baselines", "a.b", "a_b"]
)
def test_unsafe_or_long_variant_names_are_refused(name):
    cfg = copy.deepcopy(DEFAULT)
    cfg["variants"][name] = {"route": "nvrtc-cubin", "options": []}
    with pytest.raises(KbfuseError, match=r"config key variants: "):
        checked(cfg)


def test_a_64_character_variant_name_is_accepted():
    cfg = copy.deepcopy(DEFAULT)
    cfg["variants"]["v" * 64] = {"route": "nvrtc-cubin", "options": []}
    assert "v" * 64 in checked(cfg)["variants"]


def test_the_schema_arch_pattern_is_the_compilers():
    schema = yaml.safe_load(SCHEMA.read_text())
    assert schema["properties"]["arch"]["pattern"] == f"^(auto|{ARCH_REGEX})$"


def test_every_architecture_this_nvrtc_supports_is_accepted():
    """NVRTC's own list (nvrtcGetSupportedArchs of the pip NVRTC, 13.0.88 in the test env)."""
    import ctypes

    lib = nvrtc.load_library().handle
    count = ctypes.c_int()
    assert lib.nvrtcGetNumSupportedArchs(ctypes.byref(count)) == 0
    archs = (ctypes.c_int * count.value)()
    assert lib.nvrtcGetSupportedArchs(archs) == 0
    assert 90 in list(archs)
    for arch in archs:
        cfg = copy.deepcopy(DEFAULT)
        cfg["arch"] = f"sm_{arch}"
        assert checked(cfg)["arch"] == f"sm_{arch}"


# --- through Snakemake: before any job, exit 1, one line per problem --------------------------


def test_snakemake_accepts_list_nested_and_1e4_overrides(workflow_copy):
    workdir, overlay = workflow_copy
    extra = workdir / "tiny.yaml"
    extra.write_text("controls:\n  tiny_values:\n    low: -1e2\n")
    proc = snakemake(
        workdir,
        *("-n", "--cores", "1", "cpu", "--configfile", str(overlay), str(extra)),
        *("--config", "tasks=[81]", "controls={tiny_values: {high: -6e1}}", "seeds=[0, 1]"),
    )
    assert "results/kernelbench/tasks/81.json" in proc.stdout
    assert "results/kernelbench/tasks/53.json" not in proc.stdout


def test_snakemake_refuses_a_repeated_key_before_any_job_in_one_line(workflow_copy):
    workdir, overlay = workflow_copy
    twice = workdir / "twice.yaml"
    twice.write_text(TWICE)
    proc = snakemake(
        workdir, "--cores", "1", "cpu", "--configfile", str(overlay), str(twice), check=False
    )
    assert proc.returncode == 1
    out = proc.stdout + proc.stderr
    ours = [line for line in out.splitlines() if not line.startswith(("Using workflow", "Config"))]
    assert ours == [
        "invalid config:",
        f"  config file {twice}: key 'nvrtc-cubin-noftz' is given twice in one mapping "
        "(lines 2 and 5): YAML would silently keep only the last",
    ]
    assert not (workdir / "results").exists()
    assert not Path(workdir / ".snakemake" / "incomplete").exists() or not list(
        (workdir / ".snakemake" / "incomplete").iterdir()
    )


def readme_config_examples() -> list[list[str]]:
    """The `--config` entries of each snakemake command in config/README.md."""
    readme = (ROOT / "config" / "README.md").read_text()
    examples = []
    for line in readme.splitlines():
        if line.startswith("snakemake ") and "--config" in line:
            words = shlex.split(line)
            examples.append(words[words.index("--config") + 1 :])
    return examples


def test_the_override_examples_of_the_config_readme_work():
    examples = readme_config_examples()
    assert len(examples) == 3
    for entries in examples:
        checked(overridden(*entries))
    cfg = checked(overridden(*examples[1]))
    assert cfg["controls"]["tiny_values"] == {"low": -100, "high": -60.0, "dense_count": 100001}


def test_missing_required_keys_are_each_named_once():
    cfg = copy.deepcopy(DEFAULT)
    for key in ("tasks", "seeds", "distributions"):
        del cfg[key]
    with pytest.raises(KbfuseError, match="config key tasks: missing") as err:
        validate_schema(cfg)
    lines = str(err.value).splitlines()[1:]
    assert lines == [
        "  config key tasks: missing (required)",
        "  config key seeds: missing (required)",
        "  config key distributions: missing (required)",
    ]
