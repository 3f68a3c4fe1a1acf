"""The candidate check's verdict and its flag reading, in the details that
tests/test_check_units.py leaves open (found by mutation testing, docs/mutation.md): each
check's status and detail from the stage results, the findings, and nvcc's option spellings.
"""

from __future__ import annotations

import threading

import pytest

from kbfuse.candidates import flags, verdict
from kbfuse.errors import KbfuseError


def case(ok: bool = True, **extra) -> dict:
    return {"official_pass": ok, "max_abs": 0.0 if ok else 0.5, **extra}


def test_decide_passes_only_when_no_check_failed_and_the_value_checks_passed():
    checks = {name: {"status": "pass"} for name in verdict.CHECKS}
    assert verdict.decide(checks) == ("pass", [])
    checks["side_stream"] = {"status": "not_applicable"}
    assert verdict.decide(checks) == ("pass", [])


def test_decide_needs_both_value_checks_to_pass():
    checks = {name: {"status": "pass"} for name in verdict.CHECKS}
    checks["distributions"] = {"status": "not_run"}
    assert verdict.decide(checks) == ("fail", [])
    checks["distributions"] = {"status": "pass"}
    checks["build"] = {"status": "fail"}
    checks["unfinished_on_caller_stream"] = {"status": "fail"}
    assert verdict.decide(checks) == ("fail", ["build", "unfinished_on_caller_stream"])


# --------------------------------------------------------------------------- correctness

PLANNED = [
    {"name": "official_0", "group": "official"},
    {"name": "official_1", "group": "official"},
    {"name": "weights_0", "group": "weights"},
    {"name": "normal", "group": "distribution"},
    {"name": "never_ran", "group": "distribution"},
]


def correctness(cases=None, pairs=(), skipped=None) -> dict:
    if cases is None:
        cases = {
            "official_0": case(),
            "official_1": case(),
            "weights_0": case(),
            "normal": case(),
            "after_timing": case(),
        }
    block = {"cases": cases, "cached_pairs": list(pairs)}
    if skipped is not None:
        block["skipped_cases"] = skipped
    return block


def test_every_correctness_check_passes_with_counts_in_the_detail():
    checks = verdict.correctness_checks(correctness(), PLANNED)
    assert checks == {
        "official": {"status": "pass", "detail": "2 official case(s) pass the official predicate"},
        "distributions": {
            "status": "pass",
            "detail": "1 distribution case(s) pass the official predicate",
        },
        "changed_weights": {
            "status": "pass",
            "detail": "1 changed-weights case(s) pass the official predicate",
        },
        "input_independent": {"status": "pass", "detail": "outputs follow inputs and weights"},
        "output_after_timing": {
            "status": "pass",
            "detail": "output after the timed region is right",
        },
    }


def test_a_failing_case_fails_its_group_naming_the_cases_and_the_first_error():
    cases = {
        "official_0": case(),
        "official_1": case(False),
        "weights_0": case(False, problem="output shape (2,) differs"),
        "normal": case(),
        "after_timing": case(),
    }
    checks = verdict.correctness_checks(correctness(cases), PLANNED)
    assert checks["official"] == {
        "status": "fail",
        "detail": "1/2 official case(s) fail: official_1 (max error 0.5)",
    }
    assert checks["changed_weights"] == {
        "status": "fail",
        "detail": "1/1 changed-weights case(s) fail: weights_0 (output shape (2,) differs)",
    }
    assert checks["distributions"]["status"] == "pass"


def test_more_than_four_failing_cases_are_cut_short():
    names = [f"o{i}" for i in range(6)]
    cases = {n: case(False) for n in names}
    detail = verdict._cases_check(cases, names, "official", [])["detail"]
    assert detail == "6/6 official case(s) fail: o0, o1, o2, o3 ... (max error 0.5)"
    five = verdict._cases_check(cases, names[:5], "official", [])["detail"]
    assert five == "5/5 official case(s) fail: o0, o1, o2, o3 ... (max error 0.5)"
    four = verdict._cases_check(cases, names[:4], "official", [])["detail"]
    assert four == "4/4 official case(s) fail: o0, o1, o2, o3 (max error 0.5)"


def test_groups_with_no_case_run_are_not_run_and_fail_the_verdict():
    cases = {"official_0": case()}
    checks = verdict.correctness_checks(correctness(cases), PLANNED)
    assert checks["distributions"] == {"status": "not_run", "detail": "no distribution case ran"}
    assert checks["changed_weights"] == {
        "status": "not_run",
        "detail": "no changed-weights case ran",
    }
    assert checks["input_independent"] == {
        "status": "not_run",
        "detail": "fewer than two calls ran",
    }
    assert checks["output_after_timing"] == {"status": "not_run", "detail": "timing did not finish"}


def test_two_calls_are_enough_to_check_input_independence():
    cases = {"official_0": case(), "official_1": case()}
    checks = verdict.correctness_checks(correctness(cases), PLANNED)
    assert checks["input_independent"]["status"] == "pass"


def test_skipped_weights_are_not_applicable_with_the_reason():
    checks = verdict.correctness_checks(
        correctness(skipped={"weights": "parameters named differently"}), PLANNED
    )
    assert checks["changed_weights"] == {
        "status": "not_applicable",
        "detail": "parameters named differently",
    }
    other = verdict.correctness_checks(correctness(skipped={"other": "x"}), PLANNED)
    assert other["changed_weights"]["status"] == "pass"


def test_cached_outputs_fail_input_independence_naming_three_pairs():
    pairs = [["a", "b"], ["c", "d"], ["e", "f"], ["g", "h"]]
    checks = verdict.correctness_checks(correctness(pairs=pairs), PLANNED)
    assert checks["input_independent"] == {
        "status": "fail",
        "detail": "bit-identical outputs for different inputs or weights (cached or constant): "
        "a and b; c and d; e and f",
    }


@pytest.mark.parametrize(
    ("after", "detail"),
    [
        (case(False), "output after the timed region: 0.5"),
        (case(False, problem="not a tensor"), "output after the timed region: not a tensor"),
    ],
)
def test_a_wrong_output_after_timing_fails(after, detail):
    cases = {"official_0": case(), "after_timing": after}
    checks = verdict.correctness_checks(correctness(cases), PLANNED)
    assert checks["output_after_timing"] == {"status": "fail", "detail": detail}


# --------------------------------------------------------------------------- guards

CLEAN = {
    "patched": {"after_import": [], "after_calls": []},
    "lazy": [],
    "side_stream": {
        "detected": False,
        "caller_streams": [7],
        "candidate_streams": [7],
        "off_stream": [],
    },
    "unfinished_on_caller_stream": False,
}


def test_guards_not_reached_are_all_not_run():
    checks = verdict.guard_checks(None, "cuda")
    assert checks == {
        name: {"status": "not_run", "detail": "the candidate did not get that far"}
        for name in verdict.GUARD_CHECKS
    }


def test_clean_guards_pass_on_the_gpu():
    assert verdict.guard_checks(CLEAN, "cuda") == {
        "timer_patched": {
            "status": "pass",
            "detail": "every watched clock and sync function unchanged",
        },
        "lazy_result": {"status": "pass", "detail": "every output is a plain torch.Tensor"},
        "side_stream": {"status": "pass", "detail": "all GPU work on [7]"},
        "unfinished_on_caller_stream": {
            "status": "pass",
            "detail": "output complete when the caller's stream is done",
        },
    }


def test_without_a_gpu_the_stream_guards_do_not_apply():
    checks = verdict.guard_checks(CLEAN, "cpu")
    assert checks["side_stream"] == {"status": "not_applicable", "detail": "no GPU: no streams"}
    assert checks["unfinished_on_caller_stream"] == {
        "status": "not_applicable",
        "detail": "no GPU: no streams",
    }
    assert checks["timer_patched"]["status"] == "pass"


def test_each_guard_fails_with_what_it_saw():
    guards = {
        "patched": {"after_import": ["time.perf_counter"], "after_calls": ["a.b", "a.b"]},
        "lazy": [{"why": "a subclass of Tensor"}, {"why": "second"}],
        "side_stream": {
            "detected": True,
            "caller_streams": [7],
            "candidate_streams": [9],
            "off_stream": [{"name": "k" * 70}, {"name": "b"}, {"name": "a"}, {"name": "c"}],
        },
        "unfinished_on_caller_stream": True,
    }
    checks = verdict.guard_checks(guards, "cuda")
    assert checks["timer_patched"] == {
        "status": "fail",
        "detail": "replaced: a.b, time.perf_counter",
    }
    assert checks["lazy_result"] == {"status": "fail", "detail": "a subclass of Tensor"}
    assert checks["side_stream"] == {
        "status": "fail",
        "detail": "GPU work on stream(s) [9], caller's [7]: a, b, c",
    }
    assert checks["unfinished_on_caller_stream"] == {
        "status": "fail",
        "detail": "the output changed after the caller's stream was done",
    }
    one = {**guards, "side_stream": {**guards["side_stream"], "off_stream": [{"name": "k" * 70}]}}
    shown = verdict.guard_checks(one, "cuda")["side_stream"]["detail"]
    assert shown.endswith(": " + "k" * 60)


def test_stream_guards_that_did_not_run_are_not_run():
    guards = {key: value for key, value in CLEAN.items() if key in ("patched", "lazy")}
    checks = verdict.guard_checks(guards, "cuda")
    assert checks["side_stream"] == {"status": "not_run", "detail": "the guard stage did not run"}
    assert checks["unfinished_on_caller_stream"] == {
        "status": "not_run",
        "detail": "the guard stage did not run",
    }


# --------------------------------------------------------------------------- process

EXITED = {"status": "exited", "returncode": 0, "wall_s": 3.5, "peak_rss_mb": 100}


def test_a_clean_run_passes_every_process_check():
    assert verdict.process_checks(EXITED, None, ["build", "official"]) == {
        "time_limit": {"status": "pass", "detail": ""},
        "memory_limit": {"status": "pass", "detail": ""},
        "runtime_error": {"status": "pass", "detail": "no exception after the build"},
        "build": {"status": "pass", "detail": "imported and constructed"},
    }


def test_limits_fail_with_the_figure():
    timed_out = verdict.process_checks({**EXITED, "status": "time_limit"}, None, ["build"])
    assert timed_out["time_limit"] == {"status": "fail", "detail": "killed after 3.5 s"}
    assert timed_out["memory_limit"]["status"] == "pass"
    hog = verdict.process_checks({**EXITED, "status": "memory_limit"}, None, [])
    assert hog["memory_limit"] == {"status": "fail", "detail": "killed at 100 MB resident"}
    assert hog["time_limit"]["status"] == "pass"
    assert hog["build"] == {
        "status": "not_run",
        "detail": "the process was killed (memory_limit) before",
    }


def test_a_build_failure_is_the_build_check_not_a_runtime_error():
    failure = {"stage": "build", "error": "OSError", "message": "nvcc failed"}
    checks = verdict.process_checks(EXITED, failure, [])
    assert checks["build"] == {"status": "fail", "detail": "OSError: nvcc failed"}
    assert checks["runtime_error"]["status"] == "pass"


def test_a_later_failure_is_a_runtime_error_naming_the_stage():
    failure = {"stage": "official", "error": "RuntimeError", "message": "boom"}
    checks = verdict.process_checks(EXITED, failure, ["build"])
    assert checks["runtime_error"] == {
        "status": "fail",
        "detail": "official stage: RuntimeError: boom",
    }
    assert checks["build"]["status"] == "pass"


def test_a_process_that_exits_before_building_fails_the_build():
    checks = verdict.process_checks({**EXITED, "returncode": 3}, None, [])
    assert checks["build"] == {
        "status": "fail",
        "detail": "the candidate process exited with status 3",
    }


# --------------------------------------------------------------------------- findings


def record(
    trivial=None, cases=None, fast=False, ftz=False, effective=False, used="bwrap", changed=()
):
    return {
        "guards": {"switches_changed": list(changed)},
        "sandbox": {"used": used, "version": None},
        "trivial": trivial,
        "correctness": {"cases": cases or {"a": {"problem": None, "bit_identical": True}}},
        "contract": {"implies": {"use_fast_math": fast, "ftz": ftz}, "effective_ftz": effective},
    }


def test_no_findings_for_a_clean_bit_identical_candidate():
    assert verdict.findings(record()) == []
    assert verdict.findings(record(trivial={"blind_spot": False})) == []


def test_every_finding_is_named_in_order():
    cases = {"a": {"problem": None, "bit_identical": True}, "b": {"problem": None}}
    found = verdict.findings(
        record({"blind_spot": True}, cases, fast=True, ftz=True, effective=True)
    )
    assert found == ["blind_spot", "not_bit_identical", "fast_math", "ftz", "ftz_effective"]
    unsandboxed = verdict.findings(record(cases=cases, fast=True, used="none"))
    assert unsandboxed == ["not_bit_identical", "unsandboxed", "fast_math"]
    switched = record(effective=True, changed=["cudnn.benchmark: False -> True (at build)"])
    assert verdict.findings(switched) == ["ftz_effective", "switches_changed"]
    assert verdict.findings({**record(), "guards": None}) == []  # no report, no guards


def test_a_case_with_a_problem_is_not_a_bit_finding():
    cases = {"a": {"problem": "shape", "bit_identical": False}}
    assert verdict.findings(record(cases=cases)) == []
    assert verdict.findings(record(ftz=True)) == ["ftz"]
    assert verdict.findings(record(effective=True)) == ["ftz_effective"]


# --------------------------------------------------------------------------- speedups


def stats(values):
    from kbfuse.timing.measure import stats as measure_stats

    return measure_stats(values)


def test_speedups_without_eager_or_compiled_baselines_are_none():
    timing = {
        "cold_l2": {"eager": stats([1.0, 1.0])},  # no candidate figures: left out, not the end
        "graph_missing": "the candidate synchronises while captured",
        "events": {"candidate": stats([1.0, 1.0]), "torchscript": stats([2.0, 4.0])},
        "graph": {"candidate": stats([1.0, 1.0])},
    }
    result = verdict.speedups(timing)
    assert list(result) == ["events", "graph"]
    assert result["events"]["over_eager"] is None
    assert result["events"]["best_compiled"] == "torchscript"
    assert result["events"]["over_best_compiled"]["median"] == 3.0
    assert result["graph"] == {
        "over_eager": None,
        "best_compiled": None,
        "over_best_compiled": None,
    }
    assert verdict.speedups({}) is None


def test_speedups_pair_per_round_over_the_whole_block():
    timing = {
        "events": {
            "candidate": stats([1.0, 2.0, 4.0, 2.0, 1.0]),
            "eager": stats([2.0, 2.0, 2.0, 1.0, 1.0]),
            "inductor": stats([1.0, 1.0, 1.0, 1.0, 1.0]),
            "torchscript": stats([0.5, 8.0, 8.0, 8.0, 0.5]),
        }
    }
    entry = verdict.speedups(timing)["events"]
    assert entry["best_compiled"] == "inductor"  # the lower median, not the lowest sample
    faster_script = {**timing["events"], "torchscript": stats([0.5, 0.5, 0.5, 0.5, 0.5])}
    assert verdict.speedups({"events": faster_script})["events"]["best_compiled"] == "torchscript"
    assert entry["over_eager"]["median"] == 1.0
    assert entry["over_best_compiled"]["median"] == 0.5
    # one cycle is the four timed implementations of the block: four rounds are balanced
    assert entry["over_eager"]["balanced_rounds"] == 4
    assert entry["over_best_compiled"]["balanced_rounds"] == 4
    assert entry["over_eager"]["balanced"] == pytest.approx(0.5 ** (1 / 4))


# --------------------------------------------------------------------------- flags


@pytest.mark.parametrize(
    ("token", "following", "parsed"),
    [
        ("--ftz=true", None, ("ftz", "true", False)),
        ("-fmad=False", None, ("fmad", "false", False)),
        ("--prec-div", "FALSE", ("prec-div", "false", True)),
        ("-prec-sqrt", "true", ("prec-sqrt", "true", True)),
        ("--prec-sqrt", "maybe", None),
        ("--prec-sqrt", None, None),
        ("ftz=true", None, None),  # not an option: no dash
        ("---ftz=true", None, None),  # three dashes: not nvcc's spelling
        ("-Xftz=true", None, None),  # only dashes are stripped
        ("-Xfmad", "false", None),
        ("--ftzz=true", None, None),
        ("--O3", None, None),
    ],
)
def test_bool_option_reads_nvccs_numeric_options_only(token, following, parsed):
    assert flags._bool_option(token, following) == parsed


def test_a_consumed_value_is_not_read_again_and_unknown_tokens_are_skipped():
    implied = flags.implications(["--fmad", "false", "-O3", "--prec-div", "false"])
    assert implied["explicit"] == {"fmad": "false", "prec-div": "false"}
    assert implied["fmad"] is False and implied["prec_div"] is False
    assert implied["prec_sqrt"] is True and implied["ftz"] is False
    # "-Xptxas" consumes its value: a following "--ftz=true" as its value is not a device flag
    consumed = flags.implications(["-Xptxas", "--ftz=true", "--prec-sqrt=false"])
    assert consumed["ptxas_options"] == ["--ftz=true"]
    assert consumed["explicit"] == {"prec-sqrt": "false"}
    assert consumed["ftz"] is False and consumed["prec_sqrt"] is False


def test_every_fast_math_spelling_and_the_explicit_values_win():
    implied = flags.implications(["--use-fast-math", "--prec-div=true", "--fmad=false"])
    assert implied["use_fast_math"] is True
    assert implied["ftz"] is True and implied["prec_sqrt"] is False
    assert implied["prec_div"] is True and implied["fmad"] is False
    assert implied["explicit"] == {"prec-div": "true", "fmad": "false"}


def test_ptxas_and_host_options_in_every_spelling():
    implied = flags.implications(
        [
            "--ptxas-options",
            "-v",
            "-Xptxas=-O1",
            "--ptxas-options=-O2",
            "-Xcompiler",
            "-funsafe-math-optimizations,-O2,-ffast-math",
            "-Xcompiler",
        ],
        ["-ffast-math", "-O3"],
    )
    assert implied["ptxas_options"] == ["-v", "-O1", "-O2"]
    assert implied["host_fast_math"] == [
        "-ffast-math",
        "-funsafe-math-optimizations",
        "-ffast-math",
    ]
    assert implied["use_fast_math"] is False and implied["explicit"] == {}
    last = flags.implications(["-Xptxas"])  # a dangling option consumes nothing
    assert last["ptxas_options"] == []


def within(seconds: float, function, *args):
    """`function(*args)`, failing the test when it has not returned after `seconds` (a mistake
    in how far implications' loop steps can make it run for ever: a failure, not a hang)."""
    result = {}
    thread = threading.Thread(target=lambda: result.update(value=function(*args)), daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"{function.__name__} still running after {seconds} s"
    return result["value"]


def test_options_that_take_a_value_anywhere_in_the_list_are_stepped_over_once():
    tokens = [
        "-O3",
        "-lineinfo",
        "-Xptxas",
        "-v",
        "--fmad",
        "false",
        "-Xcompiler",
        "-ffast-math",
        "-Xptxas=--def-load-cache=ca",
        "--ftz=true",
        "-Xptxas",
    ]
    implied = within(10, flags.implications, tokens)
    assert implied["ptxas_options"] == ["-v", "--def-load-cache=ca"]
    assert implied["explicit"] == {"fmad": "false", "ftz": "true"}
    assert implied["host_fast_math"] == ["-ffast-math"]
    assert implied["fmad"] is False and implied["ftz"] is True


def test_ninja_flags_join_continued_lines_and_skip_the_rest(tmp_path):
    path = tmp_path / "build.ninja"
    path.write_bytes(
        b"cflags = -O3 $\n  -fPIC\n"
        b"  cuda_cflags = -indented\n"
        b" ldflags = -one-space\n"
        b"\tcflags = -tab\n"
        b"ldflags\n"
        b"cuda_cflags=--use_fast_math '-D X=1'\n"
        b"post_cflags = -DA='unterminated \xff\n"
        b"nvcc = /x/nvcc\n"
    )
    found = flags.read_ninja_flags(path)
    assert found == {
        "cflags": ["-O3", "-fPIC"],
        "cuda_cflags": ["--use_fast_math", "-D X=1"],
        "post_cflags": ["-DA='unterminated", "\ufffd"],
    }


def test_ninja_builds_are_sorted_with_device_and_host_flags_in_order(tmp_path):
    for name, text in [
        ("b_ext", "cuda_cflags = --ftz=true\ncuda_post_cflags = -O3\n"),
        ("a_ext", "cflags = -O2\npost_cflags = -Ofast\ncuda_post_cflags = --use_fast_math\n"),
        ("c_ext", "cuda_cflags = --fmad=false\n"),  # no post flags, no host flags
    ]:
        (tmp_path / "x" / name).mkdir(parents=True)
        (tmp_path / "x" / name / "build.ninja").write_text(text)
    builds = flags.ninja_builds(str(tmp_path))
    assert [b["extension"] for b in builds] == ["a_ext", "b_ext", "c_ext"]
    assert builds[2]["cuda_flags"] == ["--fmad=false"] and builds[2]["host_flags"] == []
    assert builds[2]["implies"]["fmad"] is False
    assert builds[0]["cuda_flags"] == ["--use_fast_math"]
    assert builds[0]["host_flags"] == ["-O2", "-Ofast"]
    assert builds[0]["implies"]["host_fast_math"] == ["-Ofast"]
    assert builds[0]["implies"]["use_fast_math"] is True
    assert builds[1]["cuda_flags"] == ["--ftz=true", "-O3"]
    assert builds[1]["host_flags"] == []
    assert builds[1]["implies"]["ftz"] is True


def test_user_flags_skip_builds_without_flags():
    captured = [
        {"extra_cuda_cflags": None, "options": ("-a",)},
        {},
        {"extra_cuda_cflags": ["-b 'c d'"]},
    ]
    assert flags.user_device_flags(captured) == ["-a", "-b", "c d"]
    assert flags.split_flags([3, "-x -y"]) == ["3", "-x", "-y"]


# --------------------------------------------------------------------------- validate

SMALL_SCHEMA = {
    "type": "object",
    "properties": {
        "a": {"type": "array", "items": {"type": "integer"}},
        "b": {"type": "integer"},
    },
}


def test_validate_names_the_first_field_by_path_and_cuts_the_message(monkeypatch):
    monkeypatch.setattr(verdict, "schema", lambda name="check_candidate.json": SMALL_SCHEMA)
    verdict.validate({"a": [1, 2], "b": 3}, "ok")  # nothing to say
    with pytest.raises(KbfuseError, match=r"^rec: field a\.1: ") as refused:
        verdict.validate({"b": "s", "a": [1, "x"]}, "rec")
    assert str(refused.value) == "rec: field a.1: 'x' is not of type 'integer'"
    with pytest.raises(KbfuseError, match=r"^rec: field a\.0: 'yyy") as long:
        verdict.validate({"a": ["y" * 400]}, "rec")
    message = str(long.value)
    assert message.startswith("rec: field a.0: 'yyy")
    assert len(message) == len("rec: field a.0: ") + 300


# --------------------------------------------------------------------------- first call

GRAPH_FILLS = [
    {"name": "void at::native::vectorized_elementwise_kernel<2, at::native::FillFunctor<long>"}
] * 2


def side(detected_later: bool, detected_first: bool) -> dict:
    return {
        "detected": detected_later,
        "caller_streams": [7],
        "candidate_streams": [7, 9] if detected_later else [7],
        "off_stream": [{"name": "tail"}] if detected_later else [],
        "first_call": {
            "detected": detected_first,
            "candidate_streams": [7, 29] if detected_first else [7],
            "off_stream": GRAPH_FILLS if detected_first else [],
        },
    }


def test_side_stream_work_of_the_first_call_alone_passes_and_is_a_finding():
    """A CUDA graph captured on the first call: PyTorch's bookkeeping fills on the capture
    stream then, nothing off the caller's stream later (what session 26 saw on the H200)."""
    guards = {**CLEAN, "side_stream": side(False, True)}
    assert verdict.guard_checks(guards, "cuda")["side_stream"] == {
        "status": "pass",
        "detail": "all GPU work on [7] after the first call (the first also on [7, 29]:"
        " void at::native::vectorized_elementwise_kernel<2, at::native)",
    }
    assert verdict.findings({**record(), "guards": guards}) == ["side_stream_first_call"]


def test_side_stream_work_after_the_first_call_fails_whatever_the_first_did():
    for first in (False, True):
        guards = {**CLEAN, "side_stream": side(True, first)}
        check = verdict.guard_checks(guards, "cuda")["side_stream"]
        assert check == {
            "status": "fail",
            "detail": "GPU work on stream(s) [7, 9], caller's [7]: tail",
        }
        assert verdict.findings({**record(), "guards": guards}) == []


def test_a_record_without_the_first_call_reads_as_before():
    """Verdicts made before the first call was profiled apart (session 24's) stay valid."""
    assert verdict.guard_checks(CLEAN, "cuda")["side_stream"]["detail"] == "all GPU work on [7]"
    quiet = {**CLEAN, "side_stream": side(False, False)}
    assert verdict.guard_checks(quiet, "cuda")["side_stream"]["detail"] == "all GPU work on [7]"
    assert verdict.findings({**record(), "guards": quiet}) == []


def test_the_report_schema_takes_the_first_call_and_names_a_broken_one():
    assert verdict.runner_problem({"side_stream": side(False, True)}) is None
    assert verdict.runner_problem({"side_stream": CLEAN["side_stream"]}) is None
    broken = side(False, True)
    del broken["first_call"]["detected"]
    problem = verdict.runner_problem({"side_stream": broken})
    assert problem.startswith("field side_stream: {'detected': False,")  # oneOf: null or this


def test_the_first_calls_work_is_named_three_at_most_in_order():
    first = side(False, True)
    first["first_call"]["off_stream"] = [{"name": n} for n in ("d", "b", "a", "c", "a")]
    detail = verdict.guard_checks({**CLEAN, "side_stream": first}, "cuda")["side_stream"]["detail"]
    assert detail == "all GPU work on [7] after the first call (the first also on [7, 29]: a, b, c)"
