"""The cross-device check before the survey (kbfuse.survey.agreement), on the CPU.

Its decision is a pure function of each device's median times; the devices and their timings
are fakes here, one of them slow. The record is validated against its schema, and the devices
it leaves out (under survey.exclude_outlier_devices) are never chosen by placement.
"""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from kbfuse.errors import KbfuseError
from kbfuse.results import records
from kbfuse.survey import agreement
from kbfuse.survey.settings import survey_settings
from kbfuse.workflow import devices
from kbfuse.workflow.config import validate_schema
from kbfuse.workflow.devices import Device

ROOT = Path(__file__).resolve().parents[1]


def fake_devices(n: int) -> list[Device]:
    return [Device(i, f"GPU-{i:08x}-0000-0000-0000-00000000000{i}", "Fake H200") for i in range(n)]


def timings(values: dict[int, tuple[float, float]]) -> dict[str, dict[str, float]]:
    listed = fake_devices(max(values) + 1)
    return {listed[i].uuid: {"gemm_ms": g, "copy_ms": c} for i, (g, c) in values.items()}


def test_devices_that_agree_have_no_outlier():
    same = timings({i: (1.40 + 0.01 * i, 0.12) for i in range(8)})  # within 5 %
    assert agreement.outliers(same) == {}


def test_a_slow_device_is_named_with_how_far_off_it_is():
    eight = {i: (1.40, 0.120) for i in range(8)}
    eight[5] = (1.40 * 1.10, 0.120)  # throttled: its GEMM 10 % slower
    eight[6] = (1.40, 0.120 * 1.06)  # its memory 6 % slower
    found = agreement.outliers(timings(eight))
    uuids = [d.uuid for d in fake_devices(8)]
    assert set(found) == {uuids[5], uuids[6]}
    assert found[uuids[5]] == {"gemm_ms": pytest.approx(0.10)}
    assert found[uuids[6]] == {"copy_ms": pytest.approx(0.06)}


def test_a_fast_device_is_off_too():
    found = agreement.outliers(timings({0: (1.0, 1.0), 1: (1.0, 1.0), 2: (0.9, 1.0)}))
    assert list(found.values()) == [{"gemm_ms": pytest.approx(-0.1)}]


def test_two_devices_the_slower_is_the_outlier():
    """The median of two is their mean, equally far from both: the faster is the reference."""
    found = agreement.outliers(timings({0: (1.06, 1.0), 1: (1.0, 1.0)}))
    assert list(found) == [fake_devices(2)[0].uuid]
    assert agreement.outliers(timings({0: (1.04, 1.0), 1: (1.0, 1.0)})) == {}


def test_the_reference_is_the_lower_median():
    assert agreement.reference_of([3.0, 1.0, 2.0]) == 2.0
    assert agreement.reference_of([1.0, 1.2, 1.0, 1.2]) == 1.0  # half slow: those are off
    assert agreement.reference_of([2.0, 1.0]) == 1.0
    with pytest.raises(KbfuseError, match="no device timings"):
        agreement.reference_of([])


def test_exactly_five_percent_is_not_off():
    assert agreement.outliers(timings({0: (1.05, 1.0), 1: (1.0, 1.0), 2: (1.0, 1.0)})) == {}


@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan"), None, "1"])
def test_a_time_that_is_not_positive_is_refused(bad):
    values = timings({0: (1.0, 1.0), 1: (1.0, 1.0)})
    next(iter(values.values()))["gemm_ms"] = bad
    with pytest.raises(KbfuseError, match="is not a time > 0"):
        agreement.outliers(values)


def test_left_out_only_under_the_switch_and_never_most_devices():
    uuids = [d.uuid for d in fake_devices(4)]
    found = {uuids[1]: {"gemm_ms": 0.2}, uuids[2]: {"gemm_ms": 0.3}, uuids[3]: {"copy_ms": -0.1}}
    assert agreement.left_out(found, exclude=False, count=4) == []
    # at most half of the four: the two farthest off
    assert agreement.left_out(found, exclude=True, count=4) == sorted([uuids[1], uuids[2]])
    # as far off, slow goes before fast
    found = {uuids[0]: {"gemm_ms": -0.1}, uuids[1]: {"gemm_ms": 0.1}}
    assert agreement.left_out(found, exclude=True, count=2) == [uuids[1]]


def run(tmp_path, listed, slow=None, exclude=False, device="cuda"):
    measured = []

    def measure(d):
        measured.append(d.index)
        gemm = 1.40 * (1.2 if d.index == slow else 1.0)
        return {"gemm_ms": gemm, "copy_ms": 0.12}

    out = tmp_path / "devices.json"
    record = agreement.run_agreement(
        out, device, exclude, say=lambda line: None, listed=listed, measure=measure
    )
    assert records.read_record(out, agreement.KIND) == json.loads(out.read_text()) == record
    return record, measured, out


def test_a_fake_slow_device_is_detected_and_reported(tmp_path, monkeypatch):
    monkeypatch.setattr(agreement, "nvidia_smi", lambda d: None)
    four = fake_devices(4)
    record, measured, out = run(tmp_path, four, slow=2)
    assert measured == [0, 1, 2, 3] and record["timed"]
    assert [o["index"] for o in record["outliers"]] == [2]
    assert record["outliers"][0]["off"] == {"gemm_ms": pytest.approx(0.2)}
    assert record["excluded"] == [] and record["exclude_outlier_devices"] is False
    assert agreement.excluded_devices(out) == []


def test_under_the_switch_the_slow_device_is_left_out_of_placement(tmp_path, monkeypatch):
    monkeypatch.setattr(agreement, "nvidia_smi", lambda d: {"clocks.sm": "1980 MHz"})
    four = fake_devices(4)
    record, _, out = run(tmp_path, four, slow=2, exclude=True)
    assert record["excluded"] == [four[2].uuid]
    assert record["nvidia_smi"][four[2].uuid] == {"clocks.sm": "1980 MHz"}
    avoid = agreement.excluded_devices(out)
    assert avoid == [four[2].uuid]
    locks = tmp_path / "locks"
    locks.mkdir()
    kept = [d for d in four if d.uuid not in avoid]
    slots, chosen = [], []
    for _ in range(9):
        device, slot = devices.choose(kept, "shared", locks)
        slots.append(slot)
        chosen.append(device.index)
    assert chosen == [0, 1, 3] * 3
    for slot in slots:
        slot.close()


def test_one_device_is_named_and_passes_without_timing(tmp_path):
    (only,) = fake_devices(1)
    record, measured, _ = run(tmp_path, [only], exclude=True)
    assert measured == [] and not record["timed"]
    assert record["devices"] == [only.record()]
    assert record["outliers"] == [] and record["excluded"] == []


def test_a_cpu_survey_names_no_device(tmp_path):
    record, measured, _ = run(tmp_path, None, device="cpu")
    assert measured == [] and record["devices"] == [] and record["device"] == "cpu"


def test_each_device_is_timed_alone_under_its_own_lock(tmp_path, monkeypatch):
    monkeypatch.setattr(agreement, "nvidia_smi", lambda d: None)
    locks = tmp_path / "locks"
    locks.mkdir()
    monkeypatch.setenv("KBFUSE_GPU_LOCK_DIR", str(locks))
    three = fake_devices(3)
    seen = []

    def measure(d):
        # while a device is timed, its lock is held (alone) and the others' are free
        seen.append([devices.in_use(locks, other) for other in three])
        return {"gemm_ms": 1.0, "copy_ms": 1.0}

    agreement.run_agreement(tmp_path / "d.json", "cuda", False, lambda s: None, three, measure)
    assert seen == [[True, False, False], [False, True, False], [False, False, True]]


def test_a_record_that_does_not_follow_the_schema_is_refused(tmp_path):
    record = agreement.make_record("cuda", fake_devices(2), timings({0: (1, 1), 1: (1, 1)}))
    record["excluded"] = ["not-a-uuid"]
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(record))
    with pytest.raises(KbfuseError, match="survey_devices record schema"):
        agreement.excluded_devices(path)


def test_the_switch_is_a_config_key_the_schema_checks():
    assert survey_settings({})["exclude_outlier_devices"] is False
    config = yaml.safe_load((ROOT / "config/config.yaml").read_text())
    config["survey"]["exclude_outlier_devices"] = True
    assert validate_schema(copy.deepcopy(config))["survey"]["exclude_outlier_devices"] is True
    assert survey_settings(config)["exclude_outlier_devices"] is True
    config["survey"]["exclude_outlier_devices"] = "yes"
    with pytest.raises(KbfuseError, match="exclude_outlier_devices"):
        validate_schema(config)
    assert "`survey.exclude_outlier_devices`" in (ROOT / "config/README.md").read_text()


def test_each_device_is_timed_in_a_child_that_sees_only_it(monkeypatch):
    seen = {}

    def fake_run(args, env, **kwargs):
        seen.update(args=args, env=env)
        return SimpleNamespace(returncode=0, stdout='{"gemm_ms": 1.5, "copy_ms": 0.25}\n')

    monkeypatch.setattr(agreement.subprocess, "run", fake_run)
    device = fake_devices(3)[2]
    assert agreement.measure_on(device) == {"gemm_ms": 1.5, "copy_ms": 0.25}
    assert seen["args"][1:] == ["-m", "kbfuse.survey.agreement"]
    assert seen["env"][devices.VISIBLE] == device.uuid
    assert json.loads(seen["env"][devices.PLACED]) == device.record()


def test_a_child_that_fails_names_the_device_and_its_last_line(monkeypatch):
    failed = SimpleNamespace(returncode=1, stdout="", stderr="Traceback\nRuntimeError: no GPU\n")
    monkeypatch.setattr(agreement.subprocess, "run", lambda *a, **k: failed)
    device = fake_devices(1)[0]
    with pytest.raises(KbfuseError, match=f"on {device.uuid} failed: RuntimeError: no GPU"):
        agreement.measure_on(device)


def test_nvidia_smi_clocks_and_throttling_are_read_per_device(tmp_path, monkeypatch):
    smi = tmp_path / "nvidia-smi"
    smi.write_text('#!/bin/sh\necho "$@" > "$(dirname "$0")/args"\n'
                   'echo "1980 MHz, 1980 MHz, 0x0000000000000004, 41, 120.50 W"\n')  # fmt: skip
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    device = fake_devices(2)[1]
    found = agreement.nvidia_smi(device)
    assert found == {
        "clocks.sm": "1980 MHz",
        "clocks.max.sm": "1980 MHz",
        "clocks_throttle_reasons.active": "0x0000000000000004",
        "temperature.gpu": "41",
        "power.draw": "120.50 W",
    }
    assert f"--id={device.uuid}" in (tmp_path / "args").read_text()
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert agreement.nvidia_smi(device) is None
