"""What the parent of a check pays to read one case's tensor file (docs/check.md): mapped, as
`readback.load_tensors` reads it now, against copied, as it read it before (the file's bytes
read into memory, the archive checked on them, `torch.load` from that buffer); each followed
by the case's fingerprint (`compare.fingerprint`), which reads every byte once more, as the
comparison does. One float32 tensor of the size asked, written with `torch.save` as a child
writes its outputs; each way timed `repeats` times, the median kept. Both read from the page
cache (the file was just written; on a tmpfs scratch root, the machine's memory, it is all
there is).
"""

from __future__ import annotations

import io
import platform
import statistics
import time
from pathlib import Path

WAYS = ("copied", "mapped")


def _copied(path: Path, folder: Path, limit: int):
    """The read before the mapping: bytes, the archive checked on them, loaded from them."""
    import torch

    from kbfuse import untrusted
    from kbfuse.candidates import readback

    raw = untrusted.read_bytes(path, limit, within=folder)
    readback.check_archive(raw, str(path), limit)
    return torch.load(io.BytesIO(raw), weights_only=True, map_location="cpu")


def measure(size_bytes: int, repeats: int, folder: Path) -> dict:
    """Median seconds to load, and to load and fingerprint, one tensor file of `size_bytes`
    (a multiple of 4) each way, their ratio (copied over mapped), and whether both ways give
    the same fingerprint."""
    import torch

    from kbfuse.candidates import compare, readback

    if size_bytes <= 0 or size_bytes % 4:
        raise ValueError(f"size {size_bytes} bytes is not a positive multiple of 4")
    if not folder.is_dir():
        raise ValueError(f"{folder} is not a folder")
    path = folder / "kbfuse-readcost.pt"
    limit = size_bytes + (1 << 20)
    ways = {"copied": _copied, "mapped": readback.load_tensors}
    load: dict[str, list[float]] = {way: [] for way in WAYS}
    total: dict[str, list[float]] = {way: [] for way in WAYS}
    prints = set()
    try:
        torch.manual_seed(0)
        torch.save(torch.rand(size_bytes // 4), path)
        for _ in range(repeats):
            for way in WAYS:
                started = time.perf_counter()
                value = ways[way](path, folder, limit)
                loaded = time.perf_counter()
                prints.add(compare.fingerprint(value))
                done = time.perf_counter()
                del value
                load[way].append(loaded - started)
                total[way].append(done - started)
    finally:
        path.unlink(missing_ok=True)
    load_s = {way: round(statistics.median(v), 4) for way, v in load.items()}
    total_s = {way: round(statistics.median(v), 4) for way, v in total.items()}
    return {
        "size_bytes": size_bytes,
        "repeats": repeats,
        "load_s": load_s,
        "load_and_fingerprint_s": total_s,
        "copied_over_mapped": round(total_s["copied"] / total_s["mapped"], 2),
        "same_fingerprint": len(prints) == 1,
        "machine": {
            "cpu_threads": torch.get_num_threads(),
            "cpu": platform.processor() or platform.machine(),
            "torch": torch.__version__,
        },
    }


def report_markdown(report: dict) -> str:
    gib = report["size_bytes"] / 2**30
    load, total = report["load_s"], report["load_and_fingerprint_s"]
    return (
        f"One case of {gib:.3g} GiB (float32, torch.save), median of {report['repeats']}, "
        f"{report['machine']['cpu_threads']} CPU threads, torch {report['machine']['torch']}\n\n"
        "| read | load s | load and fingerprint s |\n|------|--------|------------------------|\n"
        + "".join(f"| {way} | {load[way]:.3f} | {total[way]:.3f} |\n" for way in WAYS)
        + f"\ncopied over mapped (load and fingerprint): {report['copied_over_mapped']:.2f}x; "
        f"the same fingerprint both ways: {report['same_fingerprint']}\n"
    )
