"""Load a compiled tails artifact and launch its kernels on the current torch stream.

`LoadedModule.load` re-hashes the artifact against its compile metadata before CuPy loads
it (`cupy.RawModule(path=...)`: cuModuleLoad, which takes a cubin or PTX; PTX is compiled by
the driver). The launch geometry is the one the kernel source declares (its kbfuse-launch
line, recorded as `launch` in the compile metadata; kbfuse.compilation.kernelsrc). Launches go to
`torch.cuda.current_stream()`, so they order with torch work and are captured by
`torch.cuda.graph`: nothing here synchronises the host, and with `out` given nothing is
allocated but a tail's workspace (`Tail.workspace`: zeroed buffers a reducing kernel keeps its
partial sums in, allocated through torch's caching allocator so that CUDA graphs capture it).
Only the module and its function handles are kept between calls.

A module loads the witness kernel and the kernels the caller names when it loads (a kernel
missing from the artifact is an error then); any other kernel is looked up on first use.
Each launch covers the work items the tail names (`Tail.launch_items`: elements, or planes
of a reduction), in the source's geometry (`per-element`, `grid-stride` or `per-block`).

cupy is imported inside functions, so this module imports on machines without a GPU.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import numpy as np
import torch

from kbfuse.compilation.kernelsrc import Launch, LaunchPlan, grid_blocks
from kbfuse.errors import KbfuseError
from kbfuse.io import read_json, sha256_file
from kbfuse.tasks import registry as tasks
from kbfuse.tasks.tails import Tail, pointer

MAX_GRID_X = 2**31 - 1
KERNEL_NAMES = tasks.KERNEL_NAMES  # the first study's kernels and the witness (the default)

# CuPy memoizes RawModule(path=...) per path and device for the life of the process. A path
# reloaded with different content would silently give the old module, so refuse that.
_loaded_digests: dict[str, str] = {}


def grid_for(n: int, launch: Launch, sm_count: int) -> int:
    """Blocks for n elements under `launch`; KbfuseError when over one grid dimension."""
    blocks = grid_blocks(launch, n, sm_count)
    if blocks > MAX_GRID_X:
        raise KbfuseError(
            f"element count {n} needs {blocks} blocks of {launch.threads}, over the grid limit "
            f"{MAX_GRID_X}"
        )
    return blocks


def launch_of(meta: dict, artifact) -> LaunchPlan:
    """The launch plan recorded in compile metadata; KbfuseError when absent or malformed."""
    record = meta.get("launch")
    try:
        return LaunchPlan.from_record(record)
    except (TypeError, KeyError, AttributeError):
        raise KbfuseError(
            f"compile metadata for {artifact} (variant {meta.get('variant')!r}) has no valid "
            f"launch record (got {record!r}); recompile it with this version of kbfuse"
        ) from None


class LoadedModule:
    """A verified artifact loaded into the current CUDA device through CuPy."""

    def __init__(
        self,
        artifact: Path,
        meta: dict,
        raw_module,
        functions: dict,
        device: int,
        launch: LaunchPlan,
        sm_count: int,
    ):
        self.artifact = artifact
        self.meta = meta
        self.variant = meta.get("variant")
        self.device = device
        self.launch_plan = launch
        self.sm_count = sm_count
        self._raw_module = raw_module
        self._functions = functions

    @classmethod
    def load(
        cls,
        artifact: str | os.PathLike,
        meta: dict | str | os.PathLike,
        kernels=KERNEL_NAMES,
    ) -> LoadedModule:
        """Check sha256 against meta["artifact_sha256"], then load with cupy.RawModule and
        look up `kernels` (and the witness) at once."""
        artifact = Path(artifact)
        if not isinstance(meta, dict):
            meta = read_json(meta)
        if not artifact.is_file():
            raise KbfuseError(f"artifact {artifact} does not exist")
        expected = meta.get("artifact_sha256")
        if not isinstance(expected, str):
            raise KbfuseError(
                f"compile metadata for {artifact} has no artifact_sha256 (got {expected!r})"
            )
        actual = sha256_file(artifact)
        if actual != expected:
            raise KbfuseError(
                f"artifact {artifact} has sha256 {actual}, but its compile metadata "
                f"(variant {meta.get('variant')!r}) says artifact_sha256 {expected}"
            )
        launch = launch_of(meta, artifact)
        key = str(artifact.resolve())
        if _loaded_digests.setdefault(key, actual) != actual:
            raise KbfuseError(
                f"artifact {artifact} changed after this process loaded it "
                f"(sha256 {_loaded_digests[key]} then {actual}); CuPy would reuse the old "
                "module: load a changed artifact in a new process or under another path"
            )

        import cupy

        device = cupy.cuda.runtime.getDevice()
        sm_count = cupy.cuda.runtime.getDeviceProperties(device)["multiProcessorCount"]
        raw_module = cupy.RawModule(path=str(artifact))
        module = cls(artifact, meta, raw_module, {}, device, launch, sm_count)
        for name in dict.fromkeys((*kernels, tasks.WITNESS_KERNEL)):
            module.function(name)
        return module

    def function(self, name: str):
        """The cupy.RawKernel `name`, looked up in the module on first use."""
        if name not in self._functions:
            import cupy

            try:
                self._functions[name] = self._raw_module.get_function(name)
            except cupy.cuda.driver.CUDADriverError as exc:
                raise KbfuseError(
                    f"artifact {self.artifact} (variant {self.variant!r}): kernel {name!r} "
                    f"cannot be loaded: {exc}"
                ) from exc
        return self._functions[name]

    def launch(self, name: str, n: int, args: tuple, device: torch.device) -> None:
        """Kernel `name` over n elements, in the source's launch geometry, on torch's stream."""
        if device.index != self.device:
            raise KbfuseError(
                f"tensors on {device}, but the module was loaded on cuda:{self.device}"
            )
        kernel = self.function(name)
        geometry = self.launch_plan.for_kernel(name)
        blocks = grid_for(n, geometry, self.sm_count)
        kernel((blocks,), (geometry.threads,), args, stream=_current_cupy_stream(device))


def _current_cupy_stream(device: torch.device):
    """torch's current stream on `device`, wrapped for CuPy (no stream is created or synced)."""
    import cupy

    torch_stream = torch.cuda.current_stream(device)
    if hasattr(cupy.cuda.Stream, "from_external") and hasattr(torch_stream, "__cuda_stream__"):
        return cupy.cuda.Stream.from_external(torch_stream)
    with warnings.catch_warnings():
        # CuPy 14 deprecates ExternalStream in favour of Stream.from_external (used above
        # when torch implements the stream protocol); both only wrap the pointer.
        warnings.simplefilter("ignore", DeprecationWarning)
        return cupy.cuda.ExternalStream(torch_stream.cuda_stream)


def workspace_for(tail: Tail, y: torch.Tensor) -> dict[str, torch.Tensor]:
    """The tail's workspace buffers for library output `y`, zeroed (none for most tails)."""
    return {
        name: torch.zeros(shape, dtype=dtype, device=y.device)
        for name, (shape, dtype) in tail.workspace(y).items()
    }


def run_tail(
    mod: LoadedModule, tail: Tail, model, y: torch.Tensor, out: torch.Tensor | None = None
) -> torch.Tensor:
    """The fused tail on library output `y`, written to `out` (new when None) and returned."""
    if out is None:
        out = torch.empty(tail.output_shape(model, y), dtype=y.dtype, device=y.device)
    workspace = workspace_for(tail, y)
    args = tail.kernel_args(model, y, out, workspace=workspace)
    mod.launch(tail.kernel, tail.launch_items(y), args, y.device)
    return out


def run_stage(
    mod: LoadedModule, tail: Tail, model, y: torch.Tensor, out: torch.Tensor | None = None
) -> torch.Tensor:
    """A reducing tail's element-wise stage on `y` (its stage kernel), written to `out`."""
    if tail.stage_kernel is None:
        raise KbfuseError(f"task {tail.task}: its tail has no element-wise stage kernel")
    if out is None:
        out = torch.empty(tail.stage_shape(model, y), dtype=y.dtype, device=y.device)
    args = tail.stage_args(model, y, out)
    mod.launch(tail.stage_kernel, tail.stage_items(model, y), args, y.device)
    return out


def run_witness(
    mod: LoadedModule, x: torch.Tensor, scale: float, out: torch.Tensor | None = None
) -> torch.Tensor:
    """witness_mul: out = x * float32(scale), elementwise, in the artifact's numerical mode."""
    for name, t in (("x", x), ("out", out)):
        if t is None:
            continue
        if t.dtype != torch.float32 or not t.is_contiguous() or not t.is_cuda:
            raise KbfuseError(
                f"witness {name} must be a contiguous float32 CUDA tensor, got {t.dtype}, "
                f"contiguous={t.is_contiguous()}, device {t.device}"
            )
    if out is None:
        out = torch.empty_like(x, memory_format=torch.contiguous_format)
    elif out.shape != x.shape or out.device != x.device:
        raise KbfuseError(
            f"witness out {tuple(out.shape)} on {out.device} does not match x "
            f"{tuple(x.shape)} on {x.device}"
        )
    n = x.numel()
    args = (pointer(x), pointer(out), np.int64(n), np.float32(scale))
    mod.launch(tasks.WITNESS_KERNEL, n, args, x.device)
    return out


class FusedProgram:
    """x -> fused tail(the model's own library op on x): the full program, tail replaced."""

    def __init__(self, mod: LoadedModule, tail: Tail, model):
        self.mod = mod
        self.tail = tail
        self.model = model
        tail.library(model)  # the library op must be there

    def __call__(self, x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        with torch.no_grad():
            y = self.tail.library_output(self.model, x)
            return run_tail(self.mod, self.tail, self.model, y, out)
