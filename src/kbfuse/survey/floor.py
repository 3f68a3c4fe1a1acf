"""The least memory traffic the work outside library kernels must make: a task's floor.

The survey's outside time (the best compiled forward minus its library GEMM/convolution
kernels) is what a fused kernel could still win, but not all of it: whatever replaces that
work must still read what the library ops wrote, the task's inputs and the parameters it
uses, and write what leaves it. `floor_bytes` counts those bytes, each tensor once; the
summary divides them by the copy bandwidth measured on the same GPU (the env fingerprint's
`copy_bandwidth.gbps`, read plus written bytes per second) to get `floor_ms`.

How the bytes are found, on the CPU and with no GPU: the pinned task's `Model` and its
inputs are built under torch's FakeTensorMode (shapes and dtypes, no data), and one forward
runs under a TorchDispatchMode that sees every ATen op with its tensors. Each tensor storage
is followed from where it came from (a task input, a parameter or buffer, a library op, other
work); views share their base's storage and move no bytes. Then, per storage (its bytes: the
largest tensor seen on it, at most the storage):

- **read** by the outside work: a library op's output, a task input, or a parameter/buffer
  that a non-library op reads;
- **written** by the outside work: a storage it produced (or last overwrote) that a library
  op then reads, or that is the task's output.

Intermediates made and used only by outside work are not counted (a fused kernel keeps them
on chip), nor are a library op's own operands (its weights, its bias: the library reads them)
or buffers written as side effects (BatchNorm's running statistics in training mode, a few
bytes). So the floor is a lower bound of the traffic of any implementation that keeps the
library ops as they are; it ignores compute, launch latency and re-reads a real kernel may
need (a softmax over a dimension too large for one block reads twice).

`LIBRARY_OPS` are the ATen ops whose kernels `kbfuse.survey.classify` puts in its `library`
category (cuBLAS/cuDNN GEMMs and convolutions; attention and RNN calls of level 3). On a CPU
machine some level-3 ops take other ATen routes than on a GPU (an RNN decomposes into its
GEMMs and pointwise ops where cuDNN would run one call); the floor then counts the route the
CPU took. A task whose forward needs data (`.item()`, a data-dependent shape) or a package
that is not installed has no floor: `problem` says why.

    python -m kbfuse.survey.floor CHECKOUT LEVEL TASK [--gbps 4287.3]

prints one task's floor (and its milliseconds at a copy bandwidth), as the summary computes it.
The workflow finds each task's floor in a CPU job of its own (`survey_floor`, beside the GPU
jobs: a level-3 GRU's fake forward takes a minute), and the summary reads those records.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

LIBRARY_OPS = frozenset(
    {
        # GEMMs
        "mm", "addmm", "bmm", "baddbmm", "addbmm", "addmv", "mv", "dot", "_scaled_mm",
        # convolutions (aten.convolution is what nn.ConvNd and their transposes reach)
        "convolution", "_convolution", "convolution_overrideable", "cudnn_convolution",
        "cudnn_convolution_transpose", "mkldnn_convolution",
        # attention and recurrent layers as one library call (level 3)
        "_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
        "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_flash_attention_for_cpu",
        "_flash_attention_forward", "_efficient_attention_forward", "_cudnn_rnn",
        "mkldnn_rnn_layer",
        # FFTs
        "_fft_r2c", "_fft_c2r", "_fft_c2c",
    }
)  # fmt: skip
INPUT, PARAMETER, LIBRARY, OTHER = "input", "parameter", "library", "other"
KIND = "survey_floor"  # a task's floor as a record of its own (floor_record)
SCHEMA_VERSION = 1


@dataclass
class Floor:
    """The bytes outside work must move at least, by where they come from."""

    library_outputs: list[dict] = field(default_factory=list)  # [{op, shape, bytes}]
    read_library: int = 0
    read_inputs: int = 0
    read_parameters: int = 0
    written: int = 0

    @property
    def bytes(self) -> int:
        return self.read_library + self.read_inputs + self.read_parameters + self.written

    def as_dict(self) -> dict[str, Any]:
        return {
            "floor_bytes": self.bytes,
            "read_library_bytes": self.read_library,
            "read_input_bytes": self.read_inputs,
            "read_parameter_bytes": self.read_parameters,
            "written_bytes": self.written,
            "library_outputs": self.library_outputs,
        }


def _tensors(values: Any) -> list:
    import torch
    from torch.utils._pytree import tree_flatten

    return [v for v in tree_flatten(values)[0] if isinstance(v, torch.Tensor)]


def _nbytes(tensor) -> int:
    return min(tensor.numel() * tensor.element_size(), tensor.untyped_storage().nbytes())


class _Flow:
    """Where each storage came from, and what outside work read and wrote of it."""

    def __init__(self):
        self.origin: dict[int, str] = {}
        self.size: dict[int, int] = {}
        self.read: dict[int, str] = {}  # storage -> the origin it had when outside work read it
        self.written: set[int] = set()
        self.keep: list = []  # every tensor seen stays alive: a storage id is never reused

    def key(self, tensor) -> int:
        from torch.multiprocessing.reductions import StorageWeakRef

        self.keep.append(tensor)
        key = StorageWeakRef(tensor.untyped_storage()).cdata
        self.size[key] = max(self.size.get(key, 0), _nbytes(tensor))
        return key

    def produced(self, tensors: Iterable, origin: str) -> None:
        for t in tensors:
            self.origin[self.key(t)] = origin

    def library_call(self, args: Iterable, outputs: Iterable) -> None:
        for t in args:
            key = self.key(t)
            if self.origin.get(key, OTHER) == OTHER:
                self.written.add(key)  # outside work made what the library reads
        self.produced(outputs, LIBRARY)

    def other_call(self, args: Iterable, outputs: Iterable) -> None:
        for t in args:
            key = self.key(t)
            origin = self.origin.get(key, OTHER)
            if origin != OTHER:
                self.read.setdefault(key, origin)
        self.produced(outputs, OTHER)

    def floor(self, outputs: Iterable, library_outputs: list[dict]) -> Floor:
        for t in outputs:
            key = self.key(t)
            if self.origin.get(key, OTHER) == OTHER:
                self.written.add(key)
        found = Floor(library_outputs=library_outputs)
        for key, origin in self.read.items():
            attr = {LIBRARY: "read_library", INPUT: "read_inputs", PARAMETER: "read_parameters"}
            setattr(found, attr[origin], getattr(found, attr[origin]) + self.size[key])
        found.written = sum(self.size[k] for k in self.written)
        return found


def _spy_mode(flow: _Flow, library_outputs: list[dict]):
    from torch.utils._python_dispatch import TorchDispatchMode

    class Spy(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            inputs, outputs = _tensors((args, kwargs)), _tensors(out)
            if func.is_view or not outputs:
                return out  # a view (the same storage) or a query (prim.device): no bytes
            if func._overloadpacket.__name__ in LIBRARY_OPS:
                flow.library_call(inputs, outputs)
                library_outputs.extend(
                    {"op": str(func._overloadpacket), "shape": list(t.shape), "bytes": _nbytes(t)}
                    for t in outputs
                )
            else:
                flow.other_call(inputs, outputs)
            return out

    return Spy()


def task_floor(module, semantics: str = "kernelbench") -> Floor:
    """The floor of the task defined by `module` (a KernelBench task file, imported): its
    Model built from get_init_inputs(), called on get_inputs(), all under FakeTensorMode.
    Semantics `kernelbench` leaves the model in training mode (as the evaluator does),
    `eval` calls .eval(). Raises what the fake forward raises."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    flow, library_outputs = _Flow(), []
    with FakeTensorMode(allow_non_fake_inputs=True), torch.no_grad():
        model = module.Model(*module.get_init_inputs())
        model = model.train() if semantics == "kernelbench" else model.eval()
        inputs = list(module.get_inputs())
        flow.produced(_tensors(inputs), INPUT)
        flow.produced([*model.parameters(), *model.buffers()], PARAMETER)
        with _spy_mode(flow, library_outputs):
            output = model(*inputs)
    return flow.floor(_tensors(output), library_outputs)


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def record_floor(checkout: str | Path, rec: Mapping) -> tuple[dict | None, str | None]:
    """(floor as a dict, None) of the task a survey record names, read from the pinned
    checkout (KernelBench/level{level}/{file}, which must still have the record's sha256);
    (None, why) when it cannot be had."""
    from kbfuse.tasks.kernelbench import import_task_file

    path = Path(checkout) / "KernelBench" / f"level{rec['level']}" / rec["file"]
    if not path.is_file():
        return None, f"no floor: {path.name} is not at the checkout"
    if _sha256(path) != rec["sha256"]:
        return None, f"no floor: {path.name} at the checkout is not the surveyed file"
    try:
        module = import_task_file(path, int(rec["task"]), rec["sha256"])
        return task_floor(module, rec.get("semantics", "kernelbench")).as_dict(), None
    except Exception as exc:  # noqa: BLE001 - the table says why, the other tasks go on
        cause = exc.__cause__ or exc  # an import's own error, not the message naming its path
        message = str(cause).strip().splitlines()
        return None, f"no floor: {type(cause).__name__}: {message[0][:200] if message else ''}"


def floor_record(checkout: str | Path, pin_path: str | Path, semantics: str) -> dict[str, Any]:
    """The `survey_floor` record of the one task a survey pin names: its floor (null, and the
    problem, when it has none), with what the summary matches against that task's survey
    records: the level, the file and its sha256, the semantics."""
    from kbfuse.survey.tasks import read_survey_pin

    pin, task = read_survey_pin(pin_path)
    entry = pin["tasks"][str(task)]
    named = {
        "task": task,
        "level": int(pin["level"]),
        "file": Path(entry["path"]).name,
        "sha256": entry["sha256"],
        "semantics": semantics,
    }
    found, problem = record_floor(checkout, named)
    if found is not None:
        found = {**found, "library_outputs": grouped_outputs(found["library_outputs"])}
    return {"kind": KIND, "schema_version": SCHEMA_VERSION, **named, "floor": found,
            "problem": problem}  # fmt: skip


def grouped_outputs(library_outputs: Iterable[Mapping]) -> list[dict[str, Any]]:
    """The library outputs with each (op, shape) once and its `count`, in the order first
    seen: a recurrent layer's 512 steps make thousands of identical GEMM outputs."""
    groups: dict[tuple, dict[str, Any]] = {}
    for out in library_outputs:
        key = (out["op"], tuple(out["shape"]))
        if key in groups:
            groups[key]["count"] += 1
        else:
            groups[key] = {**out, "count": 1}
    return list(groups.values())


def main(argv: list[str] | None = None) -> int:
    import argparse
    import json

    from kbfuse.tasks.kernelbench import import_task_file

    parser = argparse.ArgumentParser(description="one KernelBench task's memory floor")
    parser.add_argument("checkout", type=Path, help="a KernelBench checkout")
    parser.add_argument("level", type=int)
    parser.add_argument("task", type=int)
    parser.add_argument("--semantics", default="kernelbench", choices=["kernelbench", "eval"])
    parser.add_argument("--gbps", type=float, help="copy bandwidth (GB/s) for floor_ms")
    args = parser.parse_args(argv)
    found = sorted((args.checkout / "KernelBench" / f"level{args.level}").glob(f"{args.task}_*.py"))
    if len(found) != 1:
        parser.error(f"level {args.level} of {args.checkout} has no single file for {args.task}")
    module = import_task_file(found[0], args.task, _sha256(found[0]))
    result = {"file": found[0].name, **task_floor(module, args.semantics).as_dict()}
    if args.gbps:
        result["floor_ms"] = result["floor_bytes"] / (args.gbps * 1e9) * 1e3
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
