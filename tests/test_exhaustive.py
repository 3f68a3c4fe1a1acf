"""The exhaustive control's CPU parts: the bit patterns, the comparison, the identity operand."""

from __future__ import annotations

import math

import torch

from kbfuse.checks import exhaustive
from kbfuse.checks.exhaustive import (
    PATTERNS,
    _tail_model_with_identity_operands,
    bit_patterns,
    compare_bits,
)
from kbfuse.checks.numerics import f32_bits_hex
from kbfuse.tasks.tails import TAILS


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


class Model81(torch.nn.Module):
    """Task 81's program (as in the pinned file) on a small linear layer."""

    def __init__(self):
        super().__init__()
        self.gemm = torch.nn.Linear(4, 16)

    def forward(self, x):
        x = self.gemm(x)
        x = x * torch.sigmoid(x)
        x = torch.clamp(x / 2.0, min=-1.0, max=1.0)
        return torch.clamp(torch.tanh(x), min=-1.0, max=1.0)


def fake_kernels(monkeypatch, skip_last: set[str]):
    """launch.run_tail on the CPU: the eager tail written into `out`, except that a module named
    in `skip_last` leaves the last column of every row unwritten."""

    def run_tail(module, tail, model, y, out):
        result = tail.reference(model, y)
        columns = out.shape[1] - 1 if module in skip_last else out.shape[1]
        out[:, :columns] = result[:, :columns]
        return out

    monkeypatch.setattr(exhaustive.launch, "run_tail", run_tail)


def test_unwritten_elements_are_counted_and_never_inherited(monkeypatch):
    """A kernel that skips writes after one that wrote everything correctly: with a shared,
    unfilled output it would inherit the right bits; with a fresh sentinel buffer it cannot."""
    fake_kernels(monkeypatch, skip_last={"lazy"})
    modules = {"exact": "exact", "lazy": "lazy"}
    lines = []
    result = exhaustive.exhaustive_control(
        Model81(), TAILS[81], modules, lines.append, chunk_bits=10, patterns=1 << 12, device="cpu"
    )
    assert result["exact"] == {
        "inputs": 1 << 12,
        "differ": 0,
        "nan_payload_only": 0,
        "unwritten": 0,
        "examples": [],
        "bit_identical": True,
    }
    lazy = result["lazy"]
    assert lazy["unwritten"] == (1 << 12) // 16  # one element in every row of 16
    assert lazy["bit_identical"] is False
    # the sentinel is a NaN where eager has a number: counted as differing, with examples
    assert lazy["differ"] == (1 << 12) // 16 and lazy["examples"][0]["kernel"] == "0x7fa5a5a5"
    assert "256 never written" in lines[-1]


def test_unwritten_ignores_an_eager_output_equal_to_the_sentinel():
    sentinel = torch.tensor([exhaustive.SENTINEL_BITS, 0], dtype=torch.int32).view(torch.float32)
    written = torch.tensor([1.0, 2.0])
    assert exhaustive.unwritten(written, sentinel) == 1
    assert exhaustive.unwritten(sentinel, sentinel) == 0  # eager gives the pattern itself
    assert exhaustive.sentinel_like(torch.zeros(2, 3)).view(torch.int32).unique().tolist() == [
        exhaustive.SENTINEL_BITS
    ]
