"""Runtime detection of candidates that game the timer, each finding reported by name.

Detection watches what the candidate's code *does* in its process, not what its text says:

- `timer_patched`: the identity of every clock and synchronisation object a timing harness
  relies on (torch.cuda.Event and its record / elapsed_time / synchronize / query,
  torch.cuda.synchronize, Stream.synchronize, current_stream, CUDAGraph.replay,
  time.perf_counter / perf_counter_ns / time / monotonic) is taken before the candidate is
  imported and compared after the import and after every call; any change is named.
  kbfuse's own timing calls the functions captured before the import (`Clock`), so a patch
  is reported and does not change the figures.
- `lazy_result`: the output is not exactly a `torch.Tensor` (a subclass, a proxy, anything
  else), so work could be deferred to the moment it is looked at.
- `side_stream`: under torch.profiler, a GPU kernel, copy or fill of the candidate's call ran on
  a stream other than the caller's (the caller's streams are those of the task's own model
  profiled the same way in the same process). The call judged is the instance's second, as
  every timed call follows a warm-up; its first call is profiled too and recorded beside it
  (`first_call`), since one-off setup runs there: capturing a CUDA graph runs PyTorch's own
  bookkeeping kernels on the capture stream, which `torch.cuda.graph` orders with the
  caller's stream, and the graph's replays then run on the caller's stream.
- `unfinished_on_caller_stream`: right after the call only the caller's stream is
  synchronised and the output copied on it; the copy is compared bit for bit with the output
  after a device-wide synchronisation. A difference means the result was written by work the
  caller's stream did not wait for (a race: its absence proves nothing; `side_stream` is the
  deterministic check).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

WATCHED_TIME = ("perf_counter", "perf_counter_ns", "time", "monotonic", "process_time")


def _watched(torch) -> dict[str, Any]:
    objects: dict[str, Any] = {f"time.{name}": getattr(time, name) for name in WATCHED_TIME}
    cuda = torch.cuda
    objects["torch.cuda.Event"] = cuda.Event
    for attr in ("record", "elapsed_time", "synchronize", "query", "wait", "__init__"):
        objects[f"torch.cuda.Event.{attr}"] = getattr(cuda.Event, attr, None)
    objects["torch.cuda.synchronize"] = cuda.synchronize
    objects["torch.cuda.current_stream"] = cuda.current_stream
    objects["torch.cuda.Stream"] = cuda.Stream
    objects["torch.cuda.Stream.synchronize"] = getattr(cuda.Stream, "synchronize", None)
    objects["torch.cuda.CUDAGraph.replay"] = getattr(cuda.CUDAGraph, "replay", None)
    objects["torch.allclose"] = torch.allclose
    objects["torch.equal"] = torch.equal
    return objects


def snapshot() -> dict[str, int]:
    """name -> id() of each watched object (see the module docstring)."""
    import torch

    return {name: id(obj) for name, obj in _watched(torch).items()}


def patched(before: dict[str, int]) -> list[str]:
    """Names whose object is no longer the one of `before`."""
    now = snapshot()
    return sorted(name for name, ident in before.items() if now.get(name) != ident)


class Clock:
    """The timing functions as they were before the candidate was imported."""

    def __init__(self) -> None:
        import torch

        self.perf_counter = time.perf_counter
        if torch.cuda.is_available():
            self.event_cls = torch.cuda.Event
            self.record = torch.cuda.Event.record
            self.elapsed_time = torch.cuda.Event.elapsed_time
            self.event_sync = torch.cuda.Event.synchronize
            self.device_sync = torch.cuda.synchronize

    def event(self):
        return self.event_cls(enable_timing=True)


def lazy_result(output: Any) -> str | None:
    """Why the output is not a plain tensor, or None."""
    import torch

    if type(output) is torch.Tensor:
        return None
    return f"output is {type(output).__module__}.{type(output).__qualname__}, not torch.Tensor"


def kernel_streams(trace_path: Path) -> list[dict]:
    """GPU activity of a chrome trace written by torch.profiler: name, category, stream."""
    data = json.loads(Path(trace_path).read_text())
    found = []
    for event in data.get("traceEvents", []):
        cat = str(event.get("cat", "")).lower()
        if cat in ("kernel", "gpu_memcpy", "gpu_memset") and "stream" in event.get("args", {}):
            found.append(
                {"name": event["name"][:120], "cat": cat, "stream": event["args"]["stream"]}
            )
    return found


def profile_streams(fn: Callable[[], Any], trace_path: Path) -> list[dict]:
    """GPU activity of one call of `fn` (synchronised before and after)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    prof.export_chrome_trace(str(trace_path))
    return kernel_streams(trace_path)


def _off_streams(streams: list, candidate: list[dict]) -> dict:
    other = [k for k in candidate if k["stream"] not in streams]
    return {
        "candidate_streams": sorted({k["stream"] for k in candidate}),
        "off_stream": other[:20],
        "detected": bool(other) and bool(streams),
    }


def side_stream_work(
    caller: list[dict], candidate: list[dict], first_call: list[dict] | None = None
) -> dict:
    """Candidate GPU work on a stream the caller's own model never used. `candidate` is a call
    after the first (like every timed call) and decides `detected`; `first_call`, when given,
    is the instance's first call, recorded under "first_call" without deciding anything."""
    streams = sorted({k["stream"] for k in caller})
    record = {"caller_streams": streams, **_off_streams(streams, candidate)}
    if first_call is not None:
        record["first_call"] = _off_streams(streams, first_call)
    return record


def unfinished_on_caller_stream(fn: Callable[[], Any]) -> bool:
    """True when the output read after the caller's stream alone was synchronised differs
    from the output after a device-wide synchronisation (see the module docstring)."""
    import torch

    torch.cuda.synchronize()
    output = fn()
    torch.cuda.current_stream().synchronize()
    early = output.detach().contiguous().clone()
    torch.cuda.synchronize()
    late = output.detach().contiguous()
    return not torch.equal(early.view(torch.uint8), late.view(torch.uint8))
