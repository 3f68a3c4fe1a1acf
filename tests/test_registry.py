"""kbfuse.tasks.registry holds each task fact once; the rest derives it.

The tasks with a fused tail, their kernel names and the witness task are written in
kbfuse.tasks.registry only: the tail registry implements exactly those tasks, the loaded kernel
names are derived from them, every kernel source defines the kernels of the study whose
variants compile it, and the config schema admits exactly those tasks.
"""

import re
from pathlib import Path

import pytest
import torch
import yaml

from kbfuse import layout
from kbfuse.compilation import launch
from kbfuse.errors import KbfuseError
from kbfuse.tasks import registry as tasks
from kbfuse.tasks import tails

ROOT = Path(__file__).resolve().parents[1]


def test_the_tail_registry_implements_exactly_the_tail_tasks():
    assert tuple(tails.TAILS) == tasks.TAIL_TASKS
    for task, tail in tails.TAILS.items():
        assert tail.task == task and tail.kernel == tasks.kernel_name(task)
    with pytest.raises(KbfuseError, match=r"^task 1 has no fused tail; tasks with tails: \[4, 53"):
        tails.tail_for(1)


def test_kernel_names_come_from_the_tail_tasks():
    assert launch.KERNEL_NAMES == ("tail53", "tail81", "tail95", "witness_mul")
    first = (*(tails.TAILS[t].kernel for t in tasks.STUDY_TASKS), tasks.WITNESS_KERNEL)
    assert first == tasks.KERNEL_NAMES == tasks.kernel_names(tasks.STUDY_TASKS)
    assert tasks.kernel_names(tasks.FUSED2_TASKS) == ("tail4", "tail65", "stage65", "witness_mul")
    for task, tail in tails.TAILS.items():
        expected = (tail.kernel,) if tail.stage_kernel is None else (tail.kernel, "stage65")
        assert tail.kernels() == expected
        assert tasks.kernel_names([task]) == (*tail.kernels(), tasks.WITNESS_KERNEL)
        assert (
            (tail.stage_kernel is not None) == (task in tasks.STAGED_TASKS) == (not tail.pointwise)
        )


def _study_sources() -> dict[str, tuple]:
    """kernels/<kernel>.cu -> the tasks of the study whose variants compile it."""
    config = yaml.safe_load((ROOT / "config/config.yaml").read_text())
    studies = [(config["tasks"], config["variants"])]
    studies.append((config["fused2"]["tasks"], config["fused2"]["variants"]))
    sources = {}
    for study_tasks, variants in studies:
        for spec in variants.values():
            sources.setdefault(f"{spec.get('kernel', 'naive')}.cu", tuple(study_tasks))
    return sources


def test_every_kernel_source_serves_one_study():
    assert _study_sources() == {
        "naive.cu": tasks.STUDY_TASKS,
        "fast.cu": tasks.STUDY_TASKS,
        "fused2_naive.cu": tasks.FUSED2_TASKS,
        "fused2_fast.cu": tasks.FUSED2_TASKS,
    }
    assert sorted(p.name for p in (ROOT / "kernels").glob("*.cu")) == sorted(_study_sources())


@pytest.mark.parametrize("source", sorted(_study_sources()), ids=str)
def test_every_kernel_source_defines_the_kernels_of_its_study(source):
    text = (ROOT / "kernels" / source).read_text()
    for name in tasks.kernel_names(_study_sources()[source]):
        pattern = rf'extern "C" __global__ void (__launch_bounds__\(\d+\) )?{name}\('
        assert re.search(pattern, text), (source, name)


def test_the_config_schema_admits_exactly_the_tail_tasks():
    schema = yaml.safe_load((ROOT / "workflow/schemas/config.schema.yaml").read_text())
    assert schema["properties"]["tasks"]["items"]["enum"] == list(tasks.TAIL_TASKS)
    fused2 = schema["properties"]["fused2"]["properties"]
    assert fused2["tasks"]["items"]["enum"] == list(tasks.TAIL_TASKS)
    assert schema["properties"]["kernelbench"]["properties"]["level"]["enum"] == [tasks.LEVEL]
    config = yaml.safe_load((ROOT / "config/config.yaml").read_text())
    assert config["controls"]["witness81_inputs"] == list(tasks.WITNESS_INPUTS)
    assert tuple(config["tasks"]) == tasks.STUDY_TASKS
    assert tuple(config["fused2"]["tasks"]) == tasks.FUSED2_TASKS


def test_the_witness_task_decides_the_witness_record():
    assert tasks.WITNESS_TASK in tasks.TAIL_TASKS
    assert layout.RECORDS["witness81"].needs_task == tasks.WITNESS_TASK


def test_tail_parameters_and_column_offsets():
    add = torch.zeros(3)
    model = torch.nn.Module()
    model.add_value = torch.nn.Parameter(add)
    assert tails.tail_for(95).tail_parameters(model) == {"add_value": model.add_value}
    assert tails.tail_for(95).column_offset(model) is model.add_value
    assert tails.tail_for(81).tail_parameters(model) == {}
    assert tails.tail_for(81).column_offset(model) is None


def test_literal_bounds_give_the_bounds_and_their_neighbours():
    values = tails.tail_for(95).bound_values(None)
    assert values == tails.ulp_window(-1.0, 1) + tails.ulp_window(1.0, 1)
    crossing = [v for v in tails.tail_for(81).bound_values(None) if 2 < v < 3]
    assert len(crossing) == 9
    assert all(b - a > 0 for a, b in zip(crossing, crossing[1:], strict=False))
