"""FLOPs and bytes of one forward, from PyTorch's own counters (no hand formulas).

`torch.utils.flop_counter.FlopCounterMode` counts the FLOPs of the ops it has formulas for
(matmuls, convolutions, attention); pointwise ops count zero. `main_op` is the op with the
most FLOPs (null when none is counted). Bytes are the sizes of the input tensors, the output
and the module's parameters and buffers.
"""

from __future__ import annotations

from collections.abc import Callable


def count(run: Callable[[], object]) -> dict:
    """The record's `flops` block for the zero-argument forward `run`."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with torch.no_grad(), counter:
        run()
    by_op = {str(op): int(n) for op, n in counter.get_flop_counts().get("Global", {}).items() if n}
    main = max(by_op, key=by_op.get) if by_op else None
    return {"total": int(counter.get_total_flops()), "by_op": by_op, "main_op": main}


def _nbytes(tensors) -> int:
    return int(sum(t.numel() * t.element_size() for t in tensors))


def sizes(model, inputs: list, output) -> dict:
    """The record's `bytes` block."""
    import torch

    state = list(model.parameters()) + list(model.buffers())
    return {
        "inputs": _nbytes(x for x in inputs if isinstance(x, torch.Tensor)),
        "output": _nbytes([output]) if isinstance(output, torch.Tensor) else 0,
        "parameters": _nbytes(state),
    }
