"""Where one forward's time goes: the kernels torch.profiler sees, and the GPU's idle gaps.

On a GPU, `PROFILED_FORWARDS` forwards run under torch.profiler (CPU and CUDA activity), each
inside its own `record_function` range that ends with a device synchronisation, so every
device event of a forward falls inside that forward's range. Two things are read from them:

- `kernels`: every device event (kernels, and the copies and memsets the GPU runs) summed per
  name, its time taken from the event's own time range, divided by the number of forwards:
  `[{name, device_us, calls}]` per ONE forward, sorted by time, longest first. Classifying the
  names (library GEMM, Triton, framework pointwise, ...) is the summary's job.
- `timeline` (`forward_gaps`): per forward, from the start of its first device event to the
  end of its last (`span_us`), the time some event runs (`busy_us`: the union of their time
  ranges, so kernels overlapping on several streams count once) and the rest, the GPU idle
  between kernels inside the forward (`idle_us` = span - busy), averaged over the forwards.
  Time before the first kernel and after the last is not counted: it is the host's, not a
  gap between kernels. The forwards are launched directly (not replayed from a CUDA graph, as
  the timing does where it can), so the gaps include the launch latency a graph replay
  shortens: an upper bound of the idle time of the timed forward.

On the CPU (tests, CI) `kernels` holds the profiler's CPU ops with their self time
(`device_us` is then CPU microseconds) and there is no timeline (None).

Profiling is two steps: `capture` runs the forwards under the profiler (GPU work: the survey
job holds the GPU alone for it), `read` turns what it saw into those two (CPU work only: torch
parses the trace when its events are first asked for, seconds for a model of thousands of
kernels per forward, so the job reads after it has left the GPU to other jobs).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

PROFILED_FORWARDS = 3
MARK = "kbfuse profiled forward "  # the record_function range of each forward


def _per_forward(totals: dict[str, list[float]], forwards: int) -> list[dict]:
    rows = [
        {"name": name, "device_us": us / forwards, "calls": max(1, round(calls / forwards))}
        for name, (us, calls) in totals.items()
    ]
    return sorted(rows, key=lambda row: (-row["device_us"], row["name"]))


def busy_us(intervals: Iterable[tuple[float, float]]) -> float:
    """The length of the union of the intervals [start, end]."""
    total, end = 0.0, None
    for start, stop in sorted(intervals):
        if end is None or start > end:
            total += stop - start
            end = stop
        elif stop > end:
            total += stop - end
            end = stop
    return total


def forward_gaps(
    windows: Sequence[tuple[float, float]], activity: Iterable[tuple[float, float]]
) -> dict | None:
    """The record's `timeline`: device `activity` intervals (start, end in us) split among the
    forwards' host `windows` (an event belongs to the window its start falls in); per forward
    its span, busy and idle time, averaged over the forwards that ran a device event.
    `unassigned` counts the events outside every window. None when no forward ran any."""
    per_window: list[list[tuple[float, float]]] = [[] for _ in windows]
    unassigned = 0
    for start, end in activity:
        index = next((i for i, (a, b) in enumerate(windows) if a <= start <= b), None)
        if index is None:
            unassigned += 1
        else:
            per_window[index].append((start, end))
    spans, busies = [], []
    for events in per_window:
        if events:
            spans.append(max(e for _, e in events) - min(s for s, _ in events))
            busies.append(busy_us(events))
    if not spans:
        return None
    span, busy = sum(spans) / len(spans), sum(busies) / len(busies)
    return {
        "forwards": len(spans),
        "span_us": span,
        "busy_us": busy,
        "idle_us": max(span - busy, 0.0),
        "unassigned": unassigned,
    }


def _is_device_work(event) -> bool:
    from torch.autograd import DeviceType

    annotation = getattr(event, "is_user_annotation", False) or event.name.startswith(MARK)
    return event.device_type == DeviceType.CUDA and not annotation


def _device_profile(events, forwards: int) -> tuple[list, dict | None]:
    from torch.autograd import DeviceType

    totals: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    activity, windows = [], []
    for event in events:
        if event.device_type == DeviceType.CPU and event.name.startswith(MARK):
            windows.append((event.time_range.start, event.time_range.end))
        elif _is_device_work(event):
            totals[event.name][0] += float(event.time_range.elapsed_us())
            totals[event.name][1] += 1
            activity.append((float(event.time_range.start), float(event.time_range.end)))
    return _per_forward(totals, forwards), forward_gaps(sorted(windows), activity)


def _cpu_profile(averages, forwards: int) -> list:
    totals: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for event in averages:
        if event.self_cpu_time_total > 0 and not event.key.startswith(MARK):
            totals[event.key][0] += float(event.self_cpu_time_total)
            totals[event.key][1] += int(event.count)
    return _per_forward(totals, forwards)


@dataclass(frozen=True)
class Capture:
    """The profiler that watched `forwards` forwards, its trace not yet parsed."""

    profiler: Any
    cuda: bool
    forwards: int


def capture(run: Callable[[], object], device: str, forwards: int = PROFILED_FORWARDS) -> Capture:
    """Run the zero-argument forward `run` (already warm) `forwards` times under the profiler,
    each in its own range ended by a device synchronisation."""
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    cuda = device == "cuda"
    activities = [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if cuda else [])]
    if cuda:
        torch.cuda.synchronize()
    with profile(activities=activities) as prof:
        for i in range(forwards):
            with record_function(f"{MARK}{i}"):
                run()
                if cuda:
                    torch.cuda.synchronize()
    return Capture(prof, cuda, forwards)


def read(captured: Capture) -> tuple[list, dict | None]:
    """(kernels, timeline) of a capture: the record's `kernels` and `timeline` of one
    baseline."""
    prof, forwards = captured.profiler, captured.forwards
    if captured.cuda:
        return _device_profile(prof.events(), forwards)
    return _cpu_profile(prof.key_averages(), forwards), None


def profile_forward(
    run: Callable[[], object], device: str, forwards: int = PROFILED_FORWARDS
) -> tuple[list, dict | None]:
    """`read(capture(...))`: (kernels, timeline) of the forward `run`, in one step."""
    return read(capture(run, device, forwards))
