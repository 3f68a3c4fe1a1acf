"""The survey's per-task job on the CPU, on the KernelBench-shaped fixture of tests/survey_kbrepo.

One module-scoped run surveys a GEMM tail (53), a convolution (1), a normalisation (23), a task
torch.jit.trace cannot trace (7), one that reads a value back to the host (9) and a Dropout in
training mode (66); the tests read the records it wrote, each valid against its schema.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
from pathlib import Path

import pytest
from survey_kbrepo import make_survey_repo

from kbfuse.checks import official
from kbfuse.errors import KbfuseError
from kbfuse.io import read_json
from kbfuse.results import records
from kbfuse.survey import baselines as survey_baselines
from kbfuse.survey import job as survey_job
from kbfuse.survey import timing as survey_timing
from kbfuse.survey.job import run_survey_task, share_compile_caches
from kbfuse.survey.settings import survey_settings
from kbfuse.survey.tasks import read_task_list, write_task_list
from kbfuse.tasks.evaluator import write_contract
from kbfuse.tasks.kernelbench import pin_kernelbench, pin_task

TASKS = [1, 7, 9, 23, 53, 66]
# Inductor (a C++ compile per task on the CPU, 4 s with a cold cache) on the GEMM tail and on
# the task TorchScript cannot trace; the others are compiled by TorchScript only.
INDUCTOR_TASKS = {7, 53}
ROUNDS = 4
SETTINGS = {
    "device": "cpu",
    "rounds": ROUNDS,
    "warmup": 1,
    "invocations_per_pair": 2,
    "seed": 42,
}


@pytest.fixture(scope="module")
def surveyed(tmp_path_factory):
    root = tmp_path_factory.mktemp("survey")
    url, commit = make_survey_repo(root / "kb")
    checkout, record = root / "checkout", root / "checkout.json"
    pin_kernelbench(url, commit, 2, [53], checkout, record)
    write_contract(checkout, record, root / "contract.json")
    settings = survey_settings({"survey": SETTINGS})
    no_inductor = survey_settings({"survey": {**SETTINGS, "baselines": ["eager", "torchscript"]}})
    write_task_list(checkout, record, TASKS, root / "list.json")
    out = {}
    for task in TASKS:
        pin = pin_task(checkout, record, task, root / f"pin{task}.json")
        assert pin["tasks"][str(task)]["sha256"]
        out[task] = root / f"{task}.json"
        chosen = settings if task in INDUCTOR_TASKS else no_inductor
        run_survey_task(
            checkout, root / f"pin{task}.json", chosen, root / "contract.json",
            {"strict": out[task]}, print,
        )  # fmt: skip
    return {task: records.read_record(path, "survey_task") for task, path in out.items()}, root


def test_task_list_resolves_the_configured_tasks(surveyed):
    _, root = surveyed
    assert read_task_list(root / "list.json") == TASKS
    assert read_json(root / "list.json")["tasks"]["66"] == "66_Matmul_Dropout_Mean_Softmax.py"


def test_every_record_names_task_file_pin_and_modes(surveyed):
    recs, root = surveyed
    for task, rec in recs.items():
        pin = read_json(root / f"pin{task}.json")["tasks"][str(task)]
        assert rec["task"] == task and rec["level"] == 2
        assert rec["file"] == pin["path"].rsplit("/", 1)[1]
        assert rec["sha256"] == pin["sha256"]
        assert rec["semantics"] == "kernelbench" and rec["seed"] == 42
        assert rec["numerics"] == {"mode": "strict", "matmul_tf32": False, "cudnn_tf32": False}
        assert rec["device"] == "cpu" and rec["environment"]["device"] == "cpu"
        assert rec["timing_protocol"]["methods"] == ["wall"]
        assert rec["timing_protocol"]["rounds"] == ROUNDS
        assert rec["job"] == {"modes": ["strict"], "built_in": "strict", "rerun_alone": False}
        assert set(rec["phases_s"]) == {
            "load", "wait_shared", "reference_and_builds", "official_trials", "wait_alone",
            "timing", "profile", "profile_read",
        }  # fmt: skip
        # the official trials are timed within the references and builds
        phases = rec["phases_s"]
        assert 0 < phases["official_trials"] < phases["reference_and_builds"]
        protocol = rec["timing_protocol"]
        assert protocol["max_invocations_per_pair"] == 2 and protocol["min_sample_ms"] == 1.0
        # the fixture's tasks take microseconds on the CPU: the most calls per sample
        assert protocol["fastest_call_ms"] > 0
        calls = min(2, math.ceil(1.0 / protocol["fastest_call_ms"]))
        assert protocol["invocations_per_pair"] == calls, task


def test_untraceable_task_records_torchscript_build_failure_and_goes_on(surveyed):
    rec = surveyed[0][7]
    assert rec["inputs"] == [{"shape": [4, 8], "dtype": "float32"}, {"type": "int", "value": 2}]
    ts = rec["baselines"]["torchscript"]
    assert ts["status"] == "failed"
    assert ts["failure"]["stage"] == "build" and ts["failure"]["error"] == "RuntimeError"
    assert "cannot be traced" in ts["failure"]["message"]
    assert ts["timing"] is None and ts["correctness"] is None and ts["kernels"] is None
    assert rec["baselines"]["inductor"]["status"] == "ok", rec["baselines"]["inductor"]["failure"]
    assert set(rec["ratios"]) == {"inductor"}


def test_dropout_in_training_mode_is_flagged_nondeterministic(surveyed):
    rec = surveyed[0][66]
    assert rec["determinism"] == {
        "same_seed_equal": True,
        "different_seed_equal": False,
        "verdict": "nondeterministic",
    }
    assert rec["blind_spots"]["compared"] == "eager output on KernelBench's 5 official trials"
    # As KernelBench's evaluator calls them, the reference draws its dropout mask after the
    # trial seed and the candidate right after it: eager fails against itself on every trial.
    eager = rec["baselines"]["eager"]["correctness"]
    assert eager["official_pass"] is False and eager["failed_trials"] == [0, 1, 2, 3, 4]
    assert eager["not_bit_equal"] > 0


def test_deterministic_tasks_and_eager_against_itself(surveyed):
    for task in (1, 7, 9, 23, 53):
        rec = surveyed[0][task]
        assert rec["determinism"]["verdict"] == "deterministic", task
        eager = rec["baselines"]["eager"]["correctness"]
        assert eager["not_bit_equal"] == 0 and eager["max_abs"] == 0.0, task
        assert eager["official_pass"] is True and eager["failed_trials"] == []
        assert eager["trials"] == 5 and eager["numel"] == 5 * math.prod(rec["output"]["shape"])


def test_flops_come_from_torchs_counter(surveyed):
    recs = surveyed[0]
    # Conv2d 3 -> 4 channels, 3x3 kernel, 2 x 8 x 8 input: 2 * (2*4*6*6) outputs * 27 MACs
    assert recs[1]["flops"] == {
        "total": 2 * (2 * 4 * 6 * 6) * 27,
        "by_op": {"aten.convolution": 15552},
        "main_op": "aten.convolution",
    }
    assert recs[53]["flops"]["main_op"] == "aten.addmm"
    assert recs[53]["flops"]["total"] == 2 * 16 * 32 * 64
    assert recs[53]["bytes"] == {"inputs": 16 * 32 * 4, "output": 16 * 64 * 4,
                                 "parameters": (32 * 64 + 64) * 4}  # fmt: skip


def test_norm_followed_by_mean_is_a_blind_spot(surveyed):
    rec = surveyed[0][23]
    assert rec["output"]["abs_max"] < 1e-5
    assert rec["blind_spots"]["zeros"] == {"applicable": True, "passes": True}
    assert rec["blind_spots"]["mean_constant"]["passes"] is True
    assert rec["blind_spots"]["input_identity"] == {"applicable": False, "passes": None}
    assert rec["blind_spot"] is True


def test_gemm_tail_is_not_a_blind_spot(surveyed):
    rec = surveyed[0][53]
    spots = rec["blind_spots"]
    assert spots["zeros"]["passes"] is False and spots["mean_constant"]["passes"] is False
    assert spots["input_identity"]["applicable"] is False  # 16x32 input, 16x64 output
    assert rec["blind_spot"] is False
    assert rec["output"]["shape"] == [16, 64] and rec["output"]["dtype"] == "float32"


def test_input_identity_is_checked_where_the_shapes_match(surveyed):
    rec = surveyed[0][9]  # 4x8 input, 4x8 output
    assert rec["blind_spots"]["input_identity"]["applicable"] is True
    assert rec["blind_spots"]["input_identity"]["passes"] is False


def test_ok_baselines_have_wall_samples_kernels_and_ratios(surveyed):
    for task, rec in surveyed[0].items():
        for name, entry in rec["baselines"].items():
            if entry["status"] != "ok":
                continue
            wall = entry["timing"]["wall"]
            assert len(wall["samples_ms"]) == ROUNDS and len(wall["positions"]) == ROUNDS
            assert entry["build_s"] >= 0
            times = [k["device_us"] for k in entry["kernels"]]
            assert times and times == sorted(times, reverse=True), (task, name)
        for name, ratios in rec["ratios"].items():
            assert rec["baselines"][name]["status"] == "ok"
            assert set(ratios) == {"wall"} and ratios["wall"]["balanced_rounds"] >= 2


def test_inductor_and_torchscript_pass_the_official_check_on_deterministic_tasks(surveyed):
    compiled = [(1, "torchscript"), (23, "torchscript"), (53, "torchscript"), (53, "inductor"),
                (7, "inductor")]  # fmt: skip
    for task, name in compiled:
        check = surveyed[0][task]["baselines"][name]["correctness"]
        assert check["official_pass"] is True, (task, name)
        assert check["direction"] == {"reference_scaled_pass": True, "candidate_scaled_pass": True}


def test_a_record_that_breaks_the_schema_is_not_written(surveyed, tmp_path):
    recs, _ = surveyed
    bad = dict(recs[53], blind_spot="yes")
    with pytest.raises(KbfuseError, match=r"field blind_spot is 'yes'"):
        records.validate_record(bad, "survey_task", "bad.json")


def test_a_pin_of_another_task_file_is_refused_before_any_work(surveyed, tmp_path):
    _, root = surveyed
    pin = read_json(root / "pin53.json")
    pin["tasks"]["53"]["sha256"] = "0" * 64
    (tmp_path / "pin.json").write_text(json.dumps(pin))
    settings = survey_settings({"survey": SETTINGS})
    with pytest.raises(KbfuseError, match=r"task 53 file .* changed after pinning"):
        run_survey_task(root / "checkout", tmp_path / "pin.json", settings,
                        root / "contract.json", {"strict": tmp_path / "out.json"})  # fmt: skip
    assert not (tmp_path / "out.json").exists()


def test_compile_caches_are_shared_under_one_folder(tmp_path, monkeypatch):
    for key in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "TORCHINDUCTOR_COMPILE_THREADS"):
        monkeypatch.setenv(key, "unset")  # so that teardown restores the variable's absence
        monkeypatch.delenv(key)
    paths = share_compile_caches(tmp_path / "cache")
    assert paths == {
        "TORCHINDUCTOR_CACHE_DIR": str((tmp_path / "cache" / "inductor").resolve()),
        "TRITON_CACHE_DIR": str((tmp_path / "cache" / "triton").resolve()),
        "TORCHINDUCTOR_COMPILE_THREADS": "1",
    }
    assert (tmp_path / "cache" / "triton").is_dir()


def test_eval_semantics_turn_dropout_off(surveyed, tmp_path):
    _, root = surveyed
    settings = survey_settings(
        {"survey": {**SETTINGS, "semantics": "eval", "baselines": ["eager", "torchscript"]}}
    )
    out = tmp_path / "66-eval.json"
    run_survey_task(
        root / "checkout", root / "pin66.json", settings, root / "contract.json",
        {"strict": out}, print,
    )  # fmt: skip
    rec = records.read_record(out, "survey_task")
    assert rec["semantics"] == "eval"
    assert rec["determinism"]["verdict"] == "deterministic"
    frozen = rec["baselines"]["torchscript"]
    assert frozen["status"] == "ok" and frozen["correctness"]["official_pass"] is True
    assert set(rec["ratios"]) == {"torchscript"}


class SpyLock:
    """A GPU lock that records how it was held (kbfuse.workflow.gpulock.GpuLock's interface)."""

    def __init__(self):
        self.events: list[str] = []
        self.held = None
        self.waited_s = 0.0
        self.path = Path("spy.lock")

    @contextlib.contextmanager
    def _hold(self, how):
        self.events.append(f"{how} in")
        self.held = how
        try:
            yield
        finally:
            self.held = None
            self.events.append(f"{how} out")

    def shared(self):
        return self._hold("shared")

    def alone(self):
        return self._hold("alone")


def run_task1(root: Path, outs: dict[str, Path], lock=None) -> dict[str, dict]:
    """The fixture's task 1 with eager and TorchScript, one record per mode of `outs` (mode ->
    path), read back."""
    settings = survey_settings({"survey": {**SETTINGS, "baselines": ["eager", "torchscript"]}})
    run_survey_task(
        root / "checkout", root / "pin1.json", settings, root / "contract.json", outs, print,
        lock=lock,
    )  # fmt: skip
    return {mode: records.read_record(path, "survey_task") for mode, path in outs.items()}


def test_one_job_writes_each_modes_record_builds_once_and_times_alone(
    surveyed, tmp_path, monkeypatch
):
    import torch

    _, root = surveyed
    lock, seen = SpyLock(), []
    real_time, real_build = survey_timing.time_baselines, survey_baselines.build

    def time_baselines(runs, protocol, device, cold_l2, label, log):
        seen.append(("time", label, lock.held, torch.backends.cudnn.allow_tf32))
        return real_time(runs, protocol, device, cold_l2, label, log)

    def build(name, *args):
        seen.append(("build", name, lock.held, torch.backends.cudnn.allow_tf32))
        return real_build(name, *args)

    monkeypatch.setattr(survey_timing, "time_baselines", time_baselines)
    monkeypatch.setattr(survey_baselines, "build", build)
    outs = {"strict": tmp_path / "s.json", "kernelbench-defaults": tmp_path / "k.json"}
    strict, defaults = run_task1(root, outs, lock).values()
    assert lock.events == ["shared in", "shared out", "alone in", "alone out"]
    assert seen == [
        ("build", "eager", "shared", False),  # built once, in the first mode
        ("build", "torchscript", "shared", False),  # a trace: once per mode, in that mode
        ("build", "torchscript", "shared", True),
        ("time", "survey/1/strict/kernelbench", "alone", False),
        ("time", "survey/1/kernelbench-defaults/kernelbench", "alone", True),
    ]
    assert strict["numerics"]["cudnn_tf32"] is False and defaults["numerics"]["cudnn_tf32"] is True
    for rec in (strict, defaults):
        assert rec["job"] == {
            "modes": ["strict", "kernelbench-defaults"],
            "built_in": "strict",
            "rerun_alone": False,
        }
        assert rec["baselines"]["torchscript"]["correctness"]["official_pass"] is True
        assert len(rec["baselines"]["torchscript"]["timing"]["wall"]["samples_ms"]) == ROUNDS
    assert strict["baselines"]["eager"]["build_s"] == defaults["baselines"]["eager"]["build_s"]
    assert strict["baselines"]["eager"]["built_in"] == "strict"
    assert defaults["baselines"]["eager"]["built_in"] == "strict"
    assert strict["baselines"]["torchscript"]["built_in"] == "strict"
    assert defaults["baselines"]["torchscript"]["built_in"] == "kernelbench-defaults"


def test_profiles_are_captured_alone_and_read_after_the_job_leaves_the_gpu(
    surveyed, tmp_path, monkeypatch
):
    """Running the profiled forwards is GPU work, alone; parsing their traces is CPU work, done
    once the lock is released (`phases_s.profile_read`), into the same record entries."""
    from kbfuse.survey import profile

    root = surveyed[1]
    lock, seen = SpyLock(), []
    real_capture, real_read = profile.capture, profile.read

    def capture(run, device, *args):
        seen.append(("capture", lock.held))
        return real_capture(run, device, *args)

    def read(captured):
        seen.append(("read", lock.held, lock.events[-1]))
        return real_read(captured)

    monkeypatch.setattr(profile, "capture", capture)
    monkeypatch.setattr(profile, "read", read)
    outs = {"strict": tmp_path / "s.json", "kernelbench-defaults": tmp_path / "k.json"}
    recs = run_task1(root, outs, lock)
    assert seen == [("capture", "alone")] * 4 + [("read", None, "alone out")] * 4
    for rec in recs.values():
        assert rec["phases_s"]["profile_read"] > 0
        for entry in rec["baselines"].values():
            assert entry["status"] == "ok" and entry["kernels"] and entry["timeline"] is None
            assert any("convolution" in k["name"] for k in entry["kernels"]), entry["kernels"]


def test_a_profile_that_cannot_be_read_fails_that_baseline_at_its_profile(
    surveyed, tmp_path, monkeypatch
):
    from kbfuse.survey import profile

    root = surveyed[1]
    real_read = profile.read
    calls = []

    def read(captured):
        calls.append(captured)
        if len(calls) == 2:  # the second baseline's: torchscript's
            raise RuntimeError("trace could not be parsed")
        return real_read(captured)

    monkeypatch.setattr(profile, "read", read)
    rec = run_task1(root, {"strict": tmp_path / "s.json"})["strict"]
    assert rec["baselines"]["eager"]["status"] == "ok"
    failed = rec["baselines"]["torchscript"]
    assert failed["status"] == "failed" and failed["failure"]["stage"] == "profile"
    assert "trace could not be parsed" in failed["failure"]["message"]


AUTOTUNE = "inductor-max-autotune-no-cudagraphs"


def test_max_autotune_is_built_and_checked_alone_in_each_mode(surveyed, tmp_path, monkeypatch):
    """Its build benchmarks kernels on the GPU: never while another job may be timing. Built in
    each mode (its choices follow the TF32 switches), after the shared builds, before the
    mode's timing; its entry takes its configured place and counts like any other."""
    import torch

    root = surveyed[1]
    lock, seen, convs = SpyLock(), [], []
    real_time, real_build = survey_timing.time_baselines, survey_baselines.build

    def time_baselines(runs, protocol, device, cold_l2, label, log):
        seen.append(("time", label.split("/")[2], lock.held, list(runs)))
        return real_time(runs, protocol, device, cold_l2, label, log)

    def build(name, *args):  # an eager forward stands in for max-autotune's compile on the CPU
        seen.append(("build", name, lock.held, torch.backends.cudnn.allow_tf32))
        convs.append(args[-1])
        if name == AUTOTUNE:  # alone, it precompiles on every core, for this build only
            assert os.environ["TORCHINDUCTOR_COMPILE_THREADS"] == str(os.cpu_count())
        return real_build("eager" if name == AUTOTUNE else name, *args)

    def warm(name, *args):
        seen.append(("warm", name, lock.held, torch.backends.cudnn.allow_tf32))
        convs.append(args[-1])
        return 2.5 if torch.backends.cudnn.allow_tf32 else 1.5

    monkeypatch.setattr(survey_timing, "time_baselines", time_baselines)
    monkeypatch.setattr(survey_baselines, "build", build)
    monkeypatch.setattr(survey_baselines, "warm", warm)
    monkeypatch.setattr(survey_job, "release_memory", lambda: lock.events.append("release"))
    threads = os.environ.get("TORCHINDUCTOR_COMPILE_THREADS")
    order = ["eager", AUTOTUNE, "torchscript"]
    given = {**SETTINGS, "baselines": order, "max_autotune_conv_backends": "ATEN"}
    settings = survey_settings({"survey": given})
    outs = {"strict": tmp_path / "s.json", "kernelbench-defaults": tmp_path / "k.json"}
    run_survey_task(
        root / "checkout", root / "pin1.json", settings, root / "contract.json", outs, print,
        lock=lock,
    )  # fmt: skip
    # each mode's warm-up in a shared hold of its own: a job waiting to be alone waits for
    # one warm-up, not for a whole shared phase; before each wait after the first, the job
    # returns its allocator's cache (a job alone meanwhile may need the memory)
    warm_up = ["release", "shared in", "shared out"]
    assert lock.events == ["shared in", "shared out", *warm_up, *warm_up, "release", "alone in"] + [
        "alone out"
    ]
    assert seen == [
        ("build", "eager", "shared", False),
        ("build", "torchscript", "shared", False),
        ("build", "torchscript", "shared", True),
        ("warm", AUTOTUNE, "shared", False),  # its kernels compiled beside the other jobs
        ("warm", AUTOTUNE, "shared", True),
        ("build", AUTOTUNE, "alone", False),
        ("time", "strict", "alone", order),
        ("build", AUTOTUNE, "alone", True),
        ("time", "kernelbench-defaults", "alone", order),
    ]
    assert os.environ.get("TORCHINDUCTOR_COMPILE_THREADS") == threads
    assert convs == ["ATEN"] * 7  # every build and warm-up gets the configured backends
    for path, mode, warm_s in zip(outs.values(), outs, (1.5, 2.5), strict=True):
        rec = records.read_record(path, "survey_task")
        assert list(rec["baselines"]) == order
        entry = rec["baselines"][AUTOTUNE]
        assert entry["built_in"] == mode and entry["build_s"] > 0
        assert entry["warm_build_s"] == warm_s
        assert entry["conv_backends"] == "ATEN"
        assert "conv_backends" not in rec["baselines"]["torchscript"]
        assert "warm_build_s" not in rec["baselines"]["torchscript"]
        assert rec["phases_s"]["warm_builds"] >= 0
        assert entry["correctness"]["official_pass"] is True
        assert len(entry["timing"]["wall"]["samples_ms"]) == ROUNDS
        assert entry["kernels"] and entry["timeline"] is None  # no device timeline on the CPU
        assert rec["phases_s"]["alone_builds"] > 0


def test_autotuned_builds_tag_the_compile_cache_with_the_cudnn_switch(monkeypatch):
    import torch
    import torch._inductor.config as inductor_config
    import torch.compiler.config as compiler_config

    in_force = []

    def make(name, model, inputs, semantics):  # what the compile (at the first call) sees
        def forward(*values):
            in_force.append((compiler_config.cache_key_tag, inductor_config.autotune_local_cache))

        return forward

    monkeypatch.setattr(survey_baselines, "make", make)
    before = torch.backends.cudnn.allow_tf32
    try:
        for flag in (False, True):
            torch.backends.cudnn.allow_tf32 = flag
            assert survey_baselines.autotune_cache_settings() == {
                "cache_key_tag": f"kbfuse cudnn_tf32={flag}",
                "autotune_local_cache": False,
            }
            survey_baselines.build(AUTOTUNE, None, [], "kernelbench", lambda: None)
            assert survey_baselines.warm(AUTOTUNE, None, [], "kernelbench", lambda: None) >= 0
        survey_baselines.build("inductor", None, [], "kernelbench", lambda: None)
    finally:
        torch.backends.cudnn.allow_tf32 = before
    default = (compiler_config.cache_key_tag, inductor_config.autotune_local_cache)
    assert in_force == [
        ("kbfuse cudnn_tf32=False", False),
        ("kbfuse cudnn_tf32=False warm-up", False),  # never the key the real build looks up
        ("kbfuse cudnn_tf32=True", False),
        ("kbfuse cudnn_tf32=True warm-up", False),
        default,  # the default Inductor keeps the shared settings
    ]
    assert default != in_force[0]


def test_the_configured_conv_backends_are_in_force_for_an_autotuned_build_only(monkeypatch):
    """survey.max_autotune_conv_backends narrows max-autotune's convolution choices (ATEN:
    cuDNN alone) for its warm-up and its build; None keeps Inductor's own default."""
    import torch._inductor.config as inductor_config

    default = inductor_config.max_autotune_conv_backends
    in_force = []

    def make(name, model, inputs, semantics):
        def forward(*values):
            in_force.append((name, inductor_config.max_autotune_conv_backends))

        return forward

    monkeypatch.setattr(survey_baselines, "make", make)
    survey_baselines.warm(AUTOTUNE, None, [], "kernelbench", lambda: None, "ATEN")
    survey_baselines.build(AUTOTUNE, None, [], "kernelbench", lambda: None, "ATEN")
    survey_baselines.build(AUTOTUNE, None, [], "kernelbench", lambda: None)
    survey_baselines.build("inductor", None, [], "kernelbench", lambda: None, "ATEN")
    assert default == "ATEN,TRITON"
    assert in_force == [
        (AUTOTUNE, "ATEN"),
        (AUTOTUNE, "ATEN"),
        (AUTOTUNE, default),
        ("inductor", default),  # the default Inductor is not autotuned: Inductor's own
    ]
    assert inductor_config.max_autotune_conv_backends == default  # put back after the build
    assert survey_baselines.conv_backends("ATEN") == "ATEN"
    assert survey_baselines.conv_backends(None) == default


def test_every_autotuned_build_of_one_model_compiles_its_own_graph(monkeypatch):
    """Dynamo reuses compiled code made under an equal backend, and torch.compile's backends
    of one mode compare equal: the build alone after a warm-up, or a mode's build after the
    last mode's, ran the first build's code (compiling nothing, in 0.01 s, on the H200 in
    session 17). Each autotuned build starts from a forward of its own."""
    import torch
    import torch._inductor.compile_fx as compile_fx

    compiled = []

    def fake_compile_fx(graph, example_inputs, **kw):  # Inductor's entry, without its work
        compiled.append(bool((kw.get("config_patches") or {}).get("max_autotune")))
        return graph.forward

    monkeypatch.setattr(compile_fx, "compile_fx", fake_compile_fx)
    model, inputs = torch.nn.Linear(8, 4), [torch.randn(2, 8)]
    survey_baselines.warm(AUTOTUNE, model, inputs, "kernelbench", lambda: None)
    for _ in range(2):
        survey_baselines.build(AUTOTUNE, model, inputs, "kernelbench", lambda: None)
    survey_baselines.build("inductor", model, inputs, "kernelbench", lambda: None)
    survey_baselines.build("inductor", model, inputs, "kernelbench", lambda: None)
    # three autotuned compiles; the default Inductor's second build reuses its first
    assert compiled == [True, True, True, False]


@pytest.mark.parametrize("training", [True, False])
def test_the_fresh_forward_wraps_the_model_itself_in_its_mode(training):
    import torch

    model = torch.nn.Dropout(0.5).train(training)
    fresh = survey_baselines._fresh_frame(model)
    assert fresh.inner is model and fresh.training is training and model.training is training
    x = torch.ones(1000)
    assert torch.equal(fresh(x), x) is not training  # dropout acts only in training
    other = survey_baselines._fresh_frame(model)
    assert other.forward.__code__ is not fresh.forward.__code__  # what Dynamo keys on


def test_only_an_autotuned_baseline_is_warmed_up():
    with pytest.raises(KbfuseError, match="baseline 'inductor' is not autotuned"):
        survey_baselines.warm("inductor", None, [], "kernelbench", lambda: None)


def test_precompile_threads_are_set_for_the_block_and_put_back(monkeypatch):
    key = "TORCHINDUCTOR_COMPILE_THREADS"
    monkeypatch.setenv(key, "1")
    with survey_baselines.precompile_threads(16):
        assert os.environ[key] == "16"
    assert os.environ[key] == "1"
    monkeypatch.delenv(key)
    with pytest.raises(RuntimeError, match="inside"), survey_baselines.precompile_threads(8):
        assert os.environ[key] == "8"
        raise RuntimeError("inside")
    assert key not in os.environ


def test_a_job_needs_a_mode(surveyed, tmp_path):
    _, root = surveyed
    settings = survey_settings({"survey": SETTINGS})
    with pytest.raises(KbfuseError, match="a survey job needs at least one numerics mode"):
        run_survey_task(
            root / "checkout", root / "pin1.json", settings, root / "contract.json", {}, print
        )


class OutOfMemoryError(RuntimeError):
    """torch.OutOfMemoryError's stand-in: its name is what the job looks at."""


# What running out of device memory raised: torch's allocator, and cuBLAS creating its handle
# (eager's first GEMM on the H200 with another process holding the memory).
CUBLAS_ALLOC = "CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"


def run_out_of_memory(
    root, tmp_path, monkeypatch, fails, error=None, names=("eager", "torchscript")
) -> tuple[dict, SpyLock, list]:
    """Task 53 with the baselines `names` (eager and TorchScript), TorchScript's build raising
    `error` (by default OutOfMemoryError) on the calls `fails` says (a function of the call
    count); (record, lock, builds and warm-ups; max-autotune's build is eager's)."""
    real_build, calls = survey_baselines.build, []
    error = error or OutOfMemoryError("CUDA out of memory")

    def build(name, *args):
        calls.append(name)
        if name == "torchscript" and fails(calls.count("torchscript")):
            raise error
        return real_build("eager" if name == AUTOTUNE else name, *args)

    def warm(name, *args):
        calls.append(f"warm {name}")
        return 1.0

    monkeypatch.setattr(survey_baselines, "build", build)
    monkeypatch.setattr(survey_baselines, "warm", warm)
    lock = SpyLock()
    settings = survey_settings({"survey": {**SETTINGS, "baselines": list(names)}})
    out = tmp_path / "53.json"
    run_survey_task(root / "checkout", root / "pin53.json", settings, root / "contract.json",
                    {"strict": out}, print, lock=lock)  # fmt: skip
    return records.read_record(out, "survey_task"), lock, calls


def test_a_task_run_again_alone_has_no_warm_up(surveyed, tmp_path, monkeypatch):
    names = ("eager", "torchscript", AUTOTUNE)
    rec, lock, calls = run_out_of_memory(
        surveyed[1], tmp_path, monkeypatch, lambda n: n == 1, names=names
    )
    assert lock.events == ["shared in", "shared out", "alone in", "alone out"]
    assert calls == ["eager", "torchscript", "eager", "torchscript", AUTOTUNE]  # no warm-up
    assert rec["baselines"][AUTOTUNE]["warm_build_s"] is None
    assert "warm_builds" not in rec["phases_s"]


def test_out_of_memory_beside_other_jobs_runs_the_task_again_alone(surveyed, tmp_path, monkeypatch):
    rec, lock, calls = run_out_of_memory(surveyed[1], tmp_path, monkeypatch, lambda n: n == 1)
    # the shared attempt failed for memory; the whole task again with the device alone
    assert lock.events == ["shared in", "shared out", "alone in", "alone out"]
    assert calls == ["eager", "torchscript", "eager", "torchscript"]
    assert rec["job"] == {"modes": ["strict"], "built_in": "strict", "rerun_alone": True}
    assert rec["baselines"]["torchscript"]["status"] == "ok"
    assert len(rec["baselines"]["torchscript"]["timing"]["wall"]["samples_ms"]) == ROUNDS


def test_a_library_out_of_device_memory_runs_the_task_again_alone(surveyed, tmp_path, monkeypatch):
    rec, lock, calls = run_out_of_memory(
        surveyed[1], tmp_path, monkeypatch, lambda n: n == 1, RuntimeError(CUBLAS_ALLOC)
    )
    assert lock.events == ["shared in", "shared out", "alone in", "alone out"]
    assert rec["job"]["rerun_alone"] is True
    assert rec["baselines"]["torchscript"]["status"] == "ok"


@pytest.mark.parametrize(
    ("error", "message", "expected"),
    [
        ("OutOfMemoryError", "CUDA out of memory. Tried to allocate 2.00 MiB", True),
        ("RuntimeError", CUBLAS_ALLOC, True),
        ("RuntimeError", "cuDNN error: CUDNN_STATUS_ALLOC_FAILED", True),
        ("AcceleratorError", "CUDA error: out of memory", True),
        ("RuntimeError", "CUDA error: an illegal memory access was encountered", False),
        ("RuntimeError", "CUBLAS_STATUS_EXECUTION_FAILED", False),
        ("MemoryError", "", False),  # host memory: not the device's, alone changes nothing
    ],
)
def test_what_counts_as_the_device_out_of_memory(error, message, expected):
    assert survey_job.out_of_memory(error, message) is expected


class TracingCheckError(RuntimeError):
    """torch.jit's: a trace's check wraps the error of the traced call."""


def wrapped_out_of_memory() -> TracingCheckError:
    try:
        try:
            raise OutOfMemoryError("CUDA out of memory. Tried to allocate 4.46 GiB")
        except OutOfMemoryError as exc:
            raise TracingCheckError("Tracing failed sanity checks!\nERROR: ...") from exc
    except TracingCheckError as wrapped:
        return wrapped


def test_an_out_of_memory_under_a_trace_runs_the_task_again_alone(surveyed, tmp_path, monkeypatch):
    """The first line of a TorchScript trace's error does not say out of memory; its cause does
    (task 65 in the second study on the H200, session 11)."""
    rec, lock, calls = run_out_of_memory(
        surveyed[1], tmp_path, monkeypatch, lambda n: n == 1, wrapped_out_of_memory()
    )
    assert lock.events == ["shared in", "shared out", "alone in", "alone out"]
    assert calls == ["eager", "torchscript", "eager", "torchscript"]
    assert rec["job"]["rerun_alone"] is True
    assert rec["baselines"]["torchscript"]["status"] == "ok"


def test_an_out_of_memory_under_a_trace_alone_is_recorded_as_such(surveyed, tmp_path, monkeypatch):
    rec, lock, _ = run_out_of_memory(
        surveyed[1], tmp_path, monkeypatch, lambda n: True, wrapped_out_of_memory()
    )
    assert lock.events == ["shared in", "shared out", "alone in", "alone out"]  # once alone
    assert rec["baselines"]["torchscript"]["failure"] == {
        "stage": "build",
        "error": "TracingCheckError",
        "message": "Tracing failed sanity checks!",
        "out_of_memory": True,
    }


def test_out_of_memory_when_alone_is_the_tasks_own_failure(surveyed, tmp_path, monkeypatch):
    rec, lock, _ = run_out_of_memory(surveyed[1], tmp_path, monkeypatch, lambda n: True)
    assert lock.events == ["shared in", "shared out", "alone in", "alone out"]  # once alone
    assert rec["job"]["rerun_alone"] is True
    assert rec["baselines"]["torchscript"]["failure"] == {
        "stage": "build", "error": "OutOfMemoryError", "message": "CUDA out of memory"
    }  # fmt: skip
    assert rec["baselines"]["eager"]["timing"]["wall"]["samples_ms"]


def run_with_loads_failing(root, tmp_path, monkeypatch, lock, fails, error=None) -> list:
    """Task 53 with `lock`, its model and inputs' load raising `error` (by default
    OutOfMemoryError) on the calls `fails` says; the load calls. Its record, if written, is at
    tmp_path / "53.json"."""
    real_instance, calls = official.instance, []
    error = error or OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 MiB")

    def instance(*args):
        calls.append(len(calls) + 1)
        if fails(len(calls)):
            raise error
        return real_instance(*args)

    monkeypatch.setattr(official, "instance", instance)
    settings = survey_settings({"survey": {**SETTINGS, "baselines": ["eager"]}})
    run_survey_task(root / "checkout", root / "pin53.json", settings, root / "contract.json",
                    {"strict": tmp_path / "53.json"}, print, lock=lock)  # fmt: skip
    return calls


def test_a_model_that_does_not_fit_beside_other_jobs_is_loaded_again_alone(
    surveyed, tmp_path, monkeypatch
):
    lock = SpyLock()
    calls = run_with_loads_failing(surveyed[1], tmp_path, monkeypatch, lock, lambda n: n == 1)
    assert lock.events == ["shared in", "shared out", "alone in", "alone out"]
    assert calls == [1, 2]
    rec = records.read_record(tmp_path / "53.json", "survey_task")
    assert rec["job"] == {"modes": ["strict"], "built_in": "strict", "rerun_alone": True}
    assert rec["baselines"]["eager"]["status"] == "ok"


def test_a_model_that_does_not_fit_alone_fails_the_job_and_writes_nothing(
    surveyed, tmp_path, monkeypatch
):
    with pytest.raises(OutOfMemoryError, match="Tried to allocate"):
        run_with_loads_failing(surveyed[1], tmp_path, monkeypatch, SpyLock(), lambda n: True)
    assert not (tmp_path / "53.json").exists()


def test_a_library_out_of_memory_loading_the_model_is_retried_alone(
    surveyed, tmp_path, monkeypatch
):
    lock = SpyLock()
    run_with_loads_failing(
        surveyed[1], tmp_path, monkeypatch, lock, lambda n: n == 1, RuntimeError(CUBLAS_ALLOC)
    )
    assert lock.events == ["shared in", "shared out", "alone in", "alone out"]
    assert records.read_record(tmp_path / "53.json", "survey_task")["job"]["rerun_alone"]


def test_another_error_loading_the_model_is_not_retried(surveyed, tmp_path, monkeypatch):
    illegal, lock = RuntimeError("CUDA error: an illegal memory access was encountered"), SpyLock()
    with pytest.raises(RuntimeError, match="illegal memory access"):
        run_with_loads_failing(surveyed[1], tmp_path, monkeypatch, lock, lambda n: True, illegal)
    assert lock.events == ["shared in", "shared out"]  # not run again
