"""kbfuse check's pure parts: task references, settings, flag implications, build.ninja,
output comparison in ULPs, the caching signature, verdict decisions and the summary."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
import torch
from contracts import contract

from kbfuse.candidates import compare, flags, guards, spec, verdict, witness
from kbfuse.errors import KbfuseError

V01 = contract(1e-2, 1e-2)  # KernelBench v0.1's float32 tolerance

# --------------------------------------------------------------------------- spec


def test_parse_task_reads_level_and_task():
    assert spec.parse_task("2/53") == (2, 53)
    assert spec.parse_task(" 2/95 ") == (2, 95)


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("53", r"--task is '53': write LEVEL/TASK, e\.g\. 2/53"),
        ("1/53", r"--task is '1/53': level 1 is not checked \(levels: \(2,\)\)"),
        ("2/0", r"--task is '2/0': task numbers start at 1"),
        (53, r"--task is 53: write LEVEL/TASK"),
    ],
)
def test_parse_task_refuses_bad_references(text, match):
    with pytest.raises(KbfuseError, match=match):
        spec.parse_task(text)


def test_task_line_is_read_from_the_first_lines(tmp_path):
    path = tmp_path / "c.py"
    path.write_text("# a comment\n# kbfuse-task: 2/81\nimport torch\n")
    assert spec.task_of_file(path) == (2, 81)


def test_task_line_after_line_five_is_not_read(tmp_path):
    path = tmp_path / "c.py"
    path.write_text("\n" * 5 + "# kbfuse-task: 2/81\n")
    with pytest.raises(KbfuseError, match=r"c\.py names no task: put a line '# kbfuse-task"):
        spec.task_of_file(path)


def test_bad_task_line_names_file_and_line(tmp_path):
    path = tmp_path / "c.py"
    path.write_text("# kbfuse-task: 53\n")
    with pytest.raises(KbfuseError, match=r"c\.py line 1 is '53'"):
        spec.task_of_file(path)


def test_settings_know_the_studys_distributions_without_importing_torch():
    import subprocess
    import sys

    from kbfuse.survey.settings import NUMERICS
    from kbfuse.tasks.inputs import DISTRIBUTIONS

    assert spec.DISTRIBUTIONS == DISTRIBUTIONS
    assert set(spec.NUMERICS) == set(NUMERICS)
    probe = "import sys, kbfuse.candidates.spec; print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert done.stdout.strip() == "False", done.stderr


def test_settings_defaults_and_merge():
    s = spec.check_settings({"timing": {"rounds": 4}})
    assert s["timing"]["rounds"] == 4
    assert s["timing"]["warmup"] == spec.DEFAULTS["timing"]["warmup"]
    assert s["official_trials"] is None and s["seed"] is None  # the pinned evaluator's
    assert spec.check_settings(None) == spec.DEFAULTS
    assert spec.DEFAULTS["timing"]["spread"] is None  # every block runs `rounds`
    assert spec.check_settings({"timing": {"spread": 0.02}})["timing"]["spread"] == 0.02


@pytest.mark.parametrize(
    ("given", "match"),
    [
        ({"colour": 1}, r"check\.colour is not a setting; known: \["),
        ({"timing": {"speed": 1}}, r"check\.timing\.speed is not a setting"),
        ({"timing": 3}, r"check\.timing is 3: it must be a mapping"),
        ({"time_limit_s": 0}, r"check\.time_limit_s is 0: it must be a finite number > 0"),
        ({"time_limit_s": math.inf}, r"check\.time_limit_s is inf"),
        ({"memory_limit_mb": 10}, r"check\.memory_limit_mb is 10: it must be an integer >= 64"),
        ({"gpu_memory_fraction": 1.5}, r"check\.gpu_memory_fraction is 1\.5: it must be <= 1"),
        ({"official_trials": 0}, r"official_trials is 0: it must be an integer >= 1"),
        ({"seeds": []}, r"check\.seeds is \[\]: it must be a non-empty list"),
        ({"seeds": [-1]}, r"check\.seeds\[\] is -1: it must be an integer >= 0"),
        ({"distributions": ["gamma"]}, r"check\.distributions: unknown input distribution"),
        ({"baselines": ["inductor"]}, r"check\.baselines is \['inductor'\]: a list that"),
        ({"baselines": ["eager", "tvm"]}, r"check\.baselines names 'tvm'; known"),
        ({"timing": {"cold_l2": "yes"}}, r"check\.timing\.cold_l2 is 'yes': it must be true"),
        ({"timing": {"spread": 0}}, r"check\.timing\.spread is 0: a fraction between 0 and 1"),
        ({"timing": {"spread": 1.5}}, r"check\.timing\.spread is 1\.5: a fraction"),
        ({"timing": {"spread": True}}, r"check\.timing\.spread is True: a fraction"),
        ({"timing": {"spread": "2%"}}, r"check\.timing\.spread is '2%': a fraction"),
        ({"in_manifest": 1}, r"check\.in_manifest is 1: it must be true or false"),
        ({"witness_cache": 3}, r"check\.witness_cache is 3: a folder or null"),
        ({"folder": ""}, r"check\.folder is '': it must be a folder path"),
        ({"numerics": "tf32"}, r"check\.numerics is 'tf32'; known: strict, kernelbench-defaults"),
        ([1], r"check is \[1\]: it must be a mapping"),
    ],
)
def test_settings_refuse_bad_values_by_key(given, match):
    with pytest.raises(KbfuseError, match=match):
        spec.check_settings(given)


# --------------------------------------------------------------------------- flags


def test_no_flags_are_nvccs_defaults():
    implied = flags.implications([])
    assert implied["ftz"] is False and implied["fmad"] is True
    assert implied["prec_div"] is True and implied["use_fast_math"] is False


@pytest.mark.parametrize("spelling", ["--use_fast_math", "-use_fast_math", "-O3 --use_fast_math"])
def test_fast_math_implies_ftz_and_fast_division(spelling):
    implied = flags.implications([spelling])
    assert implied["use_fast_math"] is True
    assert implied["ftz"] is True and implied["fmad"] is True
    assert implied["prec_div"] is False and implied["prec_sqrt"] is False


def test_explicit_flag_overrides_fast_math_whatever_the_order():
    implied = flags.implications(["--ftz=false", "--use_fast_math"])
    assert implied["ftz"] is False and implied["prec_div"] is False


@pytest.mark.parametrize(
    ("tokens", "ftz"),
    [
        (["-ftz=true"], True),
        (["--ftz=true"], True),
        (["--ftz", "true"], True),
        (["--ftz=true", "--ftz=false"], False),
        (["-ftz=TRUE"], True),
    ],
)
def test_ftz_spellings_last_wins(tokens, ftz):
    assert flags.implications(tokens)["ftz"] is ftz


def test_ptxas_and_host_fast_math_are_listed_apart():
    implied = flags.implications(
        ["-Xptxas", "-O3", "--compiler-options", "-fPIC,-ffast-math"], ["-Ofast"]
    )
    assert implied["ptxas_options"] == ["-O3"]
    assert implied["host_fast_math"] == ["-Ofast", "-ffast-math"]
    assert implied["ftz"] is False


NINJA = """ninja_required_version = 1.3
cxx = c++
nvcc = /usr/local/cuda/bin/nvcc

cflags = -DTORCH_EXTENSION_NAME=own -isystem /x -fPIC -std=c++17
post_cflags =
cuda_cflags = -DTORCH_EXTENSION_NAME=own -D__CUDA_NO_HALF_OPERATORS__ $
  --expt-relaxed-constexpr -gencode=arch=compute_90,code=sm_90 --compiler-options '-fPIC' $
  --use_fast_math -std=c++17
cuda_post_cflags =
ldflags = -shared -L/x -lc10

rule compile
  command = $cxx -MMD -MF $out.d $cflags -c $in -o $out $post_cflags
"""


def test_build_ninja_flags_are_read_and_interpreted(tmp_path):
    folder = tmp_path / "own"
    folder.mkdir()
    (folder / "build.ninja").write_text(NINJA)
    builds = flags.ninja_builds(tmp_path)
    assert [b["extension"] for b in builds] == ["own"]
    assert "--expt-relaxed-constexpr" in builds[0]["cuda_flags"]
    assert "-fPIC" in builds[0]["cuda_flags"]  # the quoted option, unquoted
    assert builds[0]["host_flags"][-1] == "-std=c++17"
    assert builds[0]["implies"]["use_fast_math"] is True
    assert builds[0]["implies"]["ftz"] is True


def test_no_extensions_folder_means_no_builds(tmp_path):
    assert flags.ninja_builds(tmp_path / "missing") == []


def test_user_flags_gather_torch_and_cupy_builds():
    captured = [
        {"route": "torch.utils.cpp_extension.load_inline", "extra_cuda_cflags": ["-O3 -ftz=true"]},
        {"route": "cupy.RawModule", "options": ["--fmad=false"]},
    ]
    assert flags.user_device_flags(captured) == ["-O3", "-ftz=true", "--fmad=false"]


# --------------------------------------------------------------------------- compare


def f32(*values):
    return torch.tensor(values, dtype=torch.float32)


def test_ulps_count_float32_steps_across_zero():
    one = f32(1.0)
    nxt = torch.nextafter(one, f32(2.0))
    assert compare.max_ulps(one, nxt) == 1
    tiny = torch.nextafter(f32(0.0), f32(1.0))  # the smallest subnormal
    assert compare.max_ulps(-tiny, tiny) == 2
    assert compare.max_ulps(f32(0.0), f32(-0.0)) == 0
    assert compare.max_ulps(f32(math.nan), f32(1.0)) == compare.NAN_ULPS
    assert compare.max_ulps(f32(math.nan), f32(math.nan)) == 0


def test_compare_case_counts_bits_and_errors():
    ref = f32(1.0, 2.0, 0.0, 4.0)
    cand = f32(1.0, 2.0, -0.0, 4.5)
    record = compare.compare_case(ref, cand, V01)
    assert record["problem"] is None
    assert record["bit_equal"] == 2  # 0.0 and -0.0 differ in their bits
    assert record["bit_identical"] is False
    assert record["max_abs"] == 0.5
    assert record["max_ulps"] == 2**20  # 4.0 -> 4.5: half the binade of 2^23 steps
    assert record["official_pass"] is False


def test_compare_case_names_shape_dtype_and_type_problems():
    ref = f32(1.0, 2.0)
    assert compare.compare_case(ref, f32(1.0), V01)["problem"] == "shape [1], expected [2]"
    assert "dtype torch.float64" in compare.compare_case(ref, ref.double(), V01)["problem"]
    assert compare.compare_case(ref, [1.0], V01)["problem"] == "output is list"


def test_official_order_scales_by_the_candidate():
    # |ref - cand| <= atol + rtol * |cand|: 0.0201 <= 0.020201, swapped 0.0201 > 0.02
    ref, cand = f32(1.0), f32(1.0201)
    assert compare.compare_case(ref, cand, V01)["official_pass"] is True
    assert compare.compare_case(cand, ref, V01)["official_pass"] is False
    # an evaluator that put the candidate first would scale by the reference instead
    swapped = contract(1e-2, 1e-2, order=("candidate", "reference"))
    assert compare.compare_case(ref, cand, swapped)["official_pass"] is False
    assert compare.compare_case(cand, ref, swapped)["official_pass"] is True


def test_the_pinned_tolerance_decides_a_case():
    ref = f32(1.0, -2.0, 3.0)
    off = ref * 1.003  # 0.3 % off: passes KernelBench v0.1's 1e-2, not the pin's 1e-4
    assert compare.compare_case(ref, off, V01)["official_pass"] is True
    assert compare.compare_case(ref, off, contract())["official_pass"] is False
    assert compare.compare_case(ref, ref.clone(), contract())["official_pass"] is True


def test_cached_calls_need_equal_outputs_and_different_references():
    cases = [
        {"name": "a", "instance": "i"},
        {"name": "b", "instance": "i"},
        {"name": "c", "instance": "j"},
    ]

    def prints(**values):
        return {k: compare.fingerprint(v) for k, v in values.items()}

    refs = prints(a=f32(1.0), b=f32(2.0), c=f32(1.0))
    cached = prints(a=f32(1.0), b=f32(1.0), c=f32(1.0))
    assert compare.cached_calls(cases, refs, cached) == [["a", "b"]]
    following = prints(a=f32(1.0), b=f32(2.0), c=f32(1.0))
    assert compare.cached_calls(cases, refs, following) == []
    same_refs = prints(a=f32(1.0), b=f32(1.0), c=f32(1.0))
    assert compare.cached_calls(cases, same_refs, prints(a=f32(1.0), b=f32(1.0))) == []
    # outputs that are no tensor at all are never taken for a cached pair
    assert compare.cached_calls(cases, refs, {"a": None, "b": None}) == []


def test_fingerprints_differ_in_bits_shape_and_dtype_only():
    assert compare.fingerprint(f32(1.0, 2.0)) == compare.fingerprint(f32(1.0, 2.0))
    assert compare.fingerprint(f32(0.0)) != compare.fingerprint(f32(-0.0))
    assert compare.fingerprint(f32(1.0, 2.0)) != compare.fingerprint(f32(1.0, 2.0).reshape(2, 1))
    zeros = torch.zeros(2, dtype=torch.int32)
    assert compare.fingerprint(f32(0.0, 0.0)) != compare.fingerprint(zeros)
    assert compare.fingerprint(f32(1.0, 2.0, 3.0)[::2]) == compare.fingerprint(f32(1.0, 3.0))
    assert compare.fingerprint([1.0]) is None


# --------------------------------------------------------------------------- verdict


def _checks(**failed):
    checks = {name: {"status": "pass", "detail": ""} for name in verdict.CHECKS}
    for name, status in failed.items():
        checks[name] = {"status": status, "detail": "x"}
    return checks


def test_decide_names_failures_in_check_order():
    assert verdict.decide(_checks()) == ("pass", [])
    assert verdict.decide(_checks(side_stream="fail", official="fail")) == (
        "fail",
        ["official", "side_stream"],
    )


def test_decide_fails_when_the_value_checks_did_not_run():
    assert verdict.decide(_checks(official="not_run")) == ("fail", [])
    assert verdict.decide(_checks(side_stream="not_applicable")) == ("pass", [])


def _stats(values):
    from kbfuse.timing.measure import stats

    return stats(values)


def test_speedups_pair_rounds_and_pick_the_fastest_compiled_baseline():
    timing = {
        "events": {
            "candidate": _stats([1.0, 1.0, 1.0]),
            "eager": _stats([2.0, 3.0, 4.0]),
            "torchscript": _stats([1.5, 1.5, 1.5]),
            "inductor": _stats([1.2, 1.1, 1.3]),
        },
        "graph_missing": "capture failed",
    }
    result = verdict.speedups(timing)
    assert list(result) == ["events"]
    assert result["events"]["over_eager"]["median"] == 3.0
    assert result["events"]["best_compiled"] == "inductor"
    assert result["events"]["over_best_compiled"]["median"] == pytest.approx(1.2)
    assert verdict.speedups(None) is None


def test_validate_names_the_field():
    with pytest.raises(KbfuseError, match=r"^v: field <top level>: 'kind' is a required"):
        verdict.validate({}, "v")


# --------------------------------------------------------------------------- guards, witness


def test_kernel_streams_read_gpu_activity_from_a_chrome_trace(tmp_path):
    trace = tmp_path / "t.json"
    events = [
        {"cat": "kernel", "name": "ampere_sgemm", "args": {"stream": 7}},
        {"cat": "gpu_memcpy", "name": "Memcpy DtoD", "args": {"stream": 7}},
        {"cat": "kernel", "name": "tail53", "args": {"stream": 13}},
        {"cat": "cpu_op", "name": "aten::mm", "args": {}},
    ]
    trace.write_text(json.dumps({"traceEvents": events}))
    found = guards.kernel_streams(trace)
    assert [(k["name"], k["stream"]) for k in found] == [
        ("ampere_sgemm", 7),
        ("Memcpy DtoD", 7),
        ("tail53", 13),
    ]
    caller = found[:2]
    side = guards.side_stream_work(caller, found)
    assert side["detected"] is True
    assert side["caller_streams"] == [7] and side["candidate_streams"] == [7, 13]
    assert [k["name"] for k in side["off_stream"]] == ["tail53"]
    assert guards.side_stream_work(caller, caller)["detected"] is False
    assert guards.side_stream_work([], found)["detected"] is False  # no caller stream known
    assert "first_call" not in side


def test_the_first_call_is_recorded_beside_the_call_that_decides(tmp_path):
    caller = [{"name": "gemm", "cat": "kernel", "stream": 7}]
    fills = [{"name": "fill", "cat": "kernel", "stream": 29}] * 2
    first = caller + fills
    side = guards.side_stream_work(caller, caller, first_call=first)
    assert side == {
        "caller_streams": [7],
        "candidate_streams": [7],
        "off_stream": [],
        "detected": False,
        "first_call": {"candidate_streams": [7, 29], "off_stream": fills, "detected": True},
    }
    later = guards.side_stream_work(caller, first, first_call=caller)
    assert later["detected"] is True and later["first_call"]["detected"] is False
    assert later["off_stream"] == fills


def test_only_a_plain_tensor_is_not_lazy():
    class Sub(torch.Tensor):
        pass

    assert guards.lazy_result(torch.zeros(2)) is None
    assert guards.lazy_result(torch.zeros(2).as_subclass(Sub)).endswith("Sub, not torch.Tensor")
    assert guards.lazy_result([1.0]) == "output is builtins.list, not torch.Tensor"


def test_timer_snapshot_sees_a_replaced_function(monkeypatch):
    import time

    before = guards.snapshot()
    assert guards.patched(before) == []
    monkeypatch.setattr(time, "monotonic", lambda: 0.0)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    assert guards.patched(before) == ["time.monotonic", "torch.cuda.synchronize"]


def test_witness_classifies_flushed_kept_and_broken_outputs():
    kept = witness.kept_value()
    assert 0 < kept < 1.2e-38  # subnormal
    assert witness.classify(0.0) is True
    assert witness.classify(kept) is False
    assert witness.classify(math.nan) is None
    assert witness.classify(1e-40 * 3) is None


def test_trivial_status_comes_from_the_survey_record_when_there_is_one(tmp_path):
    from kbfuse.candidates.evidence import trivial_status

    computed = {"trivial": {"zeros": {"applicable": True, "passes": False}, "blind_spot": False}}
    survey = tmp_path / "23.json"
    spots = {
        "zeros": {"applicable": True, "passes": True},
        "mean_constant": {"applicable": True, "passes": True, "value": 1e-9},
        "input_identity": {"applicable": False, "passes": None},
    }
    survey.write_text(json.dumps({"kind": "survey_task", "blind_spots": spots, "blind_spot": True}))
    status, source = trivial_status(computed, survey)
    assert source == "survey record 23.json"
    assert status["zeros"]["passes"] is True and status["blind_spot"] is True
    assert trivial_status(computed, tmp_path / "missing.json") == (
        computed["trivial"],
        "computed by the reference process",
    )
    survey.write_text(json.dumps({"kind": "survey_task"}))  # no blind spots recorded
    assert trivial_status(computed, survey)[1] == "computed by the reference process"


def test_stage_seconds_are_kept_only_as_the_runner_writes_them():
    from kbfuse.candidates.evidence import _stage_seconds

    good = {"build": 1.5, "correctness": 0.2, "alone_wait": 0, "timing": 3}
    assert _stage_seconds(good) == good
    # a forged or broken report is dropped, not passed into the verdict
    assert _stage_seconds({"build": -1.0}) is None
    assert _stage_seconds({"build": True}) is None
    assert _stage_seconds({"sleep": 1.0}) is None
    assert _stage_seconds({"build": "1"}) is None
    assert _stage_seconds(["build", 1.0]) is None
    assert _stage_seconds(None) is None


def test_a_case_the_device_has_no_memory_for_is_compared_on_the_cpu(monkeypatch):
    import torch

    from kbfuse.candidates import compare, evidence

    real = compare.compare_case
    devices = []

    def short_of_memory(reference, candidate, contract, device="cpu"):
        devices.append(device)
        if device != "cpu":
            raise torch.OutOfMemoryError("CUDA out of memory")
        return real(reference, candidate, contract, device)

    monkeypatch.setattr(compare, "compare_case", short_of_memory)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    contract = {"atol": 1e-2, "rtol": 1e-2, "argument_order": ["reference", "candidate"]}
    x = torch.arange(6, dtype=torch.float32)
    record = evidence.compare_on("cuda", x, x.clone(), contract)
    assert devices == ["cuda", "cpu"]
    assert record["bit_identical"] is True and record["official_pass"] is True
    # on the CPU itself there is nowhere else to go: the error is the harness's
    monkeypatch.setattr(compare, "compare_case", lambda *a: (_ for _ in ()).throw(
        torch.OutOfMemoryError("host")))  # fmt: skip
    with pytest.raises(torch.OutOfMemoryError, match="host"):
        evidence.compare_on("cpu", x, x, contract)


def test_inputs_digest_follows_values_dtype_shape_and_plain_values():
    from kbfuse.candidates.childio import inputs_digest

    x = torch.arange(6, dtype=torch.float32)
    same = inputs_digest([x.clone(), 3])
    assert same == inputs_digest([x, 3]) and len(same) == 64
    assert inputs_digest([x.reshape(2, 3), 3]) != same  # shape
    assert inputs_digest([x.double(), 3]) != same  # dtype
    last_bit = x.clone()
    last_bit[5] = torch.nextafter(last_bit[5], torch.tensor(10.0))
    assert inputs_digest([last_bit, 3]) != same  # one value's last bit
    assert inputs_digest([x, 4]) != same and inputs_digest([x, 3.0]) != same
    assert inputs_digest([x.reshape(3, 2).t()]) == inputs_digest([x.reshape(3, 2).t().contiguous()])
    assert inputs_digest([torch.tensor(1.5), torch.zeros(0, 4, dtype=torch.bool)])


def test_fresh_defaults_set_the_saved_dtype_and_device_for_the_block_only():
    from kbfuse.candidates.childio import fresh_defaults, torch_defaults

    saved = torch_defaults()
    assert saved == (torch.float32, torch.device("cpu"))
    torch.set_default_dtype(torch.float64)
    try:
        with fresh_defaults(saved):
            assert torch.rand(2).dtype == torch.float32
        assert torch.rand(2).dtype == torch.float64
    finally:
        torch.set_default_dtype(torch.float32)


def test_fresh_defaults_override_a_changed_default_device_and_leave_no_device_mode_behind():
    from kbfuse.candidates.childio import fresh_defaults, torch_defaults

    stack = torch._C._len_torch_function_stack
    saved = torch_defaults()
    with fresh_defaults(saved):
        assert torch.rand(2).device == torch.device("cpu")
    assert stack() == 0  # a mode left on the stack would slow every later op of the process
    torch.set_default_device("meta")  # as a candidate file may do at import
    try:
        with fresh_defaults(saved):
            assert torch.rand(2).device == torch.device("cpu")
        assert torch.rand(2).device == torch.device("meta")
    finally:
        torch.set_default_device(None)
    assert stack() == 0


def test_inputs_differ_names_compared_cases_whose_reported_digests_are_not_the_references():
    from kbfuse.candidates.evidence import inputs_differ

    a, b = "a" * 64, "b" * 64
    info = {"inputs_sha256": {"official_0": a, "weights": a, "uniform_s0": b}}
    correctness = {"cases": {"official_0": {}, "weights": {}, "uniform_s0": {}, "after_timing": {}}}
    drawn = {"official_0": a, "weights": b, "after_timing": b}  # uniform_s0 not reported
    assert inputs_differ(info, {"inputs_sha256": drawn}, correctness) == ["weights", "after_timing"]
    assert inputs_differ(info, {}, correctness) == []
    assert inputs_differ({}, {"inputs_sha256": drawn}, correctness) == []


def test_switch_changes_name_each_switch_once_at_the_first_point_it_differs():
    from kbfuse.candidates.switches import changes

    before = {"cudnn.benchmark": False, "cuda.matmul.allow_tf32": False, "cudnn.enabled": True}
    readings = {
        "before_import": before,
        "after_build": {**before, "cudnn.benchmark": True},
        "at_timing": {
            **before,
            "cudnn.benchmark": False,  # set back: still named, at build
            "cuda.matmul.allow_tf32": "unreadable (RuntimeError)",
        },
    }
    assert changes(readings) == [
        "cudnn.benchmark: False -> True (at build)",
        "cuda.matmul.allow_tf32: False -> unreadable (RuntimeError) (at timing)",
    ]
    assert changes({"before_import": before, "after_build": before}) == []
    assert changes({"after_build": before}) == [] and changes(None) == []


def test_a_legacy_switch_unreadable_after_the_new_api_set_it_is_recorded_as_such():
    # a process of its own: the new API's setting would stay for the rest of this one
    code = (
        "import json, torch\n"
        "from kbfuse.candidates import switches\n"
        "torch.backends.cuda.matmul.fp32_precision = 'tf32'\n"
        "print(json.dumps(switches.read()))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    read = json.loads(done.stdout)
    assert read["cuda.matmul.fp32_precision"] == "tf32"
    assert read["cuda.matmul.allow_tf32"] == "unreadable (RuntimeError)"
    assert read["float32_matmul_precision"] == "unreadable (RuntimeError)"
    assert read["cudnn.benchmark"] is False and read["deterministic_algorithms"] is False
