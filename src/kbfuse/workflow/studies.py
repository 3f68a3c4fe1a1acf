"""The fused studies one workflow runs, and where each keeps its files.

The first study (the config's top level: tasks 53, 81, 95, kernels/naive.cu and fast.cu) writes
under results/; the second fused study (the config's `fused2:` block: tails after a
convolution, kernels/fused2_*.cu; docs/fused2.md) runs the same pipeline, rule for rule
(workflow/rules/fused2.smk), under results/fused2/. Why a second study rather than more tasks
in the first: a variant compiles one kernel source for every task of its study, so adding the
new kernels to naive.cu and fast.cu would change the first study's artifacts (their sha256 is
in every record) and rerun all of it; a study of its own leaves the first study's results,
reference and DAG exactly as they were, and its numerics mode (the survey's TF32 defaults,
where its tasks have their headroom) is its own.

`fused2_config` derives the second study's complete config from the top level: the
KernelBench pin, seeds, distributions, architecture, NVRTC versions, timing protocol and
baselines are shared; the block names its tasks, variants, controls, numerics mode and the
survey summary its predictions are read from (kbfuse.results.prediction). That config is a
study config like the first (it passes the same schema), so the summary, manifest, bundle and
`kbfuse summarize` read it as they read the first study's.

`StudyFiles` gives every path of one study (its results root, its config): the helpers the
second study's rules use; the first study's rules keep theirs in workflow/rules/common.smk.
`kernel_problems` checks, before any job, that every variant's kernel source defines the
kernels of its study's tasks (kbfuse.tasks.registry.kernel_names).
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kbfuse import layout
from kbfuse.errors import KbfuseError
from kbfuse.tasks.registry import kernel_names

FUSED2 = "fused2"
FUSED2_ROOT = f"{layout.RESULTS}/{FUSED2}"
# What the second study takes from the top level of the config.
INHERITED = (
    "kernelbench",
    "seeds",
    "distributions",
    "arch",
    "nvrtc_versions",
    "baselines",
    "timing",
)
# What its block must name (and may: `baselines`, to time other ones than the top level's).
BLOCK_KEYS = ("tasks", "variants", "controls", "numerics", "survey_summary")
# The GPU records a study writes (what the margin audit reads).
GPU_RECORDS = (
    "verify",
    "env",
    "witness81",
    "correctness",
    "correctness_baselines",
    "timing",
    "controls",
)
_KERNEL = re.compile(
    r'extern\s+"C"\s+__global__\s+void\s+(?:__launch_bounds__\([^)]*\)\s*)?(\w+)\s*\('
)


def fused2_config(config: Mapping[str, Any]) -> dict | None:
    """The second study's complete config (see the module docstring), or None when the
    config has no `fused2` block. The controls' witness inputs are the top level's (a study
    without task 81 never uses them)."""
    block = config.get(FUSED2)
    if block is None:
        return None
    study = {key: copy.deepcopy(config[key]) for key in INHERITED if key in config}
    study.update({key: copy.deepcopy(block[key]) for key in BLOCK_KEYS if key in block})
    if "baselines" in block:
        study["baselines"] = list(block["baselines"])
    controls = dict(study["controls"])
    controls.setdefault("witness81_inputs", list(config["controls"]["witness81_inputs"]))
    study["controls"] = controls
    return study


def numerics_for(config: Mapping[str, Any], task) -> str | None:
    """The numerics mode a study runs `task` in: its `numerics`, one mode for every task or a
    mapping task -> mode; None (strict FP32 as the first study records it) when it names
    none. KbfuseError when a mapping leaves the task out."""
    numerics = config.get("numerics")
    if numerics is None or isinstance(numerics, str):
        return numerics
    try:
        return numerics[str(int(task))]
    except KeyError:
        raise KbfuseError(
            f"config key numerics: names no mode for task {task} (it names {sorted(numerics)})"
        ) from None


def prediction_settings(config: Mapping[str, Any]) -> dict:
    """What a study's survey rows depend on (kbfuse.results.prediction.write_survey_rows):
    its tasks, their numerics modes, the survey summary folder."""
    return {key: copy.deepcopy(config[key]) for key in ("tasks", "numerics", "survey_summary")}


def numerics_problems(config: Mapping[str, Any], key: str = "") -> list[str]:
    """A per-task numerics mapping must name exactly the study's tasks."""
    numerics = config.get("numerics")
    if not isinstance(numerics, Mapping):
        return []
    tasks = {str(t) for t in config["tasks"]}
    if set(numerics) == tasks:
        return []
    return [
        f"config key {key}numerics: names tasks {sorted(numerics, key=int)}, the study runs "
        f"{sorted(tasks, key=int)}"
    ]


def defined_kernels(text: str) -> set[str]:
    """The `extern "C" __global__` kernels a translation unit defines, by name."""
    return set(_KERNEL.findall(text))


def kernel_problems(config: Mapping[str, Any], kernels_dir: str | Path, key: str = "") -> list[str]:
    """One line per variant whose kernel source lacks a kernel of the study's tasks."""
    from kbfuse.compilation import kernelsrc

    needed = kernel_names(config["tasks"])
    problems = []
    for name, spec in config["variants"].items():
        source = Path(kernels_dir) / f"{spec.get('kernel', 'naive')}.cu"
        try:
            defined = defined_kernels(kernelsrc.load(source).text)
        except KbfuseError:
            continue  # the source itself is reported by the config's kernel checks
        missing = [kernel for kernel in needed if kernel not in defined]
        if missing:
            problems.append(
                f"config key {key}variants.{name}.kernel: {source} does not define "
                f"{', '.join(missing)} (kernels of tasks {list(config['tasks'])})"
            )
    return problems


@dataclass(frozen=True)
class StudyFiles:
    """Every path of one study: its records and files under `root`, the shared KernelBench
    checkout, logs and benchmarks under `root`/logs and `root`/benchmarks."""

    config: Mapping[str, Any]
    root: str

    @property
    def tasks(self) -> list[int]:
        return [int(t) for t in self.config["tasks"]]

    @property
    def variants(self) -> list[str]:
        return list(self.config["variants"])

    def record(self, kind: str, /, **wildcards: Any) -> str:
        return layout.record(kind, self.root, **wildcards)

    def file(self, name: str, /, **wildcards: Any) -> str:
        return layout.file(name, self.root, **wildcards)

    def log(self, stage: str) -> str:
        return layout.log(stage, self.root)

    def benchmark(self, stage: str) -> str:
        return layout.benchmark(stage, self.root)

    def artifacts(self, variants: Iterable[str] | None = None) -> dict[str, tuple[str, str]]:
        chosen = self.variants if variants is None else list(variants)
        return {
            v: (self.file("artifact", variant=v), self.record("compile", variant=v)) for v in chosen
        }

    def artifact_files(self, variants: Iterable[str] | None = None) -> list[str]:
        return [path for pair in self.artifacts(variants).values() for path in pair]

    def correctness_files(self, task) -> dict[str, str]:
        return {v: self.record("correctness", task=task, variant=v) for v in self.variants}

    def verify_files(self) -> list[str]:
        return [self.record("verify", variant=v) for v in self.variants]

    def task_pin(self, task) -> str:
        return self.file("task_pin", task=task)

    def gpu_results(self) -> list[str]:
        return layout.record_files(self.config, GPU_RECORDS, self.root)

    def study_results(self) -> list[str]:
        """Every result of the study: what its summary reads and its manifest hashes."""
        survey = [self.record("survey_rows")] if self.config.get("survey_summary") else []
        return [
            self.record("kernelbench_pin"),
            self.record("kernelbench_contract"),
            *self.artifact_files(),
            *self.gpu_results(),
            self.record("direction_witness"),
            self.record("margin_audit"),
            *survey,
        ]

    def summary_files(self) -> list[str]:
        return [self.file("summary", name=name) for name in layout.summary_outputs(self.config)]

    def manifest_files(self) -> list[str]:
        return self.study_results() + self.summary_files()

    def all_targets(self) -> list[str]:
        return [*self.manifest_files(), self.file("manifest"), self.file("bundle")]

    def cpu_targets(self, compiles_without_gpu) -> list[str]:
        """The records a machine without a GPU can make: pins, contract, the compiles of the
        variants `compiles_without_gpu(variant)` admits, the direction witness, the survey
        rows."""
        variants = [v for v in self.variants if compiles_without_gpu(v)]
        survey = [self.record("survey_rows")] if self.config.get("survey_summary") else []
        return [
            self.record("kernelbench_pin"),
            self.record("kernelbench_contract"),
            *self.artifact_files(variants),
            self.record("direction_witness"),
            *survey,
        ]
