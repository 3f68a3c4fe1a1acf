"""Do the GPUs of one machine agree? One reference kernel timed on each, before the survey.

A survey spread over several GPUs (kbfuse.workflow.devices) compares tasks timed on different
devices, so the devices must run the same code equally fast. Before the survey's task jobs,
`run_agreement` times two reference kernels on every visible GPU in turn, each alone on its
device (its GPU lock, kbfuse.workflow.gpulock) in a child process that sees only that device:
an FP32 GEMM (TF32 off: the SM clocks) and a device-to-device copy (the memory), CUDA events,
the median of `REPEATS`. nvidia-smi's view of each device (SM clock, its maximum, active
throttle reasons, temperature, power) is recorded beside it when nvidia-smi is there.

The decision is a pure function of the medians (`outliers`): a device more than `TOLERANCE`
(5 %) off the reference on either kernel is an outlier; the reference is the lower median of
the devices' times (the median for an odd count; with two devices the faster one: the median
of two is their mean, from which both are equally far, and a GPU runs slow for a reason,
clocks or throttling, not fast). Outliers are reported in the record (`survey/devices.json`,
kind `survey_devices`) and, with `survey.exclude_outlier_devices`, left out of the survey's
placement (`excluded`: the farthest off first, at most half of the devices, so most stay).
On one visible GPU (or a CPU survey) nothing is timed: the record names the device and passes.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

from kbfuse.errors import KbfuseError
from kbfuse.io import write_json
from kbfuse.workflow import devices, gpulock

KIND = "survey_devices"
SCHEMA_VERSION = 1
TOLERANCE = 0.05
METRICS = ("gemm_ms", "copy_ms")
GEMM_SIZE = 4096
COPY_BYTES = 256 * 1024**2
WARMUP = 5
REPEATS = 30
MEASURE_TIMEOUT_S = 300
SMI_FIELDS = (
    "clocks.sm",
    "clocks.max.sm",
    "clocks_throttle_reasons.active",
    "temperature.gpu",
    "power.draw",
)
METHOD = (
    f"on each device alone, in a child process that sees only it: an FP32 {GEMM_SIZE}^3 GEMM "
    f"(TF32 off) and a copy of a {COPY_BYTES}-byte float32 buffer, CUDA events around each call, "
    f"{WARMUP} warm-up calls, median of {REPEATS}; a device more than {TOLERANCE:.0%} off the "
    "reference (the devices' lower median; with two, the faster one) on either is an outlier"
)


def reference_of(values: list[float]) -> float:
    """What each device is compared with: the lower median (with two devices, the faster)."""
    if not values:
        raise KbfuseError("no device timings to compare")
    return statistics.median_low(values)


def outliers(
    timings: Mapping[str, Mapping[str, float]], tolerance: float = TOLERANCE
) -> dict[str, dict[str, float]]:
    """{uuid: {metric: relative deviation}} of each device more than `tolerance` off the
    reference on some metric; `timings` is {uuid: {metric: median ms}}, every device timed
    on every metric."""
    if not 0 < tolerance < 1:
        raise KbfuseError(f"tolerance {tolerance!r}: a fraction between 0 and 1")
    metrics = sorted({m for figures in timings.values() for m in figures})
    for uuid, figures in timings.items():
        for metric in metrics:
            value = figures.get(metric)
            if not isinstance(value, (int, float)) or not value > 0:
                raise KbfuseError(f"device {uuid}: {metric} {value!r} is not a time > 0")
    found: dict[str, dict[str, float]] = {}
    if len(timings) < 2:
        return found
    for metric in metrics:
        reference = reference_of([figures[metric] for figures in timings.values()])
        for uuid, figures in timings.items():
            value = figures[metric]
            # (compared as times, so that exactly 5 % off is not off by a rounding error)
            if not reference * (1 - tolerance) <= value <= reference * (1 + tolerance):
                found.setdefault(uuid, {})[metric] = value / reference - 1.0
    return found


def left_out(found: Mapping[str, Mapping[str, float]], exclude: bool, count: int) -> list[str]:
    """The outliers the survey leaves out: none unless `exclude`; the farthest off first (a
    slow device before a fast one as far off), at most count // 2 of `count` devices."""
    if not exclude:
        return []

    def farthest(uuid: str) -> tuple[float, float]:
        offs = found[uuid].values()
        return (-max(abs(v) for v in offs), -max(offs))

    return sorted(sorted(found, key=farthest)[: count // 2])


def make_record(
    device: str,
    listed: list[devices.Device],
    timings: Mapping[str, Mapping[str, float]],
    smi: Mapping[str, dict | None] | None = None,
    exclude: bool = False,
    tolerance: float = TOLERANCE,
) -> dict:
    """The `survey_devices` record: the devices, their timings, the outliers, those left out."""
    found = outliers(timings, tolerance)
    by_uuid = {d.uuid: d for d in listed}
    return {
        "kind": KIND,
        "schema_version": SCHEMA_VERSION,
        "device": device,
        "devices": [d.record() for d in listed],
        "timed": len(timings) > 1,
        "tolerance": tolerance,
        "method": METHOD if len(timings) > 1 else "one device (or the CPU): nothing to compare",
        "timings": {uuid: dict(figures) for uuid, figures in timings.items()},
        "nvidia_smi": dict(smi or {}),
        "outliers": [
            {**by_uuid[uuid].record(), "off": off}
            for uuid, off in sorted(found.items(), key=lambda item: by_uuid[item[0]].index)
        ],
        "exclude_outlier_devices": bool(exclude),
        "excluded": left_out(found, exclude, len(listed)),
    }


def excluded_devices(path: str | Path | None) -> list[str]:
    """The UUIDs a `survey_devices` record leaves out of the survey's placement."""
    if path is None:
        return []
    from kbfuse.results import records

    record = records.read_record(path, KIND)
    return list(record["excluded"])


# -- on the GPU --------------------------------------------------------------------------------


def _median_ms(run: Callable[[], object], warmup: int, repeats: int) -> float:
    import torch

    for _ in range(warmup):
        run()
    events = [
        (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
        for _ in range(repeats)
    ]
    torch.cuda.synchronize()
    for start, end in events:
        start.record()
        run()
        end.record()
        torch.cuda.synchronize()
    return statistics.median(start.elapsed_time(end) for start, end in events)


def measure_here(warmup: int = WARMUP, repeats: int = REPEATS) -> dict[str, float]:
    """{metric: median ms} of the reference kernels on device 0 of this process."""
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    generator = torch.Generator(device="cuda").manual_seed(0)
    a, b = (torch.randn(GEMM_SIZE, GEMM_SIZE, device="cuda", generator=generator) for _ in "ab")
    product = torch.empty_like(a)
    src = torch.ones(COPY_BYTES // 4, device="cuda")
    dst = torch.empty_like(src)
    return {
        "gemm_ms": _median_ms(lambda: torch.mm(a, b, out=product), warmup, repeats),
        "copy_ms": _median_ms(lambda: dst.copy_(src), warmup, repeats),
    }


def measure_on(device: devices.Device, timeout_s: float = MEASURE_TIMEOUT_S) -> dict[str, float]:
    """`measure_here` in a child process that sees only `device`."""
    env = {**os.environ, devices.VISIBLE: device.uuid, devices.PLACED: json.dumps(device.record())}
    done = subprocess.run(
        [sys.executable, "-m", "kbfuse.survey.agreement"],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout_s,
        check=False,
    )
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        raise KbfuseError(f"timing the reference kernels on {device.uuid} failed: {tail[0]}")
    return {key: float(value) for key, value in json.loads(done.stdout).items()}


def nvidia_smi(device: devices.Device) -> dict | None:
    """nvidia-smi's clocks, throttle reasons, temperature and power of `device`, or None."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        done = subprocess.run(
            [exe, f"--query-gpu={','.join(SMI_FIELDS)}", "--format=csv,noheader",
             f"--id={device.uuid}"],
            capture_output=True, text=True, timeout=60, check=True,
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    values = [v.strip() for v in done.stdout.strip().splitlines()[0].split(",")]
    return dict(zip(SMI_FIELDS, values, strict=False))


def run_agreement(
    out: str | Path, device: str, exclude: bool, say=print, listed=None, measure=None
) -> dict:
    """Time the reference kernels on every visible GPU (module docstring) and write the
    record at `out`. `listed` (the visible devices) and `measure` (a device -> {metric: ms})
    stand in for the machine in tests."""
    from kbfuse.results import records

    listed = [] if device != "cuda" else (devices.list_in_child() if listed is None else listed)
    measure = measure_on if measure is None else measure
    timings: dict[str, dict[str, float]] = {}
    smi: dict[str, dict | None] = {}
    if len(listed) > 1:
        for d in listed:
            lock = gpulock.GpuLock(d.uuid)
            with lock.alone():
                say(f"device {d.index} ({d.uuid}, {d.name}): timing the reference kernels")
                timings[d.uuid] = measure(d)
                smi[d.uuid] = nvidia_smi(d)
            say(f"  {timings[d.uuid]}")
    record = make_record(device, listed, timings, smi, exclude)
    records.validate_record(record, KIND, str(out))
    for found in record["outliers"]:
        say(f"outlier: device {found['index']} ({found['uuid']}) off by {found['off']}")
    if record["excluded"]:
        say(f"left out of the survey: {record['excluded']}")
    write_json(out, record)
    return record


if __name__ == "__main__":
    print(json.dumps(measure_here()))
