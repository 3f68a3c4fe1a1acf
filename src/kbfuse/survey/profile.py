"""Where one forward's time goes: the kernels torch.profiler sees, per baseline.

On a GPU, `PROFILED_FORWARDS` forwards run under torch.profiler (CPU and CUDA activity); every
device event (kernels, and the copies and memsets the GPU runs) is summed per name, its time
taken from the event's own time range, and divided by the number of forwards:
`[{name, device_us, calls}]` per ONE forward, sorted by time, longest first. On the CPU (tests,
CI) the same list holds the profiler's CPU ops with their self time (`device_us` is then CPU
microseconds). Classifying the names (library GEMM, Triton, framework pointwise, ...) is the
summary's job.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable

PROFILED_FORWARDS = 3


def _per_forward(totals: dict[str, list[float]], forwards: int) -> list[dict]:
    rows = [
        {"name": name, "device_us": us / forwards, "calls": max(1, round(calls / forwards))}
        for name, (us, calls) in totals.items()
    ]
    return sorted(rows, key=lambda row: (-row["device_us"], row["name"]))


def kernels(run: Callable[[], object], device: str, forwards: int = PROFILED_FORWARDS) -> list:
    """The record's `kernels` list of the zero-argument forward `run` (already warm)."""
    import torch
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU]
    if device == "cuda":
        activities.append(ProfilerActivity.CUDA)
        torch.cuda.synchronize()
    with profile(activities=activities) as prof:
        for _ in range(forwards):
            run()
        if device == "cuda":
            torch.cuda.synchronize()
    totals: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    if device == "cuda":
        for event in prof.events():
            if event.device_type == DeviceType.CUDA:
                totals[event.name][0] += float(event.time_range.elapsed_us())
                totals[event.name][1] += 1
    else:
        for event in prof.key_averages():
            if event.self_cpu_time_total > 0:
                totals[event.key][0] += float(event.self_cpu_time_total)
                totals[event.key][1] += int(event.count)
    return _per_forward(totals, forwards)
