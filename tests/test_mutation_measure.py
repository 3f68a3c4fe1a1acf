"""Tests written for mutants of measure.py and timing.py's gate that survived the run of
docs/mutation.md (the code after the timing statistics moved to kbfuse.timing.measure).

Each pins what the suite looked at too loosely: a message anchored at both ends (a search for
"timing.warmup" also finds "XXtiming.warmupXX"), the progress lines of an interleaved block,
the smallest case of a position effect, and, most of all, that the timing gate checks each
correctness record against the task being timed.
"""

from __future__ import annotations

import re

import pytest

from kbfuse import stage
from kbfuse.errors import KbfuseError
from kbfuse.io import write_json
from kbfuse.timing import gate, measure

SHA = "a" * 64
PROTOCOL = {"warmup": 1, "rounds": 2, "invocations_per_pair": 1, "order_seed": 0, "input_seed": 0}

# --------------------------------------------------------------------------- measure


def test_interleave_logs_every_round_with_its_label_after_the_samples():
    lines: list[str] = []
    orders = [["a", "b"], ["b", "a"]]
    samples, positions = measure.interleave(
        {"a": lambda: None, "b": lambda: None},
        orders,
        lambda run: 1.0,
        log=lines.append,
        label="81/full/events ",
    )
    assert lines == [
        "81/full/events round 1/2 order ['a', 'b']",
        "81/full/events round 2/2 order ['b', 'a']",
    ]
    assert positions == {"a": [0, 1], "b": [1, 0]}
    unlabelled: list[str] = []
    measure.interleave({"a": lambda: None}, [["a"]], lambda run: 1.0, log=unlabelled.append)
    assert unlabelled == ["round 1/1 order ['a']"]


def test_position_counts_of_no_rounds_is_empty():
    assert measure.position_counts([]) == {}
    assert measure.position_counts([["a", "b"]]) == {"a": [1, 0], "b": [0, 1]}


def test_paired_ratios_names_a_bad_cycle():
    with pytest.raises(KbfuseError, match=r"^cycle is 0: it must be an integer >= 1$"):
        measure.paired_ratios([1.0], [1.0], 0)


def test_position_effect_with_one_sample_on_each_side():
    # two rounds, each implementation first once: the first sample is twice the second
    block = {"a": [4.0, 2.0], "b": [2.0, 4.0]}
    assert measure.position_effect(block, {"a": [0, 1], "b": [1, 0]}) == {
        "first_n": 2,
        "others_n": 2,
        "first_over_others": 2.0,
        "last_over_others": 0.5,
        "each_position_min": 0.5,
        "each_position_max": 2.0,
    }
    assert measure.position_effect({"a": [4.0], "b": [2.0]}, {"a": [1], "b": [1]}) is None
    assert measure.position_effect({"a": [4.0], "b": [2.0]}, {"a": [0], "b": [0]}) is None


def test_position_effect_names_itself_and_its_samples():
    with pytest.raises(
        KbfuseError, match=r"^position_effect: 'a': need at least one sample, got \[\]$"
    ):
        measure.position_effect({"a": [], "b": []}, {"a": [], "b": []})
    with pytest.raises(KbfuseError, match=r"^position_effect: 'b' has 2 samples but 1 positions$"):
        measure.position_effect({"a": [1.0, 2.0], "b": [1.0, 2.0]}, {"a": [0, 1], "b": [0]})
    with pytest.raises(
        KbfuseError,
        match=r"^position_effect: the implementations have different numbers of samples "
        r"\{'a': 2, 'b': 1\}; a block's implementations share its rounds$",
    ):
        measure.position_effect({"a": [1.0, 2.0], "b": [1.0]}, {"a": [0, 1], "b": [0]})
    with pytest.raises(
        KbfuseError, match=r"^position_effect: samples of \['a', 'b'\] but positions of \['a'\]$"
    ):
        measure.position_effect({"a": [1.0], "b": [1.0]}, {"a": [0]})


# --------------------------------------------------------------------------- timing: checks


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("warmup", 0),
        ("rounds", 0),
        ("invocations_per_pair", 0),
        ("order_seed", -1),
        ("input_seed", -1),
    ],
)
def test_check_protocol_messages_word_for_word(key, value):
    minimum = 0 if key.endswith("seed") else 1
    message = f"timing.{key} is {value!r}: it must be an integer >= {minimum}"
    with pytest.raises(KbfuseError, match=f"^{re.escape(message)}$"):
        measure.check_protocol({**PROTOCOL, key: value})


def test_check_protocol_refuses_what_is_not_a_mapping():
    with pytest.raises(KbfuseError, match=r"^timing protocol must be a mapping, got \[1, 2\]$"):
        measure.check_protocol([1, 2])


def test_assemble_scope_needs_positions_as_well_as_samples():
    with pytest.raises(KbfuseError, match=r"^no samples for \['v'\]$"):
        measure.assemble_scope({"eager": [1.0], "v": [1.0]}, {"eager": [0]}, ["eager"], ["v"])


def test_read_compile_metas_messages(tmp_path):
    absent = tmp_path / "absent.json"
    with pytest.raises(
        KbfuseError, match=rf"^variant v: compile metadata {re.escape(str(absent))}: \[Errno 2\] "
    ):
        stage.read_compile_metas({"v": (tmp_path / "tails.bin", absent)})
    path = tmp_path / "meta.json"
    compile_meta = {"kind": "compile", "variant": "v", "artifact_sha256": SHA}
    cases = [
        ([compile_meta], "is not a compile record (kind 'compile')"),
        ({**compile_meta, "kind": "env"}, "is not a compile record (kind 'compile')"),
        ({"kind": "compile"}, "lacks key(s) ['variant', 'artifact_sha256']"),
        ({**compile_meta, "variant": "w"}, "is for variant 'w', not 'v'"),
    ]
    for meta, problem in cases:
        write_json(path, meta)
        message = f"compile metadata {path} {problem}"
        with pytest.raises(KbfuseError, match=f"^{re.escape(message)}$"):
            stage.read_compile_metas({"v": (tmp_path / "tails.bin", path)})
    write_json(path, {**compile_meta, "artifact_sha256": 5})
    message = f"variant v: {path} has no artifact_sha256"
    with pytest.raises(KbfuseError, match=f"^{re.escape(message)}$"):
        stage.read_compile_metas({"v": (tmp_path / "tails.bin", path)})
    write_json(path, {"kind": "compile", "variant": "v"})
    with pytest.raises(KbfuseError, match=r"lacks key\(s\) \['route', 'artifact_sha256'\]$"):
        stage.read_compile_meta(path, "v", required=("route", "variant"))
    write_json(path, compile_meta)
    assert stage.read_compile_metas({"v": (tmp_path / "tails.bin", path)}) == {"v": compile_meta}


def test_a_malformed_record_is_named_before_its_other_problems():
    record = {"kind": "correctness", "task": 53, "implementation": "w", "passed": "yes"}
    assert gate._gate_one("v", record, 81, SHA) == (
        "corrupt correctness record: passed is 'yes', not a boolean",
        [],
    )


# --------------------------------------------------------------------------- timing: the gate


def _records(root, task: int) -> tuple[dict, dict]:
    """Variant v and the baselines record, both passing, both written for `task`."""
    meta = {"kind": "compile", "variant": "v", "artifact_sha256": SHA}
    write_json(root / "v" / "meta.json", meta)
    variant = {
        "kind": "correctness",
        "task": task,
        "implementation": "v",
        "provenance": {"artifact_sha256": SHA},
        "passed": True,
        "failing_checks": [],
    }
    write_json(root / "v.json", variant)
    passing = {"passed": True, "failing_checks": []}
    baselines = {
        "kind": "correctness_baselines",
        "task": task,
        "implementations": {"torchscript": passing, "inductor": passing},
    }
    write_json(root / "baselines.json", baselines)
    return {"v": (root / "v" / "tails.bin", root / "v" / "meta.json")}, {"v": root / "v.json"}


def test_gate_implementations_times_what_passed_for_this_task(tmp_path):
    variants, correctness = _records(tmp_path, 81)
    lines: list[str] = []
    gated = gate.gate_implementations(
        81, variants, correctness, tmp_path / "baselines.json", ["eager", "inductor"], lines.append
    )
    assert gated["baselines"] == ["eager", "inductor"]
    assert gated["variants"] == ["v"]
    assert gated["skipped"] == {} and lines == []
    assert gated["metas"] == {"v": {"kind": "compile", "variant": "v", "artifact_sha256": SHA}}


def test_gate_implementations_refuses_records_of_another_task(tmp_path):
    variants, correctness = _records(tmp_path, 53)
    lines: list[str] = []
    names = ["eager", "torchscript"]
    gated = gate.gate_implementations(
        81, variants, correctness, tmp_path / "baselines.json", names, lines.append
    )
    assert gated["baselines"] == ["eager"] and gated["variants"] == []
    reason = "correctness record is for task 53, not 81"
    assert gated["skipped"] == {
        "torchscript": {"reason": reason, "failing_checks": []},
        "v": {"reason": reason, "failing_checks": []},
    }
    assert lines == [
        f"task 81: torchscript not timed: {reason} []",
        f"task 81: v not timed: {reason} []",
    ]
    assert gate.gate_variants(81, variants, correctness, gated["metas"]) == (
        [],
        {"v": {"reason": reason, "failing_checks": []}},
    )
