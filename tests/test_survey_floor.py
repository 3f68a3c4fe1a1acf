"""The memory floor of a task (kbfuse.survey.floor): the bytes the work outside library kernels
must move, found under FakeTensorMode on the CPU, each checked against the bytes worked out by
hand from the task's shapes (float32: 4 bytes an element)."""

from __future__ import annotations

import types

import pytest
from survey_kbrepo import SURVEY_TASK_FILES
from survey_records import record

from kbfuse.errors import KbfuseError
from kbfuse.io import sha256_file
from kbfuse.survey import floor

F32 = 4


def task_module(source: str) -> types.ModuleType:
    module = types.ModuleType("task_under_test")
    exec(compile(source, "task_under_test.py", "exec"), module.__dict__)  # noqa: S102
    return module


def fixture_task(task: int) -> types.ModuleType:
    return task_module(SURVEY_TASK_FILES[task][1])


LINEAR = """import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(8, 16)
        self.bias = nn.Parameter(torch.randn(16))

    def forward(self, x):
{body}

def get_inputs():
    return [torch.rand(4, 8)]

def get_init_inputs():
    return []
"""


def linear_task(*lines: str) -> types.ModuleType:
    return task_module(LINEAR.format(body="\n".join(f"        {line}" for line in lines)))


OUT = 4 * 16 * F32  # the linear layer's output, (4, 16)


def test_a_convolution_tail_reads_the_convolution_its_bias_and_writes_the_output():
    # task 1: conv (2, 3, 8, 8) -> (2, 4, 6, 6), relu, + bias (4, 1, 1)
    found = floor.task_floor(fixture_task(1))
    conv = 2 * 4 * 6 * 6 * F32
    assert found.library_outputs == [
        {"op": "aten.convolution", "shape": [2, 4, 6, 6], "bytes": conv}
    ]
    assert (found.read_library, found.read_parameters, found.read_inputs) == (conv, 4 * F32, 0)
    assert found.written == conv  # the task's output; relu's result stays on chip
    assert found.bytes == 2 * conv + 4 * F32
    assert found.as_dict()["floor_bytes"] == found.bytes


def test_work_before_the_library_reads_the_input_and_writes_what_the_gemm_reads():
    # task 7: tanh(tanh(x)) on (4, 8), then a linear layer whose output is the task's
    found = floor.task_floor(fixture_task(7))
    assert (found.read_inputs, found.written, found.read_library) == (128, 128, 0)
    assert found.bytes == 256


def test_dropout_then_softmax_in_training_mode():
    # task 66: linear (4, 8) -> (4, 16), dropout (its mask is made by the work itself), softmax
    found = floor.task_floor(fixture_task(66), "kernelbench")
    assert (found.read_library, found.written, found.read_parameters) == (256, 256, 0)


def test_a_task_that_is_its_library_call_has_no_floor_bytes():
    found = floor.task_floor(linear_task("return self.linear(x).view(2, 32)"))
    assert found.bytes == 0  # a view moves nothing, and the output is the library's
    assert [o["shape"] for o in found.library_outputs] == [[4, 16]]


def test_in_place_work_on_the_library_output_reads_it_and_writes_the_output():
    found = floor.task_floor(linear_task("y = self.linear(x)", "y.relu_()", "return y"))
    assert (found.read_library, found.written) == (OUT, OUT)


def test_each_tensor_counts_once_however_often_it_is_read():
    found = floor.task_floor(
        linear_task(
            "y = self.linear(x)",
            "z = torch.tanh(y) + self.bias",
            "return z * y + self.bias",
        )
    )
    assert (found.read_library, found.read_parameters, found.written) == (OUT, 16 * F32, OUT)


def test_work_between_two_library_calls_writes_what_the_second_reads():
    found = floor.task_floor(
        linear_task("y = torch.relu(self.linear(x))", "return torch.mm(y, y.t())")
    )
    # reads the first output, writes relu's for the GEMM; the GEMM's output is the task's
    assert (found.read_library, found.written) == (OUT, OUT)
    assert [o["shape"] for o in found.library_outputs] == [[4, 16], [4, 4]]


def test_a_forward_that_reads_data_has_no_floor_and_the_record_says_why(tmp_path):
    with pytest.raises(Exception, match="DataDependent|data-dependent|_local_scalar_dense"):
        floor.task_floor(fixture_task(9))


def _checkout(tmp_path, task: int):
    name, text = SURVEY_TASK_FILES[task]
    path = tmp_path / "KernelBench" / "level2" / name
    path.parent.mkdir(parents=True)
    path.write_text(text)
    rec = record(task=task)
    rec["file"], rec["sha256"] = name, sha256_file(path)
    return rec


def test_record_floor_reads_the_surveyed_file_at_the_checkout(tmp_path):
    rec = _checkout(tmp_path, 1)
    found, problem = floor.record_floor(tmp_path, rec)
    assert problem is None and found["floor_bytes"] == 2 * 2 * 4 * 6 * 6 * F32 + 4 * F32


def test_record_floor_refuses_another_file_and_says_why_a_forward_has_none(tmp_path):
    rec = _checkout(tmp_path, 1)
    assert floor.record_floor(tmp_path / "elsewhere", rec) == (
        None,
        "no floor: 1_Conv2D_ReLU_BiasAdd.py is not at the checkout",
    )
    assert floor.record_floor(tmp_path, {**rec, "sha256": "1" * 64}) == (
        None,
        "no floor: 1_Conv2D_ReLU_BiasAdd.py at the checkout is not the surveyed file",
    )
    rec9 = _checkout(tmp_path / "nine", 9)
    found, problem = floor.record_floor(tmp_path / "nine", rec9)
    assert found is None and problem.startswith("no floor: DataDependentOutputException")


def test_the_command_prints_one_tasks_floor(tmp_path, capsys):
    import json

    _checkout(tmp_path, 1)
    assert floor.main([str(tmp_path), "2", "1", "--gbps", "1000"]) == 0
    printed = json.loads(capsys.readouterr().out)
    floor_bytes = 2 * 2 * 4 * 6 * 6 * F32 + 4 * F32
    assert printed["file"] == "1_Conv2D_ReLU_BiasAdd.py" and printed["floor_bytes"] == floor_bytes
    assert printed["floor_ms"] == pytest.approx(floor_bytes / 1e12 * 1e3)
    with pytest.raises(SystemExit, match="2"):
        floor.main([str(tmp_path), "2", "5"])
    assert "level 2 of" in capsys.readouterr().err


def _pin(tmp_path, rec, level: int = 2):
    import json

    path = tmp_path / "pin.json"
    path.write_text(json.dumps({
        "kind": "kernelbench_pin", "schema_version": 1, "url": "local mirror",
        "commit": "423217d9fda91e0c2d67e4a43bf62f96f6d104f1",
        "head": "423217d9fda91e0c2d67e4a43bf62f96f6d104f1", "level": level,
        "tasks": {str(rec["task"]): {
            "name": rec["file"][:-3], "path": f"KernelBench/level{level}/{rec['file']}",
            "sha256": rec["sha256"],
        }},
    }))  # fmt: skip
    return path


def test_the_floor_record_of_a_pinned_task_is_valid_and_names_its_file(tmp_path):
    from kbfuse.results.records import validate_record

    rec = _checkout(tmp_path, 1)
    found = floor.floor_record(tmp_path, _pin(tmp_path, rec), "kernelbench")
    validate_record(found, floor.KIND, "floor record")
    assert {k: found[k] for k in ("task", "level", "file", "sha256", "semantics", "problem")} == {
        "task": 1, "level": 2, "file": "1_Conv2D_ReLU_BiasAdd.py", "sha256": rec["sha256"],
        "semantics": "kernelbench", "problem": None,
    }  # fmt: skip
    assert found["floor"]["floor_bytes"] == 2 * 2 * 4 * 6 * 6 * F32 + 4 * F32
    assert [(o["op"], o["count"]) for o in found["floor"]["library_outputs"]] == [
        ("aten.convolution", 1)
    ]


def test_identical_library_outputs_are_listed_once_with_their_count():
    gemm = {"op": "aten.mm", "shape": [4, 16], "bytes": 256}
    conv = {"op": "aten.convolution", "shape": [1, 2], "bytes": 8}
    assert floor.grouped_outputs([gemm, conv, gemm, gemm]) == [
        {**gemm, "count": 3},
        {**conv, "count": 1},
    ]


def test_a_forward_that_reads_data_makes_a_floor_record_without_a_floor(tmp_path):
    rec = _checkout(tmp_path, 9)
    found = floor.floor_record(tmp_path, _pin(tmp_path, rec), "eval")
    assert found["floor"] is None and found["semantics"] == "eval"
    assert found["problem"].startswith("no floor: DataDependentOutputException")


def test_the_summary_uses_a_floor_record_only_for_its_own_file_and_semantics(tmp_path):
    import json

    from kbfuse.survey.summary import recorded_floors

    rec = _checkout(tmp_path, 1)
    found = floor.floor_record(tmp_path, _pin(tmp_path, rec), "kernelbench")
    path = tmp_path / "1.json"
    path.write_text(json.dumps(found))
    other = {**record(task=53), "sha256": "1" * 64}
    assert recorded_floors([path], [rec, rec, other]) == {
        1: (found["floor"], None),
        53: (None, "no floor: no floor record of the task"),
    }
    edited = {**rec, "sha256": "2" * 64}
    assert recorded_floors([path], [edited]) == {
        1: (None, "no floor: the floor record is of another file than 1_Conv2D_ReLU_BiasAdd.py")
    }
    evaluated = {**rec, "semantics": "eval"}
    assert recorded_floors([path], [evaluated]) == {
        1: (None, "no floor: the floor record's semantics is kernelbench, the record's eval")
    }
    path.write_text(json.dumps({**found, "floor": {"floor_bytes": -1}}))
    with pytest.raises(KbfuseError, match="1.json"):
        recorded_floors([path], [rec])


def test_a_pin_naming_two_tasks_is_refused_naming_the_pin(tmp_path):
    import json

    rec = _checkout(tmp_path, 1)
    pin = _pin(tmp_path, rec)
    data = json.loads(pin.read_text())
    data["tasks"]["2"] = {
        **data["tasks"]["1"],
        "name": "2_Other",
        "path": "KernelBench/level2/2_Other.py",
    }
    pin.write_text(json.dumps(data))
    with pytest.raises(KbfuseError, match=r"survey pin .*pin.json must name exactly one task"):
        floor.floor_record(tmp_path, pin, "kernelbench")
