"""The official check, applied: one place where every judge of kbfuse asks "does this pass?".

The contract is the `kernelbench_contract` record (kbfuse.tasks.evaluator reads it from the
pinned KernelBench's evaluator): tolerance, argument order, seed, trial count and trial
seeds. The study's correctness stages, the survey (its baselines and blind spots) and
`kbfuse check` (the candidate's cases and the task's trivial candidates) all call `passes`
with it, so a pin with another tolerance changes every judge at once.

Inputs are drawn as the evaluator draws them (`set_seed` = `torch.manual_seed` and
`torch.cuda.manual_seed`):
  instance       set_seed(seed); init = get_init_inputs(); set_seed(seed); Model(*init),
                 then moved to the device as float32;
  trial inputs   per trial seed t: set_seed(t); get_inputs(), tensors cast to float32 and moved;
                 the reference is called after set_seed(t), the candidate right after it;
  timing inputs  set_seed(seed); get_inputs() (the evaluator's performance measurement).
Drawing the correctness inputs under the weights' own seed would replay the weights' random
stream (task 9: input row i a shifted copy of weight row i), which is not what is judged.

A trivial candidate (zeros, one constant, the input itself) that passes every official trial
makes the task a blind spot: its official check proves little there.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from kbfuse.errors import KbfuseError

CONTRACT_KEYS = ("atol", "rtol", "argument_order", "seed", "trials")
TRIVIAL = ("zeros", "mean_constant", "input_identity")


def check_contract(contract: Any, where: str = "contract") -> dict:
    """The contract's keys this module uses, checked; KbfuseError naming the first bad one."""
    from kbfuse.checks.numerics import check_tolerance

    if not isinstance(contract, Mapping):
        raise KbfuseError(f"{where} is not a mapping (a kernelbench_contract record)")
    missing = [k for k in CONTRACT_KEYS if k not in contract]
    if missing:
        raise KbfuseError(f"{where} lacks {missing} (a kernelbench_contract record)")
    check_tolerance(contract["atol"], contract["rtol"])
    if sorted(map(str, contract["argument_order"])) != ["candidate", "reference"]:
        raise KbfuseError(f"{where}: argument_order is {contract['argument_order']!r}")
    for key in ("seed", "trials"):
        value = contract[key]
        if isinstance(value, bool) or not isinstance(value, int) or value < (key == "trials"):
            raise KbfuseError(f"{where}: {key} is {value!r}")
    return dict(contract)


def tolerance(contract: Mapping) -> dict[str, float]:
    """{"atol", "rtol", "source"}: what records name beside each verdict."""
    source = contract.get("tolerance_source") or {}
    return {
        "atol": float(contract["atol"]),
        "rtol": float(contract["rtol"]),
        "source": source.get("atol") if isinstance(source, Mapping) else None,
    }


def passes(reference, candidate, contract: Mapping) -> bool:
    """The official predicate: same shape and float32, then `torch.allclose` with the pinned
    tolerance in the pinned argument order (the second argument scales the relative term)."""
    import torch

    from kbfuse.checks.numerics import historical_allclose, official_allclose

    if not isinstance(candidate, torch.Tensor) or candidate.shape != reference.shape:
        return False
    if candidate.dtype != torch.float32 or reference.dtype != torch.float32:
        return False
    candidate = candidate.to(reference.device)
    reference_first = list(contract["argument_order"]) == ["reference", "candidate"]
    allclose = official_allclose if reference_first else historical_allclose
    return allclose(reference, candidate, contract["atol"], contract["rtol"])


def set_seed(seed: int) -> None:
    """The evaluator's set_seed: torch.manual_seed, then torch.cuda.manual_seed."""
    import torch

    torch.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed(seed)


def trial_seeds(contract: Mapping, trials: int | None = None) -> list[int]:
    """The evaluator's correctness trial seeds: manual_seed(seed), then one randint each."""
    import torch

    count = contract["trials"] if trials is None else trials
    low = int(contract.get("trial_seed_low", 0))
    high = int(contract.get("trial_seed_high", 2**32 - 1))
    torch.manual_seed(contract["seed"])
    return [int(torch.randint(low, high, (1,)).item()) for _ in range(count)]


def to_device(values: Sequence, device: str) -> list:
    """The evaluator's input processing: tensors cast to float32 and moved; others as given."""
    import torch

    return [
        v.to(dtype=torch.float32).to(device=device) if isinstance(v, torch.Tensor) else v
        for v in values
    ]


def instance(module, seed: int, device: str, model_class=None):
    """The task's model built as the evaluator builds it (module: the task's namespace)."""
    import torch

    set_seed(seed)
    init = to_device(list(module.get_init_inputs()), device)
    set_seed(seed)
    with torch.no_grad():
        model = (model_class or module.Model)(*init)
    return model.to(device=device, dtype=torch.float32)


def inputs(module, seed: int, device: str) -> list:
    """get_inputs() under set_seed(seed), processed as the evaluator does."""
    set_seed(seed)
    return to_device(list(module.get_inputs()), device)


def reference_call(forward: Callable, values: Sequence, seed: int):
    """The reference's output of one trial: set_seed(trial seed), then the call (a forward
    that draws random numbers, like dropout, sees the evaluator's generator state)."""
    import torch

    set_seed(seed)
    with torch.no_grad():
        return forward(*values)


def trivial_candidates(reference, values: Sequence, constant: float) -> dict[str, Any]:
    """name -> the trivial candidate's output for one trial (None where not applicable)."""
    import torch

    same = [
        v for v in values
        if isinstance(v, torch.Tensor) and v.shape == reference.shape and v.dtype == reference.dtype
    ]  # fmt: skip
    return {
        "zeros": torch.zeros_like(reference),
        "mean_constant": torch.full_like(reference, constant),
        "input_identity": same[0].to(reference.device, reference.dtype) if same else None,
    }


class TrivialStatus:
    """Does a trivial candidate pass the official check, every trial? Gathered one official
    trial at a time (`add`: the reference output and the trial's inputs, in trial order). The
    constant candidate is the mean of the first trial's reference output (one fixed value, as
    a cached constant would be)."""

    def __init__(self, contract: Mapping):
        self.contract = contract
        self.passed = {name: True for name in TRIVIAL}
        self.applicable = {name: True for name in TRIVIAL}
        self.constant: float | None = None
        self.count = 0

    def add(self, reference, values: Sequence) -> None:
        if self.constant is None:
            first = reference.detach().double()
            self.constant = float(first.mean().item()) if first.numel() else 0.0
        self.count += 1
        for name, candidate in trivial_candidates(reference, values, self.constant).items():
            if candidate is None:
                self.applicable[name] = False
            elif not passes(reference, candidate, self.contract):
                self.passed[name] = False

    def result(self) -> dict:
        if not self.count:
            raise KbfuseError("trivial_status needs at least one official trial")
        applicable, passed = self.applicable, self.passed
        status: dict[str, Any] = {
            name: {
                "applicable": applicable[name],
                "passes": passed[name] if applicable[name] else None,
            }
            for name in TRIVIAL
        }
        status["mean_constant"]["value"] = self.constant
        status["compared"] = f"eager output on KernelBench's {self.count} official trials"
        status["trials"] = self.count
        status["blind_spot"] = any(status[name]["passes"] for name in TRIVIAL)
        return status


def trivial_status(trials: Iterable[tuple[Any, Sequence]], contract: Mapping) -> dict:
    """TrivialStatus over `trials`: (reference output, inputs) per official trial, in trial
    order (read once, one trial at a time)."""
    status = TrivialStatus(contract)
    for reference, values in trials:
        status.add(reference, values)
    return status.result()
