"""Names and paths of the summary: which result files it reads and which files it writes.

Kept apart from kbfuse.summary (pandas, matplotlib) so that the Snakefile can name the
summary rule's inputs and outputs without importing them.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

# Table name -> one line saying what it holds (also the order in which tables are written).
TABLES: dict[str, str] = {
    "correctness": "task x variant: cases, official passes, bit identity, largest errors",
    "correctness_cases": "every correctness case of every task x implementation",
    "baseline_bit_identity": "TorchScript and Inductor against eager, per task",
    "compiler_contract": "variant: route, options, compiler, FTZ requested/expected/effective",
    "timing_full": "full program time per task x implementation x method",
    "timing_tail": "tail time per task x implementation x method, against the copy floor",
    "small_shapes": "the small-shape timings per task",
    "ftz_cost": "paired FTZ-on over FTZ-off cost per task and route",
    "position_effect": "per timed block: first-position samples over the others (1: no effect)",
    "tiny_values": "tiny-value control cases per task x variant",
    "exhaustive": "every float32 input per task x variant: outputs whose bits differ from eager",
    "control_bit_equality": "bit-equal elements per variant x control set (the plot's data)",
    "witness81": "the minimal task-81 witness per variant and input",
    "toolchains": "each variant beside its twin compiled by another NVRTC: artifact, FTZ, bits",
    "margin_audit": "official vs historical error ratios of every audited record",
    "direction_witness": "a float32 pair on which allclose(a, b) and allclose(b, a) disagree",
    "skipped": "implementations gated out of timing (main and small shape), with reasons",
    "environment": "the fingerprint of the machine that produced the results",
}
PLOT_CONTROL_BIT_EQUALITY = "control_bit_equality.png"


def tail_plot_name(task: int) -> str:
    return f"tail_time_{task}.png"


def summary_outputs(config: Mapping[str, Any]) -> list[str]:
    """File names (relative to the summary directory) that `write_summary` writes."""
    names = [f"{table}.{ext}" for table in TABLES for ext in ("csv", "md")]
    names += [tail_plot_name(task) for task in config["tasks"]]
    names.append(PLOT_CONTROL_BIT_EQUALITY)
    return names


def caption_name(output: str) -> str:
    """The caption file in workflow/report/ for one summary output (table or plot)."""
    name = Path(output).name
    stem = name.split(".")[0]
    if name.endswith(".png"):
        return ("tail_time" if stem.startswith("tail_time_") else stem) + "_plot.rst"
    return f"{stem}.rst"


def result_paths(config: Mapping[str, Any]) -> dict[tuple, str]:
    """Every result file the summary reads, keyed by what it is, relative to results/."""
    variants = list(config["variants"])
    paths: dict[tuple, str] = {
        ("pin",): "kernelbench/pin.json",
        ("env",): "env/fingerprint.json",
    }
    for v in variants:
        paths[("compile", v)] = f"compile/{v}/meta.json"
        paths[("verify", v)] = f"verify/{v}.json"
    for t in config["tasks"]:
        for v in variants:
            paths[("correctness", t, v)] = f"correctness/{t}/{v}.json"
        paths[("baselines", t)] = f"correctness/{t}/baselines.json"
        paths[("timing", t)] = f"timing/{t}.json"
        paths[("controls", t)] = f"controls/{t}.json"
    if 81 in config["tasks"]:  # the witness rule runs only when the study includes task 81
        paths[("witness81",)] = "controls/witness81.json"
    paths[("margin_audit",)] = "protocol/margin_audit.json"
    paths[("direction_witness",)] = "protocol/direction_witness.json"
    return paths


def summary_inputs(config: Mapping[str, Any], results_dir: str | Path = "results") -> list[str]:
    """The input paths of the summary rule (results_dir joined), in a stable order."""
    return [str(Path(results_dir) / rel) for rel in result_paths(config).values()]
