"""What the child processes' roles (kbfuse.candidates.child) share: importing a Python file as a
fresh module, KernelBench's seeding, moving inputs to the device, the digest of a case's
inputs, tensors and JSON in and out (tensors written with `torch.save` and read back with
`weights_only=True`), the record of an exception, and a trusted child's turns on the GPU.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import itertools
import json
import sys
import time
import traceback
from pathlib import Path
from typing import Any

_counter = itertools.count()


def import_file(path: str | Path, prefix: str):
    """Execute a Python file as a new module (registered in sys.modules, as torch.jit, pickle
    and Triton look modules up there)."""
    name = f"{prefix}_{next(_counter)}"
    spec = importlib.util.spec_from_file_location(name, str(path))
    if spec is None or spec.loader is None:
        raise ImportError(f"{path} cannot be imported as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def set_seed(seed: int) -> None:
    """KernelBench's set_seed (kbfuse.checks.official)."""
    from kbfuse.checks import official

    official.set_seed(seed)


def to_device(values: list, device: str) -> list:
    """KernelBench's input processing: tensors cast to float32 and moved to `device`, other
    values as they are (kbfuse.checks.official)."""
    from kbfuse.checks import official

    return official.to_device(values, device)


def inputs_digest(values: list) -> str:
    """sha256 of a case's inputs as drawn: each tensor's dtype, shape and bytes, any other
    value's type and repr. The reference and the candidate's process each draw a case's
    inputs; the parent compares the two digests."""
    import torch

    digest = hashlib.sha256()
    for value in values:
        if isinstance(value, torch.Tensor):
            flat = value.detach().cpu().contiguous().reshape(-1)
            digest.update(f"tensor {value.dtype} {tuple(value.shape)};".encode())
            digest.update(flat.view(torch.uint8).numpy())
        else:
            digest.update(f"{type(value).__name__} {value!r};".encode())
    return digest.hexdigest()


def torch_defaults() -> tuple:
    """torch's default dtype and device, as `fresh_defaults` takes them: the candidate's
    process reads them before it imports the candidate file."""
    import torch

    return torch.get_default_dtype(), torch.get_default_device()


@contextlib.contextmanager
def fresh_defaults(defaults: tuple):
    """torch's default dtype and device set to `defaults` (torch_defaults) for the block, and
    put back after it: the inputs and the task's own Model are made with a fresh process's
    defaults, as the reference makes them, even after a candidate file changed them."""
    import torch

    dtype, device = defaults
    now_dtype = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        # `with torch.device` and not set_default_device: setting it, even back to cpu, leaves a
        # device mode on torch's function stack for good, which slows every later op
        if torch.get_default_device() != device:
            with torch.device(device):
                yield
        else:
            yield
    finally:
        torch.set_default_dtype(now_dtype)


def save_tensors(path: Path, values: Any) -> None:
    import torch

    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(values, path)


def load_tensors(path: Path) -> Any:
    import torch

    return torch.load(path, weights_only=True, map_location="cpu")


def write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True, allow_nan=False, default=str))
    tmp.replace(path)


def error_record(exc: BaseException, stage: str) -> dict:
    message = str(exc).strip().splitlines()
    return {
        "stage": stage,
        "error": type(exc).__name__,
        "message": (message[0] if message else "")[:500],
        "traceback": traceback.format_exc()[-3000:],
    }


class GpuTurns:
    """The child's side of kbfuse.candidates.sandbox.Turns: `with turns.turn():` around each
    piece of device work asks the parent for the GPU lock (shared), waits until it holds it,
    and when the work is done synchronizes the device and gives the turn back. `spec`: the
    request's `turns` (None: no lock, every turn at once)."""

    def __init__(self, spec: dict | None, device: str):
        self.folder = Path(spec["folder"]) if spec else None
        self.device = device
        self.count = 0

    def _file(self, what: str) -> Path:
        return self.folder / f"gpu.{self.count}.{what}"

    @contextlib.contextmanager
    def turn(self):
        if self.folder is None:
            yield
            return
        self._file("ask").touch()
        while not self._file("held").exists():
            time.sleep(0.005)
        yield
        if self.device == "cuda":
            import torch

            torch.cuda.synchronize()  # nothing of this turn still running on the device
        self._file("done").touch()
        self.count += 1
