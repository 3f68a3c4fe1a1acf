"""Both judges give the same verdict for the same trivial candidate: the survey's blind spots
and `kbfuse check`'s reference, on a task shaped like KernelBench's level-2 task 9
(relu((x @ W.T + b - 2) * 1.5)).

Under KernelBench's own draws (each trial's inputs under its own trial seed) its output is
exactly 0, so all-zeros passes the evaluator: the task is a blind spot. Drawing the inputs
under the weights' own seed replays the weights' random stream (input row i is weight row i's
uniform draws), the diagonal is far from 0 and zeros fail: the survey's draw before issue 26,
which missed this blind spot while the check found it.
"""

from __future__ import annotations

import json

import pytest
import torch
from kbrepo import LEVEL_DIR, commit_files, evaluator_files, make_kernelbench_repo

from kbfuse.candidates.reference import run_reference
from kbfuse.checks import official
from kbfuse.results import records
from kbfuse.survey.job import run_survey_task
from kbfuse.survey.settings import survey_settings
from kbfuse.tasks.evaluator import read_contract_record, write_contract
from kbfuse.tasks.kernelbench import pin_kernelbench, pin_task

TASK9 = """import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self, in_features, out_features, subtract_value, multiply_value):
        super(Model, self).__init__()
        self.linear = nn.Linear(in_features, out_features)
        self.subtract_value = subtract_value
        self.multiply_value = multiply_value

    def forward(self, x):
        x = self.linear(x)
        x = x - self.subtract_value
        x = x * self.multiply_value
        x = torch.relu(x)
        return x

batch_size = 16
in_features = 1024
out_features = 32
subtract_value = 2.0
multiply_value = 1.5

def get_inputs():
    return [torch.rand(batch_size, in_features)]

def get_init_inputs():
    return [in_features, out_features, subtract_value, multiply_value]
"""
ZEROS = """import torch
class ModelNew(torch.nn.Module):
    def __init__(self, *args):
        super().__init__()
    def forward(self, x):
        return torch.zeros(x.shape[0], 32)
"""


@pytest.fixture(scope="module")
def pinned(tmp_path_factory):
    root = tmp_path_factory.mktemp("agreement")
    url, _ = make_kernelbench_repo(root / "kb", tasks=(53,))
    commit = commit_files(
        root / "kb", {f"{LEVEL_DIR}/9_Matmul_Subtract_Multiply_ReLU.py": TASK9}, "task 9"
    )
    checkout, record = root / "checkout", root / "checkout.json"
    pin_kernelbench(url, commit, 2, [53], checkout, record)
    write_contract(checkout, record, root / "contract.json")
    pin_task(checkout, record, 9, root / "pin9.json")
    return root, checkout


def test_kernelbench_shaped_evaluator_passes_zeros_on_this_task():
    namespace: dict = {}
    exec(evaluator_files()["src/kernelbench/eval.py"], namespace)  # noqa: S102
    assert namespace["eval_kernel_against_ref"](TASK9, ZEROS, num_correct_trials=5) is True


def test_the_survey_flags_it(pinned, tmp_path):
    root, checkout = pinned
    settings = survey_settings(
        {
            "survey": {
                "device": "cpu",
                "rounds": 2,
                "warmup": 1,
                "baselines": ["eager"],
                "profile": False,
            }
        }  # fmt: skip
    )
    out = tmp_path / "9.json"
    run_survey_task(checkout, root / "pin9.json", settings, root / "contract.json",
                    {"strict": out}, print)  # fmt: skip
    rec = records.read_record(out, "survey_task")
    assert rec["blind_spot"] is True
    assert rec["blind_spots"]["zeros"] == {"applicable": True, "passes": True}
    assert rec["blind_spots"]["trials"] == 5
    assert rec["official"]["atol"] == 1e-4 and len(rec["official"]["trial_seeds"]) == 5
    assert rec["output"]["abs_max"] > 1.0  # the timing inputs (the weights' seed): not zero


def test_the_check_flags_it_with_the_same_status(pinned, tmp_path):
    root, checkout = pinned
    task_file = checkout / LEVEL_DIR / "9_Matmul_Subtract_Multiply_ReLU.py"
    contract = read_contract_record(root / "contract.json")
    request = {
        "task_file": str(task_file),
        "device": "cpu",
        "contract": contract,
        "seeds": [0],
        "distributions": ["uniform"],
    }
    run_reference(request, tmp_path / "out")
    trivial = json.loads((tmp_path / "out/reference.json").read_text())["trivial"]
    assert trivial["blind_spot"] is True
    assert trivial["zeros"] == {"applicable": True, "passes": True}
    # the survey's status, computed the same way over the same trials
    task = official_module(task_file)
    model = official.instance(task, contract["seed"], "cpu")
    trials = [
        (official.reference_call(model, values, seed), values)
        for seed in official.trial_seeds(contract)
        for values in [official.inputs(task, seed, "cpu")]
    ]
    assert official.trivial_status(trials, contract) == trivial


def test_inputs_drawn_under_the_weights_seed_would_miss_it(pinned):
    root, checkout = pinned
    task = official_module(checkout / LEVEL_DIR / "9_Matmul_Subtract_Multiply_ReLU.py")
    contract = read_contract_record(root / "contract.json")
    model = official.instance(task, contract["seed"], "cpu")
    replayed = official.inputs(task, contract["seed"], "cpu")  # the survey's old draw
    output = official.reference_call(model, replayed, contract["seed"])
    diagonal = torch.diagonal(output[:, :16])
    assert diagonal.min() > 1.0 and (output[:, 16:] == 0).all()
    assert official.trivial_status([(output, replayed)], contract)["blind_spot"] is False


def official_module(path):
    from kbfuse.candidates.childio import import_file

    return import_file(path, "agreement_task")
