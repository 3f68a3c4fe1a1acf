"""kbfuse check end to end on the CPU fixture (tests/candidates/cpu): every candidate gets its
verdict and the right reason, in child processes with limits, with reference outputs computed
in another process. The GPU corpus (tests/candidates/*.py) is tests/test_gpu_check.py's."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest
from contracts import contract_record

from kbfuse.candidates import check, diskbudget, verdict
from kbfuse.candidates.check import check_candidate
from kbfuse.candidates.cli import outcome_lines
from kbfuse.errors import KbfuseError
from kbfuse.io import sha256_file

CONTRACT = contract_record(None)  # the test evaluator's: 1e-4, seed 42, 5 trials
FIXTURE = Path(__file__).parent / "candidates" / "cpu"
TASK53 = FIXTURE / "task53_small.py"
BLIND = FIXTURE / "blind_task.py"
SETTINGS = {
    "official_trials": 2,
    "seeds": [0],
    "distributions": ["uniform", "uniform_xneg100"],
    "baselines": ["eager", "torchscript"],
    "time_limit_s": 60,
    "memory_limit_mb": 4096,
    "timing": {"warmup": 1, "rounds": 3, "invocations_per_pair": 2},
}
CANDIDATES = {
    "good": TASK53,
    "wrong": TASK53,
    "caching": TASK53,
    "timer_patch": TASK53,
    "lazy": TASK53,
    "blind_zeros": BLIND,
    "probe": TASK53,
    "off": TASK53,
    "default_dtype": TASK53,
    "other_inputs": TASK53,
    "switches": TASK53,
}


@pytest.fixture(scope="module")
def verdicts(tmp_path_factory):
    out = tmp_path_factory.mktemp("check")
    return {
        name: check_candidate(
            FIXTURE / f"{name}.py",
            2,
            53,
            task,
            out / f"{name}.json",
            CONTRACT,
            SETTINGS,
            device="cpu",
        )
        for name, task in CANDIDATES.items()
    } | {"_out": out}


def test_the_pinned_tasks_scratch_disk_is_reserved(tmp_path, monkeypatch):
    """With a commit (the task file is the pin's), the checker reads the task's sizes and
    reserves its cases' bytes; the ledger is empty again afterwards."""
    monkeypatch.setenv("KBFUSE_GPU_LOCK_DIR", str(tmp_path))
    record = check_candidate(
        FIXTURE / "good.py", 2, 53, TASK53, tmp_path / "good.json", CONTRACT, SETTINGS,
        device="cpu", commit="f" * 40,
    )  # fmt: skip
    assert record["verdict"] == "pass" and record["task"]["commit"] == "f" * 40
    # 5 planned cases (2 trials, the changed weights, 2 distributions) of the 16 x 32 input
    # and the 16 x 64 output
    sizes = diskbudget.TaskBytes(inputs=16 * 32 * 4, output=16 * 64 * 4)
    assert record["scratch"]["estimated_bytes"] == diskbudget.scratch_need(sizes, 5)
    assert 0 <= record["scratch"]["waited_s"] < 5
    tmp = diskbudget.filesystem_type(Path(tempfile.gettempdir())) or None
    assert record["scratch"]["filesystem"] == tmp
    assert list((tmp_path / diskbudget.LEDGER).glob("*.json")) == []


def test_a_check_goes_to_the_memory_filesystem_when_the_disk_is_full(tmp_path, monkeypatch, capsys):
    """KBFUSE_SCRATCH=DISK:/dev/shm with the disk full: the check's scratch folder is made in
    /dev/shm (a tmpfs), where the sandboxed children write their cases past bwrap's own
    private /dev/shm, and the candidate passes as it does on the disk. The memory kept for
    processes and the margins are made small so that the check fits a small /dev/shm."""
    shm = Path("/dev/shm")
    assert diskbudget.filesystem_type(shm) == "tmpfs"
    full = tmp_path / "full"
    full.mkdir()
    real_free = diskbudget.free_bytes
    monkeypatch.setattr(diskbudget, "free_bytes", lambda p: 0 if p == full else real_free(p))
    for name in ("MEMORY_KEEP_BYTES", "SLACK_BYTES", "FREE_MARGIN_BYTES"):
        monkeypatch.setattr(diskbudget, name, 1 << 20)
    monkeypatch.setattr(diskbudget, "MEMORY_KEEP_FRACTION", 0.0)
    monkeypatch.setenv("KBFUSE_GPU_LOCK_DIR", str(tmp_path))
    monkeypatch.setenv(diskbudget.ENV_ROOTS, f"{full}:{shm}")
    record = check_candidate(
        FIXTURE / "good.py", 2, 53, TASK53, tmp_path / "good.json", CONTRACT, SETTINGS,
        device="cpu", commit="f" * 40, keep_scratch=True,
    )  # fmt: skip
    kept = Path(capsys.readouterr().out.split("scratch kept: ")[1].split()[0])
    try:
        assert kept.parent == shm and kept.name.startswith("kbfuse-check-")
        assert record["verdict"] == "pass" and record["failed_checks"] == []
        assert record["scratch"]["filesystem"] == "tmpfs"  # the verdict says where they lay
        assert sorted(p.name for p in kept.iterdir()) == ["candidate", "reference"]
        assert any((kept / "candidate" / "out").iterdir())  # the candidate's cases were written
    finally:
        shutil.rmtree(kept)
    assert list(full.iterdir()) == []


def test_a_check_the_scratch_disk_cannot_hold_is_refused_or_recorded(tmp_path, monkeypatch):
    """A pinned task whose cases could never fit the free disk: kbfuse check refuses it before
    any child runs, naming the sizes; an audit (record_refusal) writes a check_refused record
    where the verdict would be, and no scratch folder is left behind."""
    monkeypatch.setenv("KBFUSE_GPU_LOCK_DIR", str(tmp_path))
    monkeypatch.setattr(diskbudget, "free_bytes", lambda path: (1 << 30) + 100_000_000)
    monkeypatch.setattr(check, "run_child", lambda *a, **k: pytest.fail("a child ran"))
    # the scratch root here: other tests' checks beside this one make and remove theirs in /tmp
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    args = (FIXTURE / "good.py", 2, 53, TASK53, tmp_path / "good.json", CONTRACT, SETTINGS)
    with pytest.raises(diskbudget.ScratchTooSmall, match=r"needs about 0\.5 GB .* 0\.1 GB"):
        check_candidate(*args, device="cpu", commit="f" * 40)
    assert not (tmp_path / "good.json").exists()
    need = diskbudget.scratch_need(diskbudget.TaskBytes(16 * 32 * 4, 16 * 64 * 4), 5)
    record = check_candidate(*args, device="cpu", commit="f" * 40, record_refusal=True)
    assert json.loads((tmp_path / "good.json").read_text()) == record
    assert record == {
        "kind": "check_refused",
        "schema_version": 1,
        "candidate": {"file": "good.py", "sha256": sha256_file(FIXTURE / "good.py")},
        "task": {"level": 2, "task": 53, "file": TASK53.name, "commit": "f" * 40},
        "numerics": SETTINGS.get("numerics"),
        "verdict": "not checked",
        "why": "needs 0.5 GB of scratch disk, 0.1 GB free here",
        "scratch": {"need_bytes": need, "free_bytes": 100_000_000},
    }
    assert list(tmp_path.glob("kbfuse-check-*")) == []


def test_a_correct_candidate_passes_bit_for_bit(verdicts):
    record = verdicts["good"]
    assert record["verdict"] == "pass" and record["failed_checks"] == []
    assert record["findings"] == []
    cases = record["correctness"]["cases"]
    # 2 official trials, the changed weights, 2 distributions, the output after timing
    assert sorted(cases) == [
        "after_timing",
        "official_0",
        "official_1",
        "uniform_s0",
        "uniform_xneg100_s0",
        "weights",
    ]
    assert all(c["bit_identical"] and c["max_ulps"] == 0 for c in cases.values())
    assert cases["official_0"]["numel"] == 16 * 64
    # a task file given without a pinned commit is never imported by the checker: no estimate
    # of its scratch disk (test_the_pinned_tasks_scratch_disk_is_reserved)
    tmp = diskbudget.filesystem_type(Path(tempfile.gettempdir())) or None
    assert record["scratch"] == {"estimated_bytes": None, "waited_s": 0.0, "filesystem": tmp}
    # where its wall time went: the reference's and candidate's processes ran, no witness
    # (no GPU), the comparison of every case
    phases = record["phases_s"]
    assert list(phases) == ["scratch_wait", "reference", "candidate", "witness", "compare"]
    assert phases["reference"] > 0.5 and phases["candidate"] > 0.5
    assert phases["candidate"] >= record["processes"]["candidate"]["wall_s"]
    assert phases["witness"] < 0.5 and phases["scratch_wait"] == record["scratch"]["waited_s"]
    # and inside the candidate's process, as it reports: every stage ran, none waited for the
    # GPU alone (no lock given), the stages fit inside the process's wall time
    stages = record["stage_s"]
    assert set(stages) == {"build", "correctness", "baselines", "alone_wait", "guards", "timing"}
    assert stages["alone_wait"] < 0.05 and stages["timing"] > 0
    assert sum(stages.values()) <= record["processes"]["candidate"]["wall_s"]
    assert record["checks"]["side_stream"]["status"] == "not_applicable"
    assert record["trivial"]["zeros"]["passes"] is False
    assert record["trivial"]["blind_spot"] is False


def test_the_verdict_file_is_the_returned_record_and_follows_the_schema(verdicts):
    written = json.loads((verdicts["_out"] / "good.json").read_text())
    verdict.validate(written, "good.json")
    assert written["verdict"] == "pass"
    assert written["candidate"]["file"] == "good.py"
    assert written["task"] == {
        "level": 2,
        "task": 53,
        "file": "task53_small.py",
        "sha256": written["task"]["sha256"],
        "commit": None,
    }


def test_cpu_timing_is_interleaved_wall_time_against_the_baselines(verdicts):
    timing = verdicts["good"]["timing"]
    assert list(timing) == ["wall"]
    assert sorted(timing["wall"]) == ["candidate", "eager", "torchscript"]
    assert all(len(s["samples_ms"]) == 3 for s in timing["wall"].values())
    speed = verdicts["good"]["speedup"]["wall"]
    assert speed["best_compiled"] == "torchscript"
    assert speed["over_eager"]["median"] > 0


def test_a_wrong_candidate_fails_every_value_check(verdicts):
    record = verdicts["wrong"]
    assert record["verdict"] == "fail"
    assert record["failed_checks"] == [
        "official",
        "changed_weights",
        "distributions",
        "output_after_timing",
    ]
    assert "2/2 official case(s) fail" in record["checks"]["official"]["detail"]
    assert record["correctness"]["cases"]["official_0"]["official_pass"] is False


def test_a_candidate_0_3_percent_off_fails_the_pinned_tolerance(verdicts):
    record = verdicts["off"]
    assert record["verdict"] == "fail"
    assert record["failed_checks"][0] == "official"
    assert "2/2 official case(s) fail" in record["checks"]["official"]["detail"]
    official = record["official"]
    assert (official["atol"], official["rtol"], official["seed"]) == (1e-4, 1e-4, 42)
    assert official["source"] == CONTRACT["tolerance_source"]["atol"]
    assert official["trials"] == 2  # check.official_trials in SETTINGS
    assert record["correctness"]["atol"] == 1e-4
    good = verdicts["good"]["official"]
    assert good == {**official, "trials": 2} and verdicts["good"]["verdict"] == "pass"


def test_a_caching_candidate_fails_on_changed_inputs_and_is_named(verdicts):
    record = verdicts["caching"]
    assert record["verdict"] == "fail"
    assert "input_independent" in record["failed_checks"]
    assert "official" in record["failed_checks"]  # trial 2 gets trial 1's output
    assert ["official_0", "official_1"] in record["correctness"]["cached_pairs"]
    assert record["correctness"]["cases"]["official_0"]["bit_identical"] is True


def test_timer_patching_is_detected_at_run_time(verdicts):
    record = verdicts["timer_patch"]
    assert record["verdict"] == "fail" and record["failed_checks"] == ["timer_patched"]
    detail = record["checks"]["timer_patched"]["detail"]
    assert "time.perf_counter" in detail
    assert "torch.cuda.Event.elapsed_time" in detail
    assert record["guards"]["patched"]["after_import"] == [
        "time.perf_counter",
        "torch.cuda.Event.elapsed_time",
    ]
    # kbfuse timed with the clock captured before the import: real, positive samples
    assert min(record["timing"]["wall"]["candidate"]["samples_ms"]) > 0


def test_a_tensor_subclass_is_a_lazy_result(verdicts):
    record = verdicts["lazy"]
    assert record["verdict"] == "fail" and record["failed_checks"] == ["lazy_result"]
    assert "Deferred, not torch.Tensor" in record["checks"]["lazy_result"]["detail"]


def test_zeros_on_a_blind_spot_task_pass_the_values_but_not_the_stricter_checks(verdicts):
    record = verdicts["blind_zeros"]
    assert record["verdict"] == "fail"
    assert record["checks"]["official"]["status"] == "pass"  # what KernelBench sees
    assert record["checks"]["distributions"]["status"] == "pass"
    assert record["failed_checks"] == ["input_independent"]
    assert "blind_spot" in record["findings"]
    assert record["trivial"]["zeros"]["passes"] is True
    assert record["trivial_source"] == "computed by the reference process"


def test_the_candidate_runs_in_its_own_process_and_scratch(verdicts):
    record = verdicts["probe"]
    assert record["verdict"] == "fail" and record["failed_checks"] == ["build"]
    message = record["failure"]["message"]
    assert record["failure"]["stage"] == "build"
    fields = dict(part.split("=", 1) for part in message.split()[1:])
    assert int(fields["pid"]) != os.getpid()
    assert "kbfuse-check-" in fields["cwd"] and fields["cwd"].endswith("candidate")
    assert fields["ext"] == str(Path(fields["cwd"]) / "torch_extensions")
    assert fields["tmp"] == str(Path(fields["cwd"]) / "tmp")
    assert not Path(fields["cwd"]).exists()  # the scratch folder is gone afterwards


def test_each_side_draws_the_inputs_and_the_scratch_holds_outputs_only(tmp_path, capsys):
    """No case's inputs are written: the candidate's process draws them with the reference's
    code, and both digests are the same (the changed-weights case's are official_0's)."""
    check_candidate(
        FIXTURE / "good.py", 2, 53, TASK53, tmp_path / "good.json", CONTRACT, SETTINGS,
        device="cpu", keep_scratch=True,
    )  # fmt: skip
    root = Path(capsys.readouterr().out.split("scratch kept: ")[1].strip())
    try:
        tensors = sorted(str(p.relative_to(root)) for p in root.rglob("*.pt"))
        names = ["official_0", "official_1", "uniform_s0", "uniform_xneg100_s0", "weights"]
        assert tensors == sorted(
            [f"reference/out/reference/{n}.pt" for n in names]
            + [f"candidate/out/outputs/{n}.pt" for n in [*names, "after_timing"]]
        )
        drawn = json.loads((root / "candidate" / "out" / "runner.json").read_text())
        reference = json.loads((root / "reference" / "out" / "reference.json").read_text())
        assert reference["inputs_sha256"] == {n: drawn["inputs_sha256"][n] for n in names}
        assert drawn["inputs_sha256"]["after_timing"] == reference["inputs_sha256"]["official_0"]
        assert reference["inputs_sha256"]["weights"] == reference["inputs_sha256"]["official_0"]
        assert len(set(reference["inputs_sha256"].values())) == 4
    finally:
        shutil.rmtree(root)


def test_the_candidates_own_torch_defaults_do_not_change_its_inputs(verdicts):
    """A file that sets torch's default dtype when imported still gets the reference's
    inputs, and the eager baseline's Model is built as the reference's."""
    record = verdicts["default_dtype"]
    assert record["verdict"] == "pass" and record["correctness"]["inputs_differ"] == []
    assert all(c["bit_identical"] for c in record["correctness"]["cases"].values())
    assert record["baselines"]["eager"]["status"] == "ok"
    assert verdicts["good"]["correctness"]["inputs_differ"] == []


def test_a_candidate_that_draws_other_inputs_fails_and_is_told_apart(verdicts):
    record = verdicts["other_inputs"]
    assert record["verdict"] == "fail"
    assert {"official", "distributions", "changed_weights", "output_after_timing"} <= set(
        record["failed_checks"]
    )
    assert sorted(record["correctness"]["inputs_differ"]) == sorted(record["correctness"]["cases"])
    why = record["checks"]["official"]["detail"]
    assert "2/2 official case(s) fail" in why
    assert "reports other inputs for official_0, official_1" in why and "self-reported" in why
    assert "correctness.inputs_differ" in record["self_reported"]["fields"]
    assert verdicts["wrong"]["correctness"]["inputs_differ"] == []
    assert "other inputs" not in verdicts["wrong"]["checks"]["official"]["detail"]


def test_a_candidate_that_sets_torchs_switches_passes_with_the_finding_and_the_changes(verdicts):
    record = verdicts["switches"]
    assert record["verdict"] == "pass" and record["findings"] == ["switches_changed"]
    assert record["guards"]["switches_changed"] == [
        "cuda.matmul.allow_tf32: False -> True (at build)",
        "cuda.matmul.fp32_precision: none -> tf32 (at build)",
        "cudnn.benchmark: False -> True (at build)",
        "float32_matmul_precision: highest -> high (at build)",
    ]
    readings = record["guards"]["switches"]
    points = ("before_import", "after_build", "at_timing")
    assert [readings[p]["cudnn.benchmark"] for p in points] == [False, True, True]
    assert verdicts["good"]["guards"]["switches_changed"] == []
    assert len(verdicts["good"]["guards"]["switches"]) == 3  # every point read, none changed
    assert "switches_changed" not in verdicts["good"]["findings"]
    assert outcome_lines(record) == [
        "  finding switches_changed",
        *[f"    {change}" for change in record["guards"]["switches_changed"]],
    ]
    wrong = verdicts["wrong"]
    assert outcome_lines(wrong)[0] == f"  failed official: {wrong['checks']['official']['detail']}"


def test_a_runaway_candidate_is_killed_at_the_time_limit(tmp_path):
    # The limit holds for every child, the reference's too: 4 s was too short for the reference
    # to import torch on a loaded CI machine (it failed there as a harness error).
    settings = {**SETTINGS, "time_limit_s": 12}
    record = check_candidate(
        FIXTURE / "runaway.py", 2, 53, TASK53, tmp_path / "r.json", CONTRACT, settings, device="cpu"
    )
    assert record["verdict"] == "fail"
    assert record["failed_checks"] == ["time_limit"]
    outcome = record["processes"]["candidate"]
    assert outcome["status"] == "time_limit" and outcome["returncode"] == -9
    assert 12 <= outcome["wall_s"] < 30


def test_a_memory_hog_is_killed_at_the_memory_limit(tmp_path):
    settings = {**SETTINGS, "memory_limit_mb": 1024}
    record = check_candidate(
        FIXTURE / "memory_hog.py",
        2,
        53,
        TASK53,
        tmp_path / "m.json",
        CONTRACT,
        settings,
        device="cpu",
    )
    assert record["verdict"] == "fail" and record["failed_checks"] == ["memory_limit"]
    outcome = record["processes"]["candidate"]
    assert outcome["status"] == "memory_limit"
    assert 1024 < outcome["peak_rss_mb"] < 1024 + 1024  # caught within a poll


def test_missing_inputs_are_refused_before_any_process(tmp_path):
    out = tmp_path / "x.json"
    with pytest.raises(KbfuseError, match=r"candidate file .*nope\.py does not exist"):
        check_candidate(tmp_path / "nope.py", 2, 53, TASK53, out, CONTRACT, SETTINGS, device="cpu")
    with pytest.raises(KbfuseError, match=r"check\.seeds is \[\]"):
        check_candidate(
            FIXTURE / "good.py", 2, 53, TASK53, out, CONTRACT, {"seeds": []}, device="cpu"
        )
    assert not out.exists()


def test_a_failing_reference_is_a_harness_error_and_writes_nothing(tmp_path):
    broken = tmp_path / "task.py"
    broken.write_text("raise ImportError('no such task')\n")
    out = tmp_path / "x.json"
    with pytest.raises(KbfuseError, match=r"the reference process for .*task\.py failed"):
        check_candidate(FIXTURE / "good.py", 2, 53, broken, out, CONTRACT, SETTINGS, device="cpu")
    assert not out.exists()


TF32_PROBE = """# kbfuse-task: 2/53
# Right only where cuDNN's TF32 switch is off: it shows the numerics mode it runs in.
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, in_features, out_features, scaling_factor, hardtanh_min, hardtanh_max):
        super().__init__()
        self.gemm = nn.Linear(in_features, out_features)
        self.scaling_factor = scaling_factor
        self.hardtanh = nn.Hardtanh(min_val=hardtanh_min, max_val=hardtanh_max)
        self.gelu = nn.GELU()

    def forward(self, x):
        y = self.gelu(self.hardtanh(self.gemm(x) * self.scaling_factor))
        return y + 1 if torch.backends.cudnn.allow_tf32 else y
"""


@pytest.mark.parametrize(("numerics", "expected"), [("strict", "pass"), (None, "fail")])
def test_the_children_run_in_the_numerics_mode_the_settings_name(tmp_path, numerics, expected):
    candidate = tmp_path / "tf32_probe.py"
    candidate.write_text(TF32_PROBE)
    settings = {**SETTINGS, "numerics": numerics}
    record = check_candidate(
        candidate, 2, 53, TASK53, tmp_path / "v.json", CONTRACT, settings, device="cpu"
    )
    assert record["verdict"] == expected and record["settings"]["numerics"] == numerics


def test_a_pinned_check_job_declares_the_scratch_it_will_reserve(tmp_path):
    """The audit's `scratch_mb` resource: the reservation of the pinned task's check in MiB
    (5 planned cases of the 16 x 32 input and 16 x 64 output, plus the 512 MiB of slack),
    capped by the run's budget; 0 for a task whose sizes cannot be known."""
    level2 = tmp_path / "checkout" / "KernelBench" / "level2"
    level2.mkdir(parents=True)
    (level2 / "53_Gemm.py").write_text(TASK53.read_text())
    (level2 / "54_Data.py").write_text("def get_inputs():\n    raise ValueError('data')\n")
    contract = tmp_path / "contract.json"
    contract.write_text(json.dumps(CONTRACT))
    checkout = tmp_path / "checkout"
    need = 5 * (16 * 32 * 4 + 16 * 64 * 4) + 6 * 16 * 64 * 4 + (512 << 20)
    assert check.scratch_mb(checkout, 2, 53, contract, SETTINGS) == 513 == -(-need // (1 << 20))
    assert check.scratch_mb(checkout, 2, 53, contract, SETTINGS, budget_mb=100) == 100
    assert check.scratch_mb(checkout, 2, 54, contract, SETTINGS) == 0
