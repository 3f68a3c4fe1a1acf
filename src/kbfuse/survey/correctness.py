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

from collections.abc import Mapping, Sequence

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


def compare(trials: Sequence[tuple], contract: Mapping) -> dict:
    """The record's `correctness` block of one baseline: `trials` holds (eager's output, the
    baseline's output) per official trial, in trial order."""
    from kbfuse.checks import official
    from kbfuse.checks.numerics import bit_equal_count

    if not trials:
        raise KbfuseError("a baseline's correctness needs at least one official trial")
    reversed_order = dict(contract, argument_order=list(reversed(contract["argument_order"])))
    failed, reference_scaled, not_bit_equal, numel, abs_errors, rel_errors = [], True, 0, 0, [], []
    for index, (reference, candidate) in enumerate(trials):
        _check_output(reference, candidate)
        candidate = candidate.to(reference.device)
        if not official.passes(reference, candidate, contract):
            failed.append(index)
        reference_scaled &= official.passes(reference, candidate, reversed_order)
        numel += int(reference.numel())
        not_bit_equal += int(reference.numel()) - bit_equal_count(reference, candidate)
        max_abs, max_rel = _errors(reference, candidate)
        abs_errors.append(max_abs)
        rel_errors.append(max_rel)
    scale_first = contract["argument_order"][1] == "candidate"
    return {
        "official_pass": not failed,
        **official.tolerance(contract),
        "compared": f"eager on KernelBench's {len(trials)} official trials",
        "trials": len(trials),
        "failed_trials": failed,
        "numel": numel,
        "not_bit_equal": not_bit_equal,
        "max_abs": _nan_max(abs_errors),
        "max_rel": _nan_max(rel_errors),
        "direction": {
            "candidate_scaled_pass": not failed if scale_first else reference_scaled,
            "reference_scaled_pass": reference_scaled if scale_first else not failed,
        },
    }


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
