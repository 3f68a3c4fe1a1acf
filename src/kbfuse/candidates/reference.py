"""The reference side of a check, run in its own process: the task's `Model` on every case.

It writes, under `out`:
  cases.json           the case list (name, group, instance, perturb) both sides follow;
  inputs/{case}.pt     the inputs of each case (a list; tensors on the CPU);
  reference/{case}.pt  the reference output of each case;
  reference.json       the output's shape and dtype, and the trivial-candidate status.

Cases, in call order per model instance (an instance is built once and then called in order,
so a candidate that caches a result or ignores its input is called with changed inputs and
weights):
  official_{i}   KernelBench's protocol at the pin: seed 42 for init inputs and weights (one
                 instance), trial seeds drawn from torch.manual_seed(42) as
                 `run_and_check_correctness` does, inputs from the task's get_inputs();
  weights        the official instance after an in-place change of every parameter
                 (p * 1.25 + 0.001, in name order), on official_0's inputs;
  {dist}_s{seed} a fresh instance per seed (weights from that seed); each float32 input drawn
                 from the study's distribution (kbfuse.tasks.inputs) with that seed.
Models stay in training mode, as KernelBench's evaluator leaves them; every call runs under
torch.no_grad().
"""

from __future__ import annotations

from pathlib import Path

from kbfuse.candidates.childio import (
    import_file,
    save_tensors,
    set_seed,
    to_device,
    write_json,
)

PERTURB_SCALE, PERTURB_SHIFT = 1.25, 0.001


def trial_seeds(seed: int, trials: int) -> list[int]:
    """KernelBench's correctness trial seeds (eval.run_and_check_correctness at the pin)."""
    import torch

    torch.manual_seed(seed)
    return [int(torch.randint(0, 2**32 - 1, (1,)).item()) for _ in range(trials)]


def perturb_weights(model) -> list[str]:
    """Change every parameter in place, in name order; the names changed."""
    import torch

    names = []
    with torch.no_grad():
        for name, param in sorted(model.named_parameters()):
            if param.is_floating_point():
                param.mul_(PERTURB_SCALE).add_(PERTURB_SHIFT)
                names.append(name)
    return names


def build_cases(request: dict) -> list[dict]:
    """The case list (see the module docstring); inputs are drawn by `case_inputs`."""
    cases = [
        {"name": f"official_{i}", "group": "official", "instance": "official", "seed": s}
        for i, s in enumerate(trial_seeds(request["seed"], request["official_trials"]))
    ]
    cases.append(
        {
            "name": "weights",
            "group": "weights",
            "instance": "official",
            "perturb": True,
            "inputs_of": "official_0",
        }
    )
    for seed in request["seeds"]:
        for dist in request["distributions"]:
            cases.append(
                {
                    "name": f"{dist}_s{seed}",
                    "group": "distribution",
                    "instance": f"seed{seed}",
                    "seed": seed,
                    "distribution": dist,
                }
            )
    return cases


def instance_seed(instance: str, request: dict) -> int:
    return request["seed"] if instance == "official" else int(instance.removeprefix("seed"))


def build_instance(task, cls, seed: int, device: str):
    """KernelBench's construction: set_seed, init inputs, set_seed, cls(*init), to device."""
    import torch

    set_seed(seed)
    init = to_device(list(task.get_init_inputs()), device)
    set_seed(seed)
    with torch.no_grad():
        model = cls(*init)
    return model.to(device=device, dtype=torch.float32)


def case_inputs(task, case: dict, made: dict) -> list:
    """CPU inputs of a case (drawn as KernelBench does, or from a study distribution)."""
    import torch

    from kbfuse.tasks.inputs import make_input

    if "inputs_of" in case:
        return made[case["inputs_of"]]
    set_seed(case["seed"])
    values = list(task.get_inputs())
    if case["group"] != "distribution":
        return values
    return [
        make_input(case["distribution"], tuple(v.shape), case["seed"])
        if isinstance(v, torch.Tensor) and v.dtype == torch.float32
        else v
        for v in values
    ]


def trivial_status(reference, inputs: list, atol: float, rtol: float) -> dict:
    """Does a trivial output pass the official predicate against this reference output?"""
    import torch

    def passes(candidate) -> bool:
        return bool(torch.allclose(reference, candidate, atol=atol, rtol=rtol))

    ref = reference.float()
    status = {
        "zeros": {"applicable": True, "passes": passes(torch.zeros_like(ref))},
        "mean_constant": {
            "applicable": True,
            "passes": passes(torch.full_like(ref, float(ref.mean()))),
            "value": float(ref.mean()),
        },
    }
    first = inputs[0] if inputs else None
    same = isinstance(first, torch.Tensor) and first.shape == ref.shape
    status["input_identity"] = {
        "applicable": same,
        "passes": passes(first.to(ref.device, ref.dtype)) if same else None,
    }
    status["blind_spot"] = any(v["passes"] for v in status.values() if v["passes"])
    status["compared"] = "official_0: eager output, KernelBench's seed and inputs"
    return status


def run_reference(request: dict, out: Path) -> None:
    import torch

    device = request["device"]
    task = import_file(request["task_file"], "kbfuse_check_task")
    cases = build_cases(request)
    models: dict[str, object] = {}
    made: dict[str, list] = {}
    info: dict = {}
    for case in cases:
        inputs = case_inputs(task, case, made)
        made[case["name"]] = inputs
        instance = case["instance"]
        if instance not in models:
            models[instance] = build_instance(
                task, task.Model, instance_seed(instance, request), device
            )
        model = models[instance]
        if case.get("perturb"):
            case["perturbed"] = perturb_weights(model)
        with torch.no_grad():
            output = model(*to_device(inputs, device))
        if not isinstance(output, torch.Tensor):
            raise TypeError(f"task Model returned {type(output).__name__}, not a tensor")
        save_tensors(out / "inputs" / f"{case['name']}.pt", inputs)
        save_tensors(out / "reference" / f"{case['name']}.pt", output.detach().cpu())
        if case["name"] == "official_0":
            info["output"] = {"shape": list(output.shape), "dtype": str(output.dtype)}
            info["trivial"] = trivial_status(
                output.detach(), to_device(inputs, device), request["atol"], request["rtol"]
            )
    write_json(out / "cases.json", cases)
    write_json(out / "reference.json", info)
