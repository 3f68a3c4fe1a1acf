"""The official check read from a pinned evaluator's source (kbfuse.tasks.evaluator): every
fact with the file and line it came from, older layouts read too, and an evaluator kbfuse
cannot read refused with a message that names the file and what is missing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from kbrepo import evaluator_files

from kbfuse.errors import KbfuseError
from kbfuse.results import records
from kbfuse.tasks import evaluator

EVAL = "src/kernelbench/eval.py"


def checkout(tmp_path: Path, edits: dict[str, tuple[str, str]] | None = None, **kw) -> Path:
    """The test evaluator's files in a folder, each (old, new) edit applied to its file."""
    files = evaluator_files(**kw)
    for rel, (old, new) in (edits or {}).items():
        assert old in files[rel], (rel, old)
        files[rel] = files[rel].replace(old, new)
    for rel, text in files.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path


def line_of(path: Path, text: str) -> int:
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if text in line)


def test_the_contract_of_a_pinned_evaluator_names_where_each_fact_was_read(tmp_path):
    root = checkout(tmp_path)
    c = evaluator.read_contract(root, "a" * 40)
    assert (c["atol"], c["rtol"], c["precision"]) == (1e-4, 1e-4, "float32")
    table = line_of(root / EVAL, "torch.float32: 1e-4")
    assert c["tolerance_source"] == {
        "atol": f"{EVAL}:{table} get_tolerance_for_precision, torch.float32",
        "rtol": f"{EVAL}:{table} get_tolerance_for_precision, torch.float32",
    }
    assert c["argument_order"] == ["reference", "candidate"]
    assert c["argument_order_source"] == f"{EVAL}:{line_of(root / EVAL, 'torch.allclose(')} " \
        "torch.allclose"  # fmt: skip
    assert (c["seed"], c["trials"], c["timing_trials"]) == (42, 5, 100)
    assert c["trials_source"] == "scripts/eval_from_generations.py:3 num_correct_trials"
    assert (c["trial_seed_low"], c["trial_seed_high"]) == (0, 2**32 - 1)
    assert c["construction_steps"] == ["set_seed", "get_init_inputs", "set_seed", "Model"]
    assert c["trial_steps"] == ["set_seed", "get_inputs_fn", "set_seed", "model", "model_new"]
    assert (c["semantics"], c["numerics"], c["timing_method"]) == (
        "training", "pytorch-defaults", "cuda_event"
    )  # fmt: skip
    assert c["timing_cold_l2"] is True
    assert c["timing_cold_l2_source"].startswith("src/kernelbench/timing.py:")
    assert c["commit"] == "a" * 40 and set(c["files"]) == set(evaluator_files())
    records.validate_record(c, "kernelbench_contract", "contract.json")


def test_a_literal_tolerance_in_the_predicate_is_read_as_it_stands(tmp_path):
    # KernelBench v0.1: torch.allclose(output, output_new, atol=1e-02, rtol=1e-02)
    edit = {EVAL: ("atol=tolerance, rtol=tolerance", "atol=1e-02, rtol=1e-02")}
    c = evaluator.read_contract(checkout(tmp_path, edit))
    assert (c["atol"], c["rtol"]) == (0.01, 0.01)
    assert c["tolerance_source"]["atol"].endswith("torch.allclose atol=")


def test_another_tolerance_table_and_seed_change_the_contract(tmp_path):
    c = evaluator.read_contract(checkout(tmp_path, tolerance="2.5e-3", seed=7))
    assert (c["atol"], c["rtol"], c["seed"]) == (2.5e-3, 2.5e-3, 7)


def test_the_argument_order_follows_the_call(tmp_path):
    swapped = {EVAL: ("torch.allclose(output, output_new,", "torch.allclose(output_new, output,")}
    c = evaluator.read_contract(checkout(tmp_path, swapped))
    assert c["argument_order"] == ["candidate", "reference"]


def test_an_older_layout_without_a_timing_module_or_an_l2_flush(tmp_path):
    """KernelBench v0.1: src/eval.py, no timing_method parameter, the timing function in the
    evaluator itself (called by name), no L2 flush."""
    files = evaluator_files()
    old = (
        files.pop(EVAL)
        .replace('timing_method: str = "cuda_event", ', "")
        .replace(
            "    return run_and_check_correctness(",
            "    time_execution_with_cuda_event(custom_model, [])\n"
            "    return run_and_check_correctness(",
        )
    )
    old += (
        "\n\ndef time_execution_with_cuda_event(kernel_fn, args, num_trials=10):\n"
        "    return [kernel_fn(*args) for _ in range(num_trials)]\n"
    )
    del files["src/kernelbench/timing.py"]
    files["src/eval.py"] = old
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    c = evaluator.read_contract(tmp_path)
    assert c["timing_method"] == "cuda_event"
    assert c["timing_method_source"] == (
        f"src/eval.py:{line_of(tmp_path / 'src/eval.py', 'time_execution_with_cuda_event(cu')} "
        "time_execution_with_cuda_event"
    )
    assert c["timing_cold_l2"] is False
    assert set(c["files"]) == {"src/eval.py", "scripts/eval_from_generations.py"}
    assert (c["atol"], c["seed"]) == (1e-4, 42)


def test_an_evaluator_that_sets_tf32_is_named(tmp_path):
    edit = {EVAL: ("def set_seed(seed: int):", "torch.backends.cudnn.allow_tf32 = False\n\n\n"
                                               "def set_seed(seed: int):")}  # fmt: skip
    assert evaluator.read_contract(checkout(tmp_path, edit))["numerics"] == "sets TF32"


@pytest.mark.parametrize(
    ("edits", "message"),
    [
        (
            {
                EVAL: (
                    "if not torch.allclose(output, output_new, atol=tolerance, rtol=tolerance)",
                    "if not (output - output_new).abs().max() < tolerance",
                )
            },
            r"src/kernelbench/eval\.py: run_and_check_correctness makes 0 torch\.allclose calls",
        ),
        (
            {
                EVAL: (
                    "            set_seed(trial_seed)\n            inputs = get_inputs_fn()",
                    "            inputs = get_inputs_fn()",
                )
            },
            r"run_and_check_correctness: the calls set_seed -> get_inputs_fn -> set_seed -> "
            r"model -> model_new are not in order",
        ),
        (
            {EVAL: ("torch.randint(0, 2**32 - 1, (1,))", "torch.randint(0, 2**32 - 1, (2,))")},
            r"torch\.randint draws \(2,\), not one value per trial",
        ),
        (
            {EVAL: ("atol=tolerance, rtol=tolerance", "atol=tolerance, rtol=TOL")},
            r"torch\.allclose's rtol is no number nor get_tolerance_for_precision",
        ),
        (
            {EVAL: ("seed_num: int = 42,", "seed_num: int,")},
            r"eval_kernel_against_ref has no default seed_num",
        ),
        (
            {"scripts/eval_from_generations.py": ("num_correct_trials = 5", "num_trials = 5")},
            r"scripts/eval_from_generations\.py: no literal `self\.num_correct_trials = N`",
        ),
        (
            {EVAL: ("def run_and_check_correctness(", "def run_and_check(")},
            r"src/kernelbench/eval\.py: no function run_and_check_correctness; kbfuse cannot "
            r"read the official check from this evaluator",
        ),
        (
            {EVAL: ("import torch", "import torch(")},
            r"KernelBench's src/kernelbench/eval\.py does not parse",
        ),
    ],
    ids=[
        "no-allclose",
        "steps-out-of-order",
        "randint-size",
        "tolerance-name",
        "no-seed",
        "no-trials",
        "no-function",
        "syntax",
    ],  # fmt: skip
)
def test_an_evaluator_kbfuse_cannot_read_is_refused_naming_what_is_missing(
    tmp_path, edits, message
):
    with pytest.raises(KbfuseError, match=message):
        evaluator.read_contract(checkout(tmp_path, edits))


def test_a_checkout_without_an_evaluator_is_refused(tmp_path):
    with pytest.raises(KbfuseError, match=r"has none of \['src/kernelbench/eval\.py', "):
        evaluator.read_contract(tmp_path)


def test_written_contract_is_read_back_checked(tmp_path):
    root = checkout(tmp_path / "kb")
    record = tmp_path / "checkout.json"
    record.write_text(json.dumps({"commit": "b" * 40}))
    out = tmp_path / "contract.json"
    written = evaluator.write_contract(root, record, out)
    assert evaluator.read_contract_record(out) == written and written["commit"] == "b" * 40
    assert evaluator.tolerance_of(out) == {"atol": 1e-4, "rtol": 1e-4}
    bad = dict(written, argument_order=["reference", "reference"])
    out.write_text(json.dumps(bad))
    with pytest.raises(KbfuseError, match=r"field argument_order"):
        evaluator.read_contract_record(out)


def test_the_study_refuses_a_pin_that_puts_the_candidate_first(tmp_path):
    swapped = {EVAL: ("torch.allclose(output, output_new,", "torch.allclose(output_new, output,")}
    root = checkout(tmp_path / "kb", swapped)
    record = tmp_path / "checkout.json"
    record.write_text(json.dumps({"commit": "c" * 40}))
    out = tmp_path / "contract.json"
    evaluator.write_contract(root, record, out)
    message = (
        r"calls torch\.allclose with the arguments \['candidate', 'reference'\] "
        r"\(src/kernelbench/eval\.py:\d+ torch\.allclose\); the study's records take "
        r"\['reference', 'candidate'\]"
    )
    with pytest.raises(KbfuseError, match=message):
        evaluator.tolerance_of(out)
