"""The reference side of a check, run in its own process: the task's `Model` on every case.

It writes, under `out`:
  cases.json           the case list (name, group, instance, perturb) both sides follow;
  reference/{case}.pt  the reference output of each case;
  reference.json       the output's shape and dtype, the trivial-candidate status, and the
                       digest of each case's inputs (childio.inputs_digest).

A case's inputs are not written: they are a seed's draw (`case_inputs`), and the candidate's
process draws them again with the same code (kbfuse.candidates.runner), so a check's scratch
disk holds outputs only. A candidate that changes how its own process draws them changes only
its own outputs, which are compared with these; the digests tell that apart from wrong values.

Cases, in call order per model instance (an instance is built once and then called in order,
so a candidate that caches a result or ignores its input is called with changed inputs and
weights):
  official_{i}   KernelBench's protocol at the pin (kbfuse.checks.official, with the pinned
                 kernelbench_contract the request carries): its seed for init inputs and weights
                 (one instance), its trial seeds drawn as `run_and_check_correctness` does,
                 inputs from the task's get_inputs() under each trial seed;
  weights        the official instance after an in-place change of every parameter
                 (p * 1.25 + 0.001, in name order), on official_0's inputs;
  {dist}_s{seed} a fresh instance per seed (weights from that seed); each float32 input drawn
                 from the study's distribution (kbfuse.tasks.inputs) with that seed.
Models stay in training mode, as KernelBench's evaluator leaves them; every call runs under
torch.no_grad(). The trivial-candidate status (reference.json) is kbfuse.checks.official's,
over every official case: the survey's blind spots, on the same trials.
"""

from __future__ import annotations

from pathlib import Path

from kbfuse.candidates.childio import (
    GpuTurns,
    import_file,
    inputs_digest,
    save_tensors,
    set_seed,
    to_device,
    write_json,
)
from kbfuse.checks import official

PERTURB_SCALE, PERTURB_SHIFT = 1.25, 0.001
TIMING_CASE = "official_0"  # the inputs the candidate's guards and timing call with
AFTER_TIMING = "after_timing"  # the candidate's output after the timed region, on those


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
        for i, s in enumerate(official.trial_seeds(request["contract"]))
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
    if instance == "official":
        return request["contract"]["seed"]
    return int(instance.removeprefix("seed"))


def build_instance(task, cls, seed: int, device: str):
    """KernelBench's construction (kbfuse.checks.official.instance) of class `cls`."""
    return official.instance(task, seed, device, cls)


def reused_inputs(cases: list[dict]) -> set[str]:
    """The cases whose inputs a later case takes again (`inputs_of`): kept in memory."""
    return {case["inputs_of"] for case in cases if "inputs_of" in case}


def case_inputs(task, case: dict, made: dict) -> list:
    """CPU inputs of a case (drawn as KernelBench does, or from a study distribution);
    `made`: the inputs of the cases drawn so far that a later case reuses (reused_inputs)."""
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


def run_reference(request: dict, out: Path) -> None:
    """Every case's reference output (module docstring). The device work of each case (the
    instance built, its weights changed, the call, the output copied to the host) is one
    turn on the GPU (childio.GpuTurns: the request's `turns`); the inputs are drawn and the
    output written to disk between turns, holding nothing."""
    import torch

    device = request["device"]
    turns = GpuTurns(request.get("turns"), device)
    task = import_file(request["task_file"], "kbfuse_check_task")
    cases = build_cases(request)
    models: dict[str, object] = {}
    reused = reused_inputs(cases)
    made: dict[str, list] = {}
    info: dict = {"inputs_sha256": {}}
    trials = []
    for case in cases:
        inputs = case_inputs(task, case, made)
        if case["name"] in reused:
            made[case["name"]] = inputs
        info["inputs_sha256"][case["name"]] = inputs_digest(inputs)
        instance = case["instance"]
        with turns.turn():
            if instance not in models:
                models[instance] = build_instance(
                    task, task.Model, instance_seed(instance, request), device
                )
            model = models[instance]
            if case.get("perturb"):
                case["perturbed"] = perturb_weights(model)
            if case["group"] == "official":  # as the evaluator calls its reference
                output = official.reference_call(model, to_device(inputs, device), case["seed"])
            else:
                with torch.no_grad():
                    output = model(*to_device(inputs, device))
            if not isinstance(output, torch.Tensor):
                raise TypeError(f"task Model returned {type(output).__name__}, not a tensor")
            host = output.detach().cpu()
            if case["group"] == "official":
                trials.append((output.detach(), to_device(inputs, device)))
        save_tensors(out / "reference" / f"{case['name']}.pt", host)
        if case["name"] == "official_0":
            info["output"] = {"shape": list(output.shape), "dtype": str(output.dtype)}
    with turns.turn():
        info["trivial"] = official.trivial_status(trials, request["contract"])
    write_json(out / "cases.json", cases)
    write_json(out / "reference.json", info)
