"""The exhaustive control's CPU parts: the bit patterns, the comparison, the identity operand."""

from __future__ import annotations

import math

import torch

from kbfuse.exhaustive import (
    PATTERNS,
    _tail_model_with_identity_operands,
    bit_patterns,
    compare_bits,
)
from kbfuse.numerics import f32_bits_hex
from kbfuse.tails import TAILS


def test_bit_patterns_enumerate_in_order_and_wrap_a_partial_row():
    rows = bit_patterns(0, 10, 4, device="cpu")
    assert rows.shape == (3, 4) and rows.dtype == torch.float32
    flat = rows.reshape(-1).view(torch.int32).tolist()
    assert flat == list(range(12))
    top = bit_patterns(PATTERNS - 3, 3, 4, device="cpu").reshape(-1)
    expected = ["0xfffffffd", "0xfffffffe", "0xffffffff", "0x00000000"]
    assert [f32_bits_hex(v) for v in top] == expected
    middle = bit_patterns(0x7F800000, 2, 2, device="cpu").reshape(-1)
    assert middle[0].item() == math.inf and math.isnan(middle[1].item())
    assert f32_bits_hex(bit_patterns(0x80000000, 1, 1, device="cpu")[0, 0]) == "0x80000000"


def test_compare_bits_counts_nan_payloads_apart():
    quiet = torch.tensor([0x7FC00000], dtype=torch.int32).view(torch.float32)
    other = torch.tensor([0x7FC00001], dtype=torch.int32).view(torch.float32)
    reference = torch.cat([torch.tensor([1.0, -0.0, 2.0]), quiet])
    candidate = torch.cat([torch.tensor([1.0, 0.0, 2.0]), other])
    differ, nan_only, real = compare_bits(reference, candidate)
    assert (differ, nan_only) == (2, 1)  # -0.0 vs 0.0 is a real difference
    assert real.tolist() == [False, True, False, False]


def test_identity_operands_leave_every_value_unchanged():
    class Model95(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.matmul = torch.nn.Linear(4, 8)
            self.add_value = torch.nn.Parameter(torch.randn(8))

        def forward(self, x):
            return self.matmul(x) + self.add_value

    model = Model95()
    copy = _tail_model_with_identity_operands(model, TAILS[95])
    assert f32_bits_hex(copy.add_value[0]) == "0x80000000"  # -0.0
    assert torch.equal(copy.matmul.weight, model.matmul.weight)
    assert not torch.equal(model.add_value, copy.add_value)  # the original is untouched
    values = bit_patterns(0, 1 << 16, 8, device="cpu")
    values = torch.cat([values, bit_patterns(0x80000000, 1 << 16, 8, device="cpu")])
    with torch.no_grad():
        added = values + copy.add_value
    assert torch.equal(added.view(torch.int32), values.view(torch.int32))
