"""The exhaustive control: every float32 bit pattern through each fused tail, against eager.

A pointwise tail is a function of one float (task 95: of one float after the add; task 4: after
the convolution's bias add), so running all 2^32 bit patterns through the kernel and through
the model's own eager tail and comparing the output bits decides bit-identity for every input
the tail can ever see, not only for the sampled cases. The parameters the tail adds first
(`Tail.tail_parameters`: task 95's add parameter, task 4's bias) are set to -0.0, the one value
for which `x + add == x` bit for bit for every x (-0.0 included), so the patterns reach the
rest of the tail unchanged; the add itself is one IEEE addition in both. The patterns are laid
out as the tail's input (`Tail.control_input`: rows of a linear output, or (rows, channels, h,
w) after a convolution). A tail that reduces has no such map from one input to one output: the
control does not apply to it (kbfuse.checks.contract holds it to another contract).

Before each variant's launch its output buffer (fresh for every variant, so nothing carries
over from the variant before) is filled with a sentinel bit pattern, a NaN with a payload no
arithmetic produces; elements that still hold it afterwards were never written and are counted
(`unwritten`). An element whose eager output is the sentinel pattern itself (only the input
with that payload, passed through) cannot be told apart and is not counted.

Outputs are compared as raw bits. Two NaNs with different payloads are counted apart
(`nan_payload_only`): IEEE does not fix NaN payloads and torch.allclose treats all NaNs alike,
but a bit-identical claim has to show them.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from typing import Any

from kbfuse.compilation import launch
from kbfuse.errors import KbfuseError

PATTERNS = 1 << 32
SENTINEL_BITS = 0x7FA5A5A5  # a quiet NaN with a payload that no float operation creates
CHUNK_BITS = 28  # 2^28 patterns (1 GiB of float32) per launch
EXAMPLES = 4


def _tail_model_with_identity_operands(model, tail):
    """A copy of the model whose tail parameters are -0.0 (x + -0.0 == x, bit for bit)."""
    import torch

    model = copy.deepcopy(model)
    with torch.no_grad():
        for param in tail.tail_parameters(model).values():
            param.fill_(-0.0)
    return model


def bit_patterns(first: int, count: int, cols: int, device: str = "cuda"):
    """float32 rows of `cols` holding the bit patterns first .. first + count - 1 in order; a
    last partial row is filled up with the patterns that follow (mod 2^32)."""
    import torch

    rows = -(-count // cols)
    bits = torch.arange(first, first + rows * cols, dtype=torch.int64, device=device) % PATTERNS
    signed = torch.where(bits >= 1 << 31, bits - PATTERNS, bits).to(torch.int32)
    return signed.view(torch.float32).view(rows, cols)


def compare_bits(reference, candidate) -> tuple[int, int, Any]:
    """(differing, NaN-payload-only differing, mask of differing non-NaN-pair elements)."""
    import torch

    differ = reference.view(torch.int32) != candidate.view(torch.int32)
    both_nan = torch.isnan(reference) & torch.isnan(candidate)
    real = differ & ~both_nan
    return int(differ.sum()), int((differ & both_nan).sum()), real


def unwritten(reference, candidate) -> int:
    """Elements of `candidate` still holding the sentinel where eager's output does not."""
    import torch

    still = candidate.view(torch.int32) == SENTINEL_BITS
    return int((still & (reference.view(torch.int32) != SENTINEL_BITS)).sum())


def sentinel_like(rows):
    """A fresh buffer shaped like `rows`, every element the sentinel pattern."""
    import torch

    return torch.full(rows.shape, SENTINEL_BITS, dtype=torch.int32, device=rows.device).view(
        torch.float32
    )


def exhaustive_control(
    model,
    tail,
    modules: Mapping[str, Any],
    say: Callable[[str], None],
    chunk_bits: int = CHUNK_BITS,
    patterns: int = PATTERNS,
    device: str = "cuda",
) -> dict:
    """Per variant: how many of the `patterns` inputs give other output bits than eager."""
    import torch

    from kbfuse.checks.numerics import f32_bits_hex

    if not tail.pointwise:
        raise KbfuseError(
            f"task {tail.task}: the exhaustive control runs pointwise tails only (this one "
            "reduces; its contract is kbfuse.checks.contract's)"
        )
    tail_model = _tail_model_with_identity_operands(model, tail)
    cols = int(tail.control_columns(tail_model))
    chunk = max(cols, (1 << chunk_bits) // cols * cols)
    counts = {
        v: {"differ": 0, "nan_payload_only": 0, "unwritten": 0, "examples": []} for v in modules
    }
    with torch.no_grad():
        for first in range(0, patterns, chunk):
            count = min(chunk, patterns - first)
            rows = tail.control_input(tail_model, bit_patterns(first, count, cols, device))
            reference_rows = tail.reference(tail_model, rows)
            x, reference = (t.view(-1)[:count] for t in (rows, reference_rows))
            for variant, module in modules.items():
                out_rows = sentinel_like(rows)
                launch.run_tail(module, tail, tail_model, rows, out_rows)
                out = out_rows.view(-1)[:count]
                differ, nan_only, real = compare_bits(reference, out)
                entry = counts[variant]
                entry["unwritten"] += unwritten(reference, out)
                entry["differ"] += differ - nan_only
                entry["nan_payload_only"] += nan_only
                if differ - nan_only and len(entry["examples"]) < EXAMPLES:
                    for index in real.nonzero()[: EXAMPLES - len(entry["examples"])]:
                        at = int(index)
                        entry["examples"].append(
                            {
                                "input": f32_bits_hex(x[at]),
                                "eager": f32_bits_hex(reference[at]),
                                "kernel": f32_bits_hex(out[at]),
                            }
                        )
                del out_rows, out
            del rows, reference_rows, x, reference
    del tail_model
    torch.cuda.empty_cache()
    result = {}
    for variant, entry in counts.items():
        result[variant] = {
            "inputs": patterns,
            **entry,
            "bit_identical": entry["differ"] == 0
            and entry["nan_payload_only"] == 0
            and entry["unwritten"] == 0,
        }
        say(
            f"exhaustive {variant}: {entry['differ']} of {patterns} inputs differ from eager "
            f"({entry['nan_payload_only']} more only in a NaN payload), "
            f"{entry['unwritten']} never written"
        )
    return result
