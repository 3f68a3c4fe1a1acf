"""The exhaustive control: every float32 bit pattern through each fused tail, against eager.

A tail is a pointwise function of one float (task 95: of one float after the add), so running
all 2^32 bit patterns through the kernel and through the model's own eager tail and comparing
the output bits decides bit-identity for every input the tail can ever see, not only for the
sampled cases. For task 95 the add parameter is set to -0.0, the one value for which
`x + add == x` bit for bit for every x (-0.0 included), so the patterns reach the rest of the
tail unchanged; the add itself is one IEEE addition in both.

Outputs are compared as raw bits. Two NaNs with different payloads are counted apart
(`nan_payload_only`): IEEE does not fix NaN payloads and torch.allclose treats all NaNs alike,
but a bit-identical claim has to show them.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from typing import Any

from kbfuse import launch

PATTERNS = 1 << 32
CHUNK_BITS = 28  # 2^28 patterns (1 GiB of float32) per launch
EXAMPLES = 4


def _tail_model_with_identity_operands(model, tail):
    """A copy of the model whose non-linear parameters are -0.0 (x + -0.0 == x, bit for bit)."""
    import torch

    model = copy.deepcopy(model)
    linear_prefix = tail.linear_attr + "."
    with torch.no_grad():
        for name, param in model.named_parameters():
            if not name.startswith(linear_prefix):
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


def exhaustive_control(
    model,
    tail,
    modules: Mapping[str, Any],
    say: Callable[[str], None],
    chunk_bits: int = CHUNK_BITS,
    patterns: int = PATTERNS,
) -> dict:
    """Per variant: how many of the `patterns` inputs give other output bits than eager."""
    import torch

    from kbfuse.numerics import f32_bits_hex

    tail_model = _tail_model_with_identity_operands(model, tail)
    cols = int(tail.linear(tail_model).out_features)
    chunk = max(cols, (1 << chunk_bits) // cols * cols)
    counts = {v: {"differ": 0, "nan_payload_only": 0, "examples": []} for v in modules}
    with torch.no_grad():
        for first in range(0, patterns, chunk):
            count = min(chunk, patterns - first)
            rows = bit_patterns(first, count, cols)
            reference_rows = tail.reference(tail_model, rows)
            out_rows = torch.empty_like(rows)
            x, reference, out = (t.view(-1)[:count] for t in (rows, reference_rows, out_rows))
            for variant, module in modules.items():
                launch.run_tail(module, tail, tail_model, rows, out_rows)
                differ, nan_only, real = compare_bits(reference, out)
                entry = counts[variant]
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
            del rows, reference_rows, out_rows, x, reference, out
    del tail_model
    torch.cuda.empty_cache()
    result = {}
    for variant, entry in counts.items():
        result[variant] = {
            "inputs": patterns,
            **entry,
            "bit_identical": entry["differ"] == 0 and entry["nan_payload_only"] == 0,
        }
        say(
            f"exhaustive {variant}: {entry['differ']} of {patterns} inputs differ from eager "
            f"({entry['nan_payload_only']} more only in a NaN payload)"
        )
    return result
