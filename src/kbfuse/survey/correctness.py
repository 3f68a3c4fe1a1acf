"""Correctness of one baseline against eager, as KernelBench's evaluator judges a candidate.

The baseline is the candidate, eager the reference, on KernelBench's official trials (each
trial's inputs drawn under its trial seed, eager called after `set_seed(trial seed)` and the
baseline right after it; kbfuse.checks.official). `official_pass` holds when every trial
passes the pinned predicate (`kbfuse.checks.official.passes`: the pinned tolerance and
argument order, from the `kernelbench_contract` record). The direction audit of the study
records both readings over the same trials: `candidate_scaled_pass` (|candidate| scales the
relative term, as torch.allclose(reference, candidate) does) and `reference_scaled_pass`; a
baseline whose verdict depends on the direction sits on the tolerance's edge. Beside the
verdicts, over all trials: how many elements are not bit-equal, the largest absolute
difference and the largest relative difference |ref - cand| / |ref| over the elements where
ref != 0 (non-finite values are written as the strings "nan"/"inf", kbfuse.io.jsonable).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from kbfuse.errors import KbfuseError


def _check_output(reference, candidate) -> None:
    import torch

    if not isinstance(candidate, torch.Tensor):
        raise KbfuseError(f"the output is a {type(candidate).__name__}, not a tensor")
    if candidate.dtype != torch.float32 or reference.dtype != torch.float32:
        raise KbfuseError(
            f"outputs must be float32 (reference {reference.dtype}, candidate {candidate.dtype})"
        )
    if candidate.shape != reference.shape:
        raise KbfuseError(
            f"output shape {tuple(candidate.shape)} differs from eager's {tuple(reference.shape)}"
        )


def _errors(reference, candidate) -> tuple[float, float]:
    import torch

    with torch.no_grad():
        diff = (reference.double() - candidate.double()).abs()
        nonzero = reference != 0
        rel = diff[nonzero] / reference.double().abs()[nonzero]
        max_abs = float(diff.max().item()) if diff.numel() else 0.0
        max_rel = float(rel.max().item()) if rel.numel() else 0.0
    return max_abs, max_rel


def _nan_max(values: list[float]) -> float:
    """The largest value; NaN if any is NaN (a NaN error must not hide behind a number)."""
    return max(values, key=lambda v: (v != v, v)) if values else 0.0


class Comparison:
    """One baseline's `correctness` block, gathered one official trial at a time (`add`, in
    trial order), so a trial's outputs can be dropped before the next is made."""

    def __init__(self, contract: Mapping):
        self.contract = contract
        self.reversed_order = dict(
            contract, argument_order=list(reversed(contract["argument_order"]))
        )
        self.trials = 0
        self.failed: list[int] = []
        self.reference_scaled = True
        self.not_bit_equal = 0
        self.numel = 0
        self.abs_errors: list[float] = []
        self.rel_errors: list[float] = []

    def add(self, reference, candidate) -> None:
        from kbfuse.checks import official
        from kbfuse.checks.numerics import bit_equal_count

        _check_output(reference, candidate)
        candidate = candidate.to(reference.device)
        if not official.passes(reference, candidate, self.contract):
            self.failed.append(self.trials)
        self.reference_scaled &= official.passes(reference, candidate, self.reversed_order)
        self.numel += int(reference.numel())
        self.not_bit_equal += int(reference.numel()) - bit_equal_count(reference, candidate)
        max_abs, max_rel = _errors(reference, candidate)
        self.abs_errors.append(max_abs)
        self.rel_errors.append(max_rel)
        self.trials += 1

    def result(self) -> dict:
        from kbfuse.checks import official

        if not self.trials:
            raise KbfuseError("a baseline's correctness needs at least one official trial")
        failed = self.failed
        scale_first = self.contract["argument_order"][1] == "candidate"
        return {
            "official_pass": not failed,
            **official.tolerance(self.contract),
            "compared": f"eager on KernelBench's {self.trials} official trials",
            "trials": self.trials,
            "failed_trials": failed,
            "numel": self.numel,
            "not_bit_equal": self.not_bit_equal,
            "max_abs": _nan_max(self.abs_errors),
            "max_rel": _nan_max(self.rel_errors),
            "direction": {
                "candidate_scaled_pass": not failed if scale_first else self.reference_scaled,
                "reference_scaled_pass": self.reference_scaled if scale_first else not failed,
            },
        }


def compare(trials: Iterable[tuple], contract: Mapping) -> dict:
    """The record's `correctness` block of one baseline: `trials` holds (eager's output, the
    baseline's output) per official trial, in trial order."""
    comparison = Comparison(contract)
    for reference, candidate in trials:
        comparison.add(reference, candidate)
    return comparison.result()


def output_stats(output) -> dict:
    """The record's `output` block: shape, dtype and magnitude statistics of eager's output."""
    import torch

    if not isinstance(output, torch.Tensor):
        raise KbfuseError(f"the task's forward returns a {type(output).__name__}, not a tensor")
    values = output.detach().double()
    empty = values.numel() == 0
    return {
        "shape": list(output.shape),
        "dtype": str(output.dtype).removeprefix("torch."),
        "mean": 0.0 if empty else float(values.mean().item()),
        "std": 0.0 if values.numel() < 2 else float(values.std().item()),
        "abs_mean": 0.0 if empty else float(values.abs().mean().item()),
        "abs_max": 0.0 if empty else float(values.abs().max().item()),
    }
