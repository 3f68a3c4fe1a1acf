"""kbfuse.workflow.studies: the second fused study's config, numerics and paths, on the CPU."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from kbfuse.errors import KbfuseError
from kbfuse.tasks.kernelbench import recorded_config
from kbfuse.workflow.config import check_config, load_config, validate_schema
from kbfuse.workflow.studies import (
    FUSED2_ROOT,
    INHERITED,
    StudyFiles,
    fused2_config,
    kernel_problems,
    numerics_for,
    numerics_problems,
)

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def config():
    return load_config(ROOT / "config/config.yaml", ROOT / "kernels")


def test_the_second_study_takes_the_top_levels_settings_and_its_own(config):
    second = fused2_config(config)
    block = config["fused2"]
    for key in INHERITED:
        assert second[key] == block.get(key, config[key]), key
    # its own baselines: the top level's and Inductor's max-autotune
    assert second["baselines"] == [*config["baselines"], "inductor-max-autotune-no-cudagraphs"]
    without = fused2_config(
        {**config, "fused2": {k: v for k, v in block.items() if k != "baselines"}}
    )
    assert without["baselines"] == config["baselines"]
    assert second["tasks"] == block["tasks"] == [4, 65]
    assert second["variants"] == block["variants"]
    assert second["controls"] == {
        **block["controls"],
        "witness81_inputs": config["controls"]["witness81_inputs"],
    }
    assert second["numerics"] == {"4": "kernelbench-defaults", "65": "strict"}
    assert second["survey_summary"] == "results/reference/h200/survey/survey/summary"
    validate_schema(copy.deepcopy(second))  # a study config like the first (manifests check it)
    assert fused2_config({k: v for k, v in config.items() if k != "fused2"}) is None


def test_the_first_studys_recorded_config_leaves_the_second_out(config):
    recorded = recorded_config(config)
    assert "fused2" not in recorded and "survey" not in recorded
    assert recorded_config(fused2_config(config))["tasks"] == [4, 65]


def test_numerics_per_task_or_for_every_task(config):
    second = fused2_config(config)
    assert (numerics_for(second, 4), numerics_for(second, "65")) == (
        "kernelbench-defaults",
        "strict",
    )
    assert numerics_for({**second, "numerics": "strict"}, 4) == "strict"
    assert numerics_for(config, 53) is None  # the first study: strict, recorded as before
    with pytest.raises(KbfuseError, match=r"names no mode for task 19 \(it names \['4', '65'\]\)"):
        numerics_for(second, 19)
    assert numerics_problems(second) == []
    assert numerics_problems({**second, "numerics": {"4": "strict"}}, "fused2.") == [
        "config key fused2.numerics: names tasks ['4'], the study runs ['4', '65']"
    ]


def test_a_per_task_numerics_mapping_must_name_the_studys_tasks(config):
    broken = copy.deepcopy(config)
    broken["fused2"]["numerics"] = {"4": "strict", "19": "strict"}
    with pytest.raises(KbfuseError, match=r"fused2\.numerics: names tasks \['4', '19'\]"):
        check_config(broken, ROOT / "kernels")


def test_every_source_must_define_its_studys_kernels(config):
    second = fused2_config(config)
    assert kernel_problems(second, ROOT / "kernels") == []
    swapped = copy.deepcopy(second)
    swapped["variants"] = {"v": {"route": "nvrtc-cubin", "kernel": "naive", "options": []}}
    assert kernel_problems(swapped, ROOT / "kernels", "fused2.") == [
        f"config key fused2.variants.v.kernel: {ROOT / 'kernels/naive.cu'} does not define "
        "tail4, tail65, stage65 (kernels of tasks [4, 65])"
    ]


def test_study_files_put_the_second_study_under_its_root(config):
    files = StudyFiles(fused2_config(config), FUSED2_ROOT)
    assert files.record("timing", task=65) == "results/fused2/timing/65.json"
    assert files.file("summary", name="contract.md") == "results/fused2/summary/contract.md"
    assert files.log("compile/v") == "results/fused2/logs/compile/v.log"
    assert files.task_pin(4) == "results/fused2/kernelbench/tasks/4.json"
    results = files.gpu_results()
    assert "results/fused2/controls/65.json" in results
    assert not [path for path in results if "witness81" in path]  # no task 81 here
    assert files.all_targets()[-2:] == [
        "results/fused2/manifest.json",
        "results/fused2/bundle/kbfuse-results.tar.gz",
    ]
    cpu = files.cpu_targets(lambda variant: variant != "cupy-default")
    assert "results/fused2/compile/cupy-default/meta.json" not in cpu
    assert "results/fused2/compile/fast-nvrtc-cubin-noftz/tails.bin" in cpu
