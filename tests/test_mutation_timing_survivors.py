"""What run_timing hands each step and what its record holds (found by mutation testing,
docs/mutation.md): tests/test_fakes_gate.py pins what is gated and loaded; here every
stand-in records its arguments, so the model's seed, the input's distribution, shape, seed
and device, the tail's kernels, the measured program, protocol, progress and labels, and
every field of the written record are checked against what run_timing was given.

The model, input device and measurement are stand-ins (no GPU); the gate, the record files,
the protocol check, the progress log and the record header are real.
"""

from __future__ import annotations

import logging
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from test_fakes_gate import SHA, _baselines_record, _study

from kbfuse import stage
from kbfuse.compilation import cudacache, launch
from kbfuse.io import read_json
from kbfuse.tasks import baselines, kernelbench, tails
from kbfuse.tasks.inputs import make_input
from kbfuse.tasks.weights import weights_sha256
from kbfuse.timing import timing
from kbfuse.timing.gate import TimedTask

# input_seed 7, not 0: a seed left out or replaced by None/0 shows.
PROTOCOL = {"warmup": 1, "rounds": 2, "invocations_per_pair": 3, "order_seed": 5, "input_seed": 7}
NUMERICS = {"mode": "strict-fp32", "allow_tf32": False}
SHAPE = {"batch": 2, "in_features": 4, "out_features": 3}
MEASURED = {
    "measurements": {"program/events": {"eager": {"median_ms": 1.5}}},
    "ratios": {"program/events": {"good": {"median": 1.25}}},
    "tail_bytes": 96,
    "build_s": {"program": {"eager": 0.0}, "tail": {"eager": 0.0}},
}


@pytest.fixture
def spied(tmp_path, monkeypatch):
    """run_timing's GPU steps replaced by stand-ins that record every call's arguments."""
    calls: dict[str, list] = {
        "build_model": [],
        "make_input": [],
        "load": [],
        "library_output": [],
        "shape_record": [],
        "measure": [],
    }
    spec = SimpleNamespace(pin_commit="c" * 40, sha256="d" * 64, input_shape=lambda: (2, 4))
    torch.manual_seed(0)
    linear = torch.nn.Linear(4, 3)
    measured = dict(MEASURED)

    def fake_build_model(spec, seed):
        calls["build_model"].append((spec, seed))
        return linear

    def fake_make_input(distribution, shape, seed, device="cpu"):
        calls["make_input"].append((distribution, shape, seed, device))
        return make_input(distribution, shape, seed, "cpu")

    def spy_load(artifact, meta, kernels=()):
        calls["load"].append((Path(artifact).name, meta["variant"], kernels))
        return SimpleNamespace(variant=meta["variant"])

    def library_output(model, x):
        calls["library_output"].append((model, x))
        return model(x)

    def shape_record(model, x, y):
        calls["shape_record"].append((model, x, y))
        return dict(SHAPE)

    def fake_measure(program, protocol, say, labels=()):
        calls["measure"].append((program, protocol, labels))
        say("timing program/events: stand-in")
        return dict(measured)

    fake_tail = SimpleNamespace(
        input_shape=lambda spec: spec.input_shape(),
        kernels=lambda: ("tail81", "tail81_small"),
        library_output=library_output,
        shape_record=shape_record,
    )
    monkeypatch.setattr(launch.LoadedModule, "load", staticmethod(spy_load))
    monkeypatch.setattr(stage, "measure_program", fake_measure)
    monkeypatch.setattr(timing, "make_input", fake_make_input)
    monkeypatch.setattr(kernelbench, "read_pin", lambda path: {"tasks": {"81": {}}})
    monkeypatch.setattr(kernelbench, "load_task", lambda checkout, pin, task: spec)
    monkeypatch.setattr(kernelbench, "build_model", fake_build_model)
    monkeypatch.setattr(tails, "tail_for", lambda task: fake_tail)
    monkeypatch.setattr(baselines, "set_numerics", lambda mode=None: dict(NUMERICS))

    variants, correctness = _study(
        tmp_path, {"good": (True, [], SHA), "failed": (False, ["seed0/uniform"], SHA)}
    )
    record = _baselines_record(tmp_path, {"torchscript": (True, [])})
    inputs = TimedTask(
        81, variants, correctness, record, tmp_path, tmp_path / "pin.json", ["eager", "torchscript"]
    )
    return SimpleNamespace(
        root=tmp_path,
        inputs=inputs,
        calls=calls,
        spec=spec,
        model=linear,
        tail=fake_tail,
        measured=measured,
    )


def test_the_model_and_its_input_are_built_from_the_task_and_the_input_seed(spied):
    """The model from the loaded task with the protocol's input seed; the input drawn
    "uniform" at the tail's input shape with that seed, on "cuda"."""
    timing.run_timing(spied.inputs, PROTOCOL, spied.root / "timing.json")
    assert spied.calls["build_model"] == [(spied.spec, 7)]
    assert spied.calls["make_input"] == [("uniform", (2, 4), 7, "cuda")]


def test_only_gated_variants_are_loaded_with_the_tails_kernels(spied):
    timing.run_timing(spied.inputs, PROTOCOL, spied.root / "timing.json")
    assert spied.calls["load"] == [("tails.bin", "good", ("tail81", "tail81_small"))]


def test_the_measured_program_is_the_tasks_model_input_tail_and_gated_implementations(spied):
    timing.run_timing(spied.inputs, PROTOCOL, spied.root / "timing.json")
    [(program, protocol, labels)] = spied.calls["measure"]
    x = make_input("uniform", (2, 4), 7, "cpu")
    assert program.model is spied.model
    assert torch.equal(program.x, x)
    assert program.tail is spied.tail
    assert program.baseline_names == ["eager", "torchscript"]
    assert list(program.modules) == ["good"]
    assert program.modules["good"].variant == "good"
    assert protocol == PROTOCOL
    assert labels == (81,)  # the task labels the blocks' order seeds


def test_the_shape_is_recorded_from_the_model_its_input_and_the_library_output(spied):
    timing.run_timing(spied.inputs, PROTOCOL, spied.root / "timing.json")
    [(model, x, y)] = spied.calls["shape_record"]
    [(lib_model, lib_x)] = spied.calls["library_output"]
    expected_x = make_input("uniform", (2, 4), 7, "cpu")
    assert model is spied.model and lib_model is spied.model
    assert torch.equal(x, expected_x) and torch.equal(lib_x, expected_x)
    assert torch.equal(y, spied.model(expected_x))


def test_the_record_holds_every_field_run_timing_was_given_and_measured(spied):
    out = spied.root / "timing.json"
    result = timing.run_timing(spied.inputs, PROTOCOL, out)
    assert result == {
        "kind": "timing",
        "schema_version": stage.SCHEMA_VERSION,
        "task": 81,
        "provenance": {
            "pin_commit": "c" * 40,
            "task_sha256": "d" * 64,
            "weights_sha256": weights_sha256(spied.model),
            "artifacts": {"good": SHA},
            "kernels": {"good": "tail_81"},
        },
        "protocol": PROTOCOL,
        "numerics": NUMERICS,
        "shape": SHAPE,
        "timed": ["eager", "torchscript", "good"],
        "skipped": {
            "failed": {
                "reason": "failed correctness (official predicate): 1 failing check(s)",
                "failing_checks": ["seed0/uniform"],
            }
        },
        "measurements": MEASURED["measurements"],
        "ratios": MEASURED["ratios"],
        "tail_bytes": 96,
        "build_s": MEASURED["build_s"],
        "cuda_cache": cudacache.current_setting(),
    }
    assert read_json(out) == result


def test_a_measurement_without_build_seconds_records_an_empty_build_s(spied):
    """run_timing reads build_s with a default: a measurement that reports none records {}."""
    del spied.measured["build_s"]
    result = timing.run_timing(spied.inputs, PROTOCOL, spied.root / "timing.json")
    assert result["build_s"] == {}
    assert read_json(spied.root / "timing.json")["build_s"] == {}


def test_progress_goes_to_the_log_file_in_order(spied):
    """The job's log gets the gate's lines, what is timed, the measurement's own lines (its
    `say` is run_timing's) and where the record went."""
    log = spied.root / "logs" / "timing.log"
    out = spied.root / "timing.json"
    timing.run_timing(spied.inputs, PROTOCOL, out, log)
    assert log.read_text().splitlines() == [
        "task 81: failed not timed: failed correctness (official predicate): 1 failing check(s) "
        "['seed0/uniform']",
        "task 81: timing ['eager', 'torchscript', 'good'], input (2, 4)",
        "timing program/events: stand-in",
        f"task 81: wrote {out}",
    ]


def test_progress_is_logged_under_the_timing_stages_logger(spied, caplog):
    out = spied.root / "timing.json"
    with caplog.at_level(logging.INFO, logger="kbfuse"):
        timing.run_timing(spied.inputs, PROTOCOL, out)
    mine = [r.getMessage() for r in caplog.records if r.name == "kbfuse.timing.timing"]
    assert mine[-1] == f"task 81: wrote {out}"
    assert "task 81: timing ['eager', 'torchscript', 'good'], input (2, 4)" in mine
