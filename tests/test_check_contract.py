"""kbfuse check's compiler contract and timing sample, without a GPU: the build capture in
the candidate's process, the merge of captured and build.ninja flags, the witness's flag sets,
and the order of synchronisations and events around a timed sample."""

from __future__ import annotations

import time

import pytest
import torch.utils.cpp_extension as ext

from kbfuse.candidates import capture, evidence, timing


@pytest.fixture
def fresh_capture(monkeypatch):
    calls = []

    def fake_load_inline(name, cpp_sources, **kwargs):
        calls.append(name)
        time.sleep(0.05)  # a build that takes a while: its seconds are recorded
        return f"module {name}"

    monkeypatch.setattr(ext, "load_inline", fake_load_inline)
    monkeypatch.setattr(ext, "load", lambda name, sources, **kw: f"loaded {name}")
    monkeypatch.setattr(capture, "BUILDS", [])
    monkeypatch.setattr(capture, "NOTES", [])
    monkeypatch.setattr(capture, "_UNLISTED", {"count": 0})
    capture.install()
    return calls


def test_load_inline_is_recorded_and_then_called(fresh_capture):
    from torch.utils.cpp_extension import load_inline  # as a candidate imports it

    result = load_inline(name="mine", cpp_sources="", extra_cuda_cflags=["-O3", "--use_fast_math"])
    assert result == "module mine" and fresh_capture == ["mine"]
    assert 0.05 <= capture.BUILDS[0].pop("seconds") < 5
    assert capture.BUILDS == [
        {
            "route": "torch.utils.cpp_extension.load_inline",
            "extension": "mine",
            "extra_cuda_cflags": ["-O3", "--use_fast_math"],
            "extra_cflags": [],
            "extra_ldflags": [],
        }
    ]
    ext.load("other", ["a.cu"], extra_cuda_cflags="-ftz=true")
    assert capture.BUILDS[1]["route"] == "torch.utils.cpp_extension.load"
    assert capture.BUILDS[1]["extra_cuda_cflags"] == ["-ftz=true"]


def test_a_build_asked_for_again_is_listed_once_with_its_calls(fresh_capture):
    """CUDA-L1's task-24 kernel calls load_inline in its forward: every call was listed, the
    report went over the schema's 64 builds and its verdict failed `build` (session 12)."""
    from torch.utils.cpp_extension import load_inline

    for _ in range(100):
        load_inline(name="again", cpp_sources="", extra_cuda_cflags=["-O3"])
    load_inline(name="again", cpp_sources="", extra_cuda_cflags=["-O2"])
    assert fresh_capture == ["again"] * 101  # every call still reaches torch
    assert [(b["extension"], b["extra_cuda_cflags"], b.get("calls")) for b in capture.BUILDS] == [
        ("again", ["-O3"], 100),
        ("again", ["-O2"], None),
    ]
    assert 0.05 <= capture.BUILDS[0]["seconds"] < 5  # the first call's


def test_distinct_builds_past_the_limit_are_counted_in_a_note(fresh_capture):
    from torch.utils.cpp_extension import load_inline

    from kbfuse.candidates import verdict

    capture.NOTES.append("an earlier note")
    for i in range(capture.MAX_BUILDS + 3):
        load_inline(name=f"ext{i}", cpp_sources="")
    assert len(capture.BUILDS) == capture.MAX_BUILDS
    note = f"builds past the first {capture.MAX_BUILDS} distinct ones not listed: 3"
    assert ["an earlier note", note] == capture.NOTES
    # a report with them is within the schema
    schema_max = verdict.schema()["$defs"]["runner"]["properties"]["builds"]["maxItems"]
    assert schema_max == capture.MAX_BUILDS


def torch_build(flags):
    return {
        "route": "torch.utils.cpp_extension.load_inline",
        "extra_cuda_cflags": flags,
        "extra_cflags": [],
        "extension": "x",
    }


def test_witness_measures_each_distinct_flag_set_once():
    runner = {
        "builds": [
            torch_build(["--fmad=false"]),
            torch_build(["--fmad=false"]),
            torch_build(["--use_fast_math"]),
            {"route": "cupy.RawModule", "options": ["--std=c++11"], "implicit_options": []},
        ]
    }
    assert evidence.witness_builds(runner) == [
        {"route": "load_inline", "flags": ["--fmad=false"]},
        {"route": "load_inline", "flags": ["--use_fast_math"]},
        {"route": "cupy", "options": ["--std=c++11"]},
    ]
    assert evidence.witness_builds({}) == []


def test_contract_reads_the_flags_nvcc_got_and_the_witness():
    ninja = [
        {
            "extension": "x",
            "cuda_flags": ["--expt-relaxed-constexpr", "--use_fast_math"],
            "host_flags": ["-O3"],
            "implies": {},
        }
    ]
    witness = [
        {"route": "load_inline", "flags": ["--use_fast_math"], "output": 0.0, "effective_ftz": True}
    ]
    runner = {"builds": [torch_build(["--use_fast_math"])], "ninja": ninja}
    contract = evidence.contract(runner, witness)
    assert contract["routes"] == ["torch.utils.cpp_extension.load_inline"]
    assert contract["implies"]["use_fast_math"] is True and contract["implies"]["ftz"] is True
    assert contract["effective_ftz"] is True


def test_contract_falls_back_to_the_asked_flags_and_adds_cupys_ftz():
    runner = {
        "builds": [
            torch_build(["--fmad=false"]),
            {
                "route": "cupy.RawModule",
                "options": ["--fmad=false"],
                "implicit_options": ["-ftz=true"],
            },
        ],
        "triton": True,
    }
    contract = evidence.contract(runner, None)
    assert contract["routes"] == [
        "cupy.RawModule",
        "torch.utils.cpp_extension.load_inline",
        "triton",
    ]
    assert contract["implies"]["fmad"] is False
    assert contract["implies"]["ftz"] is True  # CuPy's own -ftz=true
    assert contract["effective_ftz"] is None  # nothing measured
    plain = evidence.contract({}, [{"effective_ftz": None}])
    assert plain["routes"] == [] and plain["effective_ftz"] is None


class FakeClock:
    """Records the order of synchronisations, events and calls of one timed sample."""

    def __init__(self):
        self.log = []
        self.now = 0.0

    def event(self):
        return {"t": None}

    def device_sync(self):
        self.log.append("device_sync")

    def record(self, event):
        self.now += 1.0
        event["t"] = self.now
        self.log.append("record")

    def event_sync(self, event):
        self.log.append("event_sync")

    def elapsed_time(self, start, end):
        return end["t"] - start["t"]


def test_a_sample_synchronises_the_whole_device_on_both_sides_of_the_calls():
    clock = FakeClock()
    measure = timing._events_pair(clock, 3)
    sample = measure(lambda: clock.log.append("call"))
    assert clock.log == [
        "device_sync",
        "record",
        "call",
        "call",
        "call",
        "device_sync",  # before the end event: work on any stream is inside the interval
        "record",
        "event_sync",
    ]
    assert sample == pytest.approx(1.0 / 3)


def test_a_cold_l2_sample_flushes_before_the_start_event():
    clock = FakeClock()
    measure = timing._events_pair(clock, 1, before=lambda: clock.log.append("flush"))
    measure(lambda: clock.log.append("call"))
    assert clock.log[:3] == ["flush", "device_sync", "record"]


# ------------------------------------------------------------ rounds sized from the spread


def sampler(values_by_name):
    """A measure_pair returning each implementation's next value in turn."""
    streams = {name: iter(values) for name, values in values_by_name.items()}

    def measure(run):
        return next(streams[run()])

    return measure


IMPLS = {"candidate": lambda: "candidate", "eager": lambda: "eager", "inductor": lambda: "inductor"}
PROTOCOL = {"rounds": 30, "order_seed": 913}


def test_a_quiet_block_ends_after_two_cycles():
    measure = sampler({name: [1.0] * 100 for name in IMPLS})
    block = timing._block(IMPLS, {**PROTOCOL, "spread": 0.02}, "events", measure, None)
    # two cycles of three rounds, each implementation at each position twice
    for name in IMPLS:
        assert len(block[name]["samples_ms"]) == 6
        assert sorted(block[name]["positions"]) == [0, 0, 1, 1, 2, 2]


def test_a_noisy_block_runs_every_round_and_no_spread_runs_them_all():
    noisy = {name: [1.0, 2.0] * 50 for name in IMPLS}
    block = timing._block(IMPLS, {**PROTOCOL, "spread": 0.02}, "events", sampler(noisy), None)
    assert [len(block[n]["samples_ms"]) for n in IMPLS] == [30, 30, 30]
    quiet = {name: [1.0] * 100 for name in IMPLS}
    block = timing._block(IMPLS, {**PROTOCOL, "spread": None}, "events", sampler(quiet), None)
    assert [len(block[n]["samples_ms"]) for n in IMPLS] == [30, 30, 30]


def test_a_block_ends_at_the_first_cycle_where_every_implementation_settled():
    # the candidate is noisy for its first four samples (two cycles), then steady
    values = {name: [1.0] * 100 for name in IMPLS}
    values["candidate"] = [1.0, 3.0, 1.0, 3.0] + [1.0] * 96
    block = timing._block(IMPLS, {**PROTOCOL, "spread": 0.1}, "events", sampler(values), None)
    # after two cycles its samples [1, 3, 1, 3, 1, 1] have an IQR of 1.5 (> 0.1 x median 1);
    # after three, [1, 3, 1, 3, 1, 1, 1, 1, 1], of 0
    assert {len(block[n]["samples_ms"]) for n in IMPLS} == {9}
