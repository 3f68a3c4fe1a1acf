"""What every workflow script does around its one library call.

`job(log, gpu=...)` sends the job's output to its log, isolates the CUDA compute cache
and CuPy's kernel cache in a private scratch directory before anything can initialise
CUDA, and, for GPU stages, fails fast with a clear message when no GPU is visible.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from kbfuse import cudacache
from kbfuse.errors import KbfuseError
from kbfuse.faults import checkpoint


class NoGPUError(KbfuseError):
    """A GPU stage was started on a machine where CUDA sees no device."""


def require_gpu(stage: str) -> None:
    import torch

    if not torch.cuda.is_available():
        raise NoGPUError(
            f"stage {stage!r} needs a CUDA GPU, but torch sees none "
            f"(torch {torch.__version__}, built for CUDA {torch.version.cuda}). "
            "Run it on a GPU machine, or build only the CPU part: snakemake --cores 1 cpu"
        )


@contextlib.contextmanager
def job(log: str | Path, stage: str, gpu: bool = False) -> Iterator[dict]:
    """Context for one workflow job; yields the CUDA cache record to store in its output."""
    log_path = Path(log)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with (
        open(log_path, "w") as fh,
        contextlib.redirect_stdout(fh),
        contextlib.redirect_stderr(fh),
        tempfile.TemporaryDirectory(prefix=f"kbfuse-{stage}-") as scratch,
    ):
        handler = logging.StreamHandler(fh)
        handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(message)s"))
        root = logging.getLogger()
        root.addHandler(handler)
        root.setLevel(logging.INFO)
        try:
            record = cudacache.isolate(scratch)
            logging.getLogger("kbfuse").info("stage %s; CUDA cache: %s", stage, record)
            if gpu:
                require_gpu(stage)
            yield record
            checkpoint("job-end", stage)  # outputs written, Snakemake not yet told
        except Exception as exc:
            logging.getLogger("kbfuse").error("stage %s failed: %s", stage, exc)
            print(f"kbfuse: {stage} failed: {exc}", file=sys.__stderr__)
            raise
        finally:
            root.removeHandler(handler)
