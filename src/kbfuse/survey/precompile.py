"""The survey's compile job: Inductor's baselines of one task compiled ahead of its timing job.

Inductor's compile (Dynamo, AOTAutograd, Triton codegen and compilation) is the slow part of a
survey job, and it is CPU work. `precompile_task` builds each configured Inductor baseline of
one task and numerics mode exactly as the timing job will (same seed, semantics, TF32 flags,
inputs and device), which fills the Inductor and Triton caches that all survey jobs share
(kbfuse.survey.job.share_compile_caches). The workflow runs these jobs without the `gpu`
resource, several at a time, beside the one exclusive timing job; the timing job then finds
warm caches. A compile job touches the GPU only for the first call of each compiled forward.

Its record (`results/survey/{numerics}/compiled/{task}.json`) holds each baseline's status and
cold build time; the timing job copies them into its record's `precompiled`. A baseline that
fails here is only recorded: the timing job builds it again and records its own failure.
"""

from __future__ import annotations

from kbfuse.io import write_json
from kbfuse.survey import baselines, tasks
from kbfuse.survey.settings import set_numerics
from kbfuse.tasks.kernelbench import load_task, read_pin

KIND = "survey_compile"


def compiled_baselines(names) -> list[str]:
    """The baselines a compile job builds: the Inductor ones."""
    return [name for name in names if name.startswith("inductor")]


def precompile_task(checkout, pin_path, settings: dict, mode: str, out, say=print) -> dict:
    """Build the task's Inductor baselines once (filling the shared caches); write the record."""
    import torch

    pin = read_pin(pin_path)
    (task,) = (int(key) for key in pin["tasks"])
    spec = load_task(checkout, pin, task)
    numerics = set_numerics(mode)
    device = settings["device"]
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    model, inputs = tasks.instantiate(spec, settings["seed"], settings["semantics"], device)
    entries = {}
    for name in compiled_baselines(settings["baselines"]):
        say(f"task {task} {mode}: compiling {name}")
        try:
            _, build_s = baselines.build(name, model, inputs, settings["semantics"], sync)
            entries[name] = {"status": "ok", "build_s": build_s, "failure": None}
            say(f"  compiled in {build_s:.2f} s")
        except Exception as exc:  # noqa: BLE001 - recorded; the timing job retries and records
            entries[name] = {"status": "failed", "build_s": None,
                             "failure": baselines.failure("build", exc)}  # fmt: skip
            say(f"  failed: {entries[name]['failure']}")
    record = {
        "kind": KIND,
        "task": task,
        "numerics": numerics,
        "baselines": entries,
        "compile_cache": baselines.compile_cache_counts(),
    }
    write_json(out, record)
    return record
