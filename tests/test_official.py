"""The official check applied (kbfuse.checks.official), held against the evaluator source the
contract is read from: tests/kbrepo.py's KernelBench-shaped evaluator, run on the CPU.

- the predicate: the pinned tolerance and argument order; shape and dtype first;
- the draws: KernelBench's seeds, trial seeds and order of seeding, model construction and
  `get_inputs()`; a model kbfuse builds is the evaluator's own, bit for bit;
- one contract for every judge: a 0.3 %-off candidate fails at the pin's 1e-4 and passes at
  v0.1's 1e-2, for the evaluator and for kbfuse alike; an exact one passes both.
"""

from __future__ import annotations

import types

import pytest
import torch
from contracts import contract, contract_record
from kbrepo import TASK_FILES, evaluator_files

from kbfuse.checks import official
from kbfuse.errors import KbfuseError

TASK53 = TASK_FILES[53][1]


def run_evaluator(task_source: str, candidate_source: str, tolerance="1e-4", trials=5) -> bool:
    """The test evaluator's verdict (eval_kernel_against_ref, every trial passed)."""
    namespace: dict = {}
    exec(evaluator_files(tolerance)["src/kernelbench/eval.py"], namespace)  # noqa: S102
    return namespace["eval_kernel_against_ref"](
        task_source, candidate_source, num_correct_trials=trials
    )


def module_of(source: str) -> types.ModuleType:
    module = types.ModuleType("task")
    exec(source, module.__dict__)  # noqa: S102
    return module


def f32(*values):
    return torch.tensor(values, dtype=torch.float32)


def test_passes_uses_the_pinned_tolerance_and_argument_order():
    ref, cand = f32(1.0), f32(1.0201)  # 0.0201 <= 0.01 + 0.01 * 1.0201, not + 0.01 * 1.0
    assert official.passes(ref, cand, contract(1e-2, 1e-2)) is True
    assert official.passes(cand, ref, contract(1e-2, 1e-2)) is False
    swapped = contract(1e-2, 1e-2, order=("candidate", "reference"))
    assert official.passes(ref, cand, swapped) is False
    assert official.passes(cand, ref, swapped) is True


def test_a_candidate_of_another_shape_dtype_or_type_fails():
    ref = f32(1.0, 2.0)
    assert official.passes(ref, f32(1.0), contract()) is False
    assert official.passes(ref, ref.double(), contract()) is False
    assert official.passes(ref, [1.0, 2.0], contract()) is False
    assert official.passes(ref, ref.clone(), contract()) is True


def test_trial_seeds_are_drawn_as_the_evaluator_draws_them():
    torch.manual_seed(42)
    expected = [int(torch.randint(0, 2**32 - 1, (1,)).item()) for _ in range(5)]
    assert official.trial_seeds(contract_record(None)) == expected
    assert official.trial_seeds(contract(seed=42), trials=2) == expected[:2]
    assert official.trial_seeds(contract(seed=7)) != expected


OURS = """import types
import torch
from kbfuse.checks import official
class ModelNew(torch.nn.Module):
    def __init__(self, *args):
        super().__init__()
        task = types.SimpleNamespace(Model=Model, get_init_inputs=get_init_inputs)
        self.ours = official.instance(task, SEED, "cpu")
    def forward(self, x):
        return self.ours(x)
"""


# Init inputs that draw from the generator: only the evaluator's second set_seed (after
# get_init_inputs, before Model) gives the weights it builds.
RANDOM_INIT = TASK53.replace(
    "return [in_features, out_features, scaling_factor, hardtanh_min, hardtanh_max]",
    "return [in_features, out_features, float(torch.rand(1)), hardtanh_min, hardtanh_max]",
)


@pytest.mark.parametrize("task", [TASK53, RANDOM_INIT], ids=["task53", "random-init-inputs"])
def test_a_model_kbfuse_builds_is_the_evaluators_own_bit_for_bit(task):
    """The candidate is kbfuse's instance of the task: with a tolerance of 0 the evaluator
    passes it only if kbfuse seeded, drew init inputs and built the model as it does."""
    assert RANDOM_INIT != TASK53
    assert run_evaluator(task, OURS.replace("SEED", "42"), tolerance="0.0") is True
    assert run_evaluator(task, OURS.replace("SEED", "43"), tolerance="0.0") is False


def test_inputs_are_the_evaluators_processing_of_get_inputs():
    task = module_of(TASK53)
    drawn = official.inputs(task, 1234, "cpu")
    official.set_seed(1234)
    again = task.get_inputs()
    assert torch.equal(drawn[0], again[0]) and drawn[0].dtype == torch.float32
    values = official.to_device([torch.arange(3), 2.5, "x"], "cpu")
    assert values[0].dtype == torch.float32 and values[1:] == [2.5, "x"]  # every tensor cast


OFF = """import torch
class ModelNew(torch.nn.Module):
    def __init__(self, *args):
        super().__init__()
        self.model = Model(*args)
    def forward(self, x):
        return self.model(x) * SCALE
"""


@pytest.mark.parametrize(
    ("scale", "tolerance", "passes"),
    [("1.003", "1e-4", False), ("1.003", "1e-2", True), ("1.0", "1e-4", True)],
    ids=["0.3%-off-at-the-pin", "0.3%-off-at-v0.1", "exact"],
)
def test_the_evaluator_and_kbfuse_agree_on_an_off_candidate(scale, tolerance, passes):
    assert run_evaluator(TASK53, OFF.replace("SCALE", scale), tolerance) is passes
    task, judged = module_of(TASK53), contract(float(tolerance), float(tolerance))
    model = official.instance(task, 42, "cpu")
    verdicts = []
    for seed in official.trial_seeds(judged):
        values = official.inputs(task, seed, "cpu")
        reference = official.reference_call(model, values, seed)
        verdicts.append(official.passes(reference, reference * float(scale), judged))
    assert all(verdicts) is passes


def test_a_trivial_candidate_must_pass_every_trial_and_the_status_says_how_many():
    judged = contract()
    status = official.trivial_status(((torch.zeros(2), []) for _ in range(3)), judged)
    assert status["trials"] == 3 and status["blind_spot"] is True
    assert status["compared"] == "eager output on KernelBench's 3 official trials"
    with pytest.raises(KbfuseError, match=r"^trivial_status needs at least one official trial$"):
        official.trivial_status([], judged)


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda c: c.pop("atol"), r"lacks \['atol'\]"),
        (lambda c: c.update(argument_order=["reference"]), r"argument_order is \['reference'\]"),
        (lambda c: c.update(trials=0), r"trials is 0"),
        (lambda c: c.update(seed=True), r"seed is True"),
        (lambda c: c.update(rtol=-1.0), r"tolerance rtol must be finite and >= 0"),
    ],
)
def test_a_bad_contract_is_refused_naming_the_key(edit, message):
    bad = contract()
    edit(bad)
    with pytest.raises(KbfuseError, match=message):
        official.check_contract(bad)
