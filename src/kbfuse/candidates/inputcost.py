"""What a check pays for not writing a case's inputs (docs/check.md, "Scratch disk"): drawing
them again with a seed and taking their digest, against writing them to the scratch folder
and reading them back, as checks did before. One float32 tensor of the size asked, drawn as
KernelBench's `get_inputs` draw (torch.rand); each step timed `repeats` times, the median
kept. The read comes from the page cache (the file was just written), as it mostly did in a
check: the figure is the lower bound of what the disk cost.
"""

from __future__ import annotations

import os
import platform
import statistics
import time
from pathlib import Path

STEPS = ("draw", "digest", "write", "read")


def _timed(step, *args) -> tuple[float, object]:
    started = time.perf_counter()
    value = step(*args)
    return time.perf_counter() - started, value


def _write(torch, value, path: Path) -> None:
    with open(path, "wb") as f:
        torch.save(value, f)
        f.flush()
        os.fsync(f.fileno())


def measure(size_bytes: int, repeats: int, folder: Path) -> dict:
    """Median seconds of each step for one tensor of `size_bytes` (a multiple of 4), and the
    ratio of redrawing (draw + digest) to the disk's round trip (write + read)."""
    import torch

    from kbfuse.candidates.childio import inputs_digest

    if size_bytes <= 0 or size_bytes % 4:
        raise ValueError(f"size {size_bytes} bytes is not a positive multiple of 4")
    path = folder / "kbfuse-inputcost.pt"
    seconds: dict[str, list[float]] = {step: [] for step in STEPS}
    digests = set()
    try:
        for _ in range(repeats):
            torch.manual_seed(0)
            took, inputs = _timed(lambda: [torch.rand(size_bytes // 4)])
            seconds["draw"].append(took)
            took, digest = _timed(inputs_digest, inputs)
            seconds["digest"].append(took)
            digests.add(digest)
            seconds["write"].append(_timed(_write, torch, inputs, path)[0])
            inputs.clear()  # freed before the read, as the drawing process had ended
            seconds["read"].append(_timed(torch.load, path)[0])
    finally:
        path.unlink(missing_ok=True)
    median = {step: round(statistics.median(values), 3) for step, values in seconds.items()}
    redraw = median["draw"] + median["digest"]
    disk = median["write"] + median["read"]
    return {
        "size_bytes": size_bytes,
        "repeats": repeats,
        "seconds": median,
        "redraw_s": round(redraw, 3),
        "disk_s": round(disk, 3),
        "redraw_over_disk": round(redraw / disk, 3),
        "same_digest_every_draw": len(digests) == 1,
        "machine": {
            "cpu_threads": torch.get_num_threads(),
            "cpu": platform.processor() or platform.machine(),
            "torch": torch.__version__,
        },
    }


def report_markdown(report: dict) -> str:
    s = report["seconds"]
    gib = report["size_bytes"] / 2**30
    return (
        f"Inputs of {gib:.3g} GiB (float32, torch.rand), median of {report['repeats']}, "
        f"{report['machine']['cpu_threads']} CPU threads, torch {report['machine']['torch']}\n\n"
        "| step | seconds |\n|------|---------|\n"
        + "".join(f"| {step} | {s[step]:.3f} |\n" for step in STEPS)
        + f"\nredraw (draw + digest) {report['redraw_s']:.3f} s, disk (write + read) "
        f"{report['disk_s']:.3f} s: ratio {report['redraw_over_disk']:.2f}; the same digest "
        f"every draw: {report['same_digest_every_draw']}\n"
    )
