"""What every workflow script does around its one library call.

`job(log, gpu=...)` sends the job's output to its log, isolates the CUDA compute cache
and CuPy's kernel cache in a private scratch directory before anything can initialise
CUDA, and, for GPU stages, places the job on one of the visible GPUs (kbfuse.workflow.devices:
on a machine with one GPU nothing changes), fails fast with a clear message when no GPU is
visible and then holds the GPU lock (kbfuse.workflow.gpulock) until the job ends: alone for the
stages that time or measure the device, shared for those that only compute.

A KbfuseError (bad input, or a machine that cannot run the stage) ends the job with exit
status 1 and its one-line message, once, on the terminal and in the log, without a
traceback; any other exception is a bug and keeps its traceback (in the log too).
`put_first_on_jobs_path` makes the jobs import the checkout's own kbfuse;
`announce_cpu_target` says why the `cpu` target compiles nothing without an architecture.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from kbfuse.compilation import cudacache
from kbfuse.errors import KbfuseError
from kbfuse.faults import checkpoint
from kbfuse.workflow import devices, gpulock


class NoGPUError(KbfuseError):
    """A GPU stage was started on a machine where CUDA sees no device."""


ADVICE = "Run it on a GPU machine, or build only the CPU part: snakemake --cores 1 cpu"


def require_gpu(stage: str, torch: bool = True) -> None:
    """NoGPUError unless the CUDA driver sees a GPU and (`torch`) torch can use it.

    The driver is asked first, through cuda-bindings (milliseconds): jobs that only need the driver
    (NVRTC compiles for `arch: auto`) pass torch=False and never import torch.
    """
    from kbfuse.compilation import cudadriver

    try:
        count = cudadriver.device_count()
        reason = "it reports 0 devices"
    except cudadriver.CudaDriverError as exc:
        count, reason = 0, str(exc)
    if count == 0:
        raise NoGPUError(
            f"stage {stage!r} needs a CUDA GPU, but the CUDA driver sees none ({reason}). {ADVICE}"
        )
    if not torch:
        return
    import torch as torch_module

    if not torch_module.cuda.is_available():
        raise NoGPUError(
            f"stage {stage!r} needs a CUDA GPU, but torch sees none "
            f"(torch {torch_module.__version__}, built for CUDA {torch_module.version.cuda}). "
            + ADVICE
        )


def put_first_on_jobs_path(src: str | Path) -> None:
    """Put `src` first on PYTHONPATH, which every job Snakemake starts inherits.

    Snakemake's script preamble only appends the script's folder to `sys.path`, after
    site-packages: without this, a kbfuse installed from another clone would run in the jobs
    instead of the checkout's own (whose files are the jobs' inputs)."""
    src = str(src)
    rest = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != src]
    os.environ["PYTHONPATH"] = os.pathsep.join([src, *rest])


CPU_WITHOUT_ARCH = (
    "kbfuse: the cpu target compiles no kernel while arch is 'auto', which reads the "
    "architecture from a GPU; to compile without one, name it: --config arch=sm_90"
)
_announced: set[str] = set()


def announce_cpu_target(arch: str, targets: list[str]) -> list[str]:
    """The `cpu` target's inputs, `targets`; says once why they hold no kernel for arch auto."""
    if arch == "auto" and CPU_WITHOUT_ARCH not in _announced:
        _announced.add(CPU_WITHOUT_ARCH)
        print(CPU_WITHOUT_ARCH, file=sys.stderr, flush=True)
    return targets


@contextlib.contextmanager
def _hold_the_gpu(how: str) -> Iterator[gpulock.GpuLock]:
    if how not in ("alone", "shared"):
        raise KbfuseError(f"GPU lock mode {how!r}: 'alone' or 'shared'")
    lock = gpulock.for_device("cuda")
    with getattr(lock, how)():
        yield lock


def _placement(gpu_lock: str | None) -> str:
    """How a job is placed: alone-for-life jobs look for an unused device first."""
    return "alone" if gpu_lock == "alone" else "shared"


@contextlib.contextmanager
def job(
    log: str | Path,
    stage: str,
    gpu: bool = False,
    torch: bool = True,
    gpu_lock: str | None = "alone",
    avoid: tuple[str, ...] | list[str] = (),
) -> Iterator[dict]:
    """Context for one workflow job; yields the CUDA cache record to store in its output.

    gpu: fail at once without a GPU; torch: whether the stage needs torch's CUDA too;
    gpu_lock: how a GPU job holds the GPU lock (kbfuse.workflow.gpulock) for its whole life:
    "alone" (it times, or measures the device: nothing else on it), "shared" (it only computes:
    beside other sharing jobs, never beside a timing one), or None (the survey's jobs, which
    take the lock phase by phase themselves, placed as sharing jobs); avoid: UUIDs of devices the
    job must not be placed on (kbfuse.workflow.devices.placed)."""
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
        failure = None
        try:
            record = cudacache.isolate(scratch)
            logging.getLogger("kbfuse").info("stage %s; CUDA cache: %s", stage, record)
            with contextlib.ExitStack() as held:
                if gpu:  # before CUDA is initialised in this process (require_gpu does)
                    device = held.enter_context(devices.placed(_placement(gpu_lock), avoid))
                    if device is not None:
                        logging.getLogger("kbfuse").info("placed on GPU %s", device.record())
                    require_gpu(stage, torch=torch)
                if gpu and gpu_lock is not None:
                    lock = held.enter_context(_hold_the_gpu(gpu_lock))
                    logging.getLogger("kbfuse").info("GPU lock %s after %.1f s", lock.path,
                                                     lock.waited_s)  # fmt: skip
                yield record
            checkpoint("job-end", stage)  # outputs written, Snakemake not yet told
        except KbfuseError as exc:
            failure = f"kbfuse: {stage} failed: {exc}"
            logging.getLogger("kbfuse").error("stage %s failed: %s", stage, exc)
        except Exception:
            logging.getLogger("kbfuse").exception("stage %s failed", stage)
            raise  # a bug, not bad input: its traceback goes to the log and the terminal
        finally:
            root.removeHandler(handler)
    if failure is not None:
        # Bad input or a machine that cannot run the stage: its message once, no traceback.
        print(failure, file=sys.__stderr__, flush=True)
        raise SystemExit(1)
