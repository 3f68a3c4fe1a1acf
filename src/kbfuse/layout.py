"""Where every file of a run lives, and what the summary reads and writes: one table each.

The rules (workflow/rules/*.smk), the summary, the tools and the tests name a result by what it
is (its record kind, or one of FILES) and get its path from here; no other module spells a path
under results/. Paths are relative to the workflow root; a `{task}` or `{variant}` left
unfilled stays a Snakemake wildcard.

- RECORDS: every result record, by kind (the `kind` field it carries and the name of its JSON
  Schema, src/kbfuse/schemas/<kind>.schema.json), with the tasks it exists for;
- FILES: the other files (compiled artifacts, the KernelBench checkout, summary, manifest,
  bundle, check verdicts, an audit's folder, whose files are AUDIT_FILES); logs and
  benchmarks go to results/logs/<stage>.log and results/benchmarks/<stage>.tsv;
- TABLES: every summary table, in the order it is written, with what it holds and where the
  workflow report shows it. A table named `x` is built by `kbfuse.results.summary.x_table` and
  captioned by workflow/report/x.rst; adding a table is one row here plus those two. A table
  marked `second_study` exists only in a study that is compared with the survey (a config with
  `survey_summary`: the second fused study, kbfuse.workflow.studies), so the first study's
  summary keeps exactly its tables.

Kept free of torch and pandas so that the Snakefile can import it at parse time.
"""

from __future__ import annotations

import itertools
import string
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kbfuse.tasks.registry import WITNESS_TASK

RESULTS = "results"


@dataclass(frozen=True)
class Record:
    """A result record: its path under results/, the one task it needs (None: any), and the
    config key a study must set for it to be written (None: every study)."""

    path: str
    needs_task: int | None = None
    needs_config: str | None = None


RECORDS: dict[str, Record] = {
    "kernelbench_pin": Record("kernelbench/pin.json"),
    # the official check as the pinned evaluator makes it (kbfuse.tasks.evaluator)
    "kernelbench_contract": Record("kernelbench/contract.json"),
    "env": Record("env/fingerprint.json"),
    "compile": Record("compile/{variant}/meta.json"),
    "verify": Record("verify/{variant}.json"),
    "correctness": Record("correctness/{task}/{variant}.json"),
    "correctness_baselines": Record("correctness/{task}/baselines.json"),
    "timing": Record("timing/{task}.json"),
    "controls": Record("controls/{task}.json"),
    # The minimal task-81 witness: only a study that includes the witness task writes it.
    "witness81": Record("controls/witness81.json", needs_task=WITNESS_TASK),
    "margin_audit": Record("protocol/margin_audit.json"),
    # The survey's rows a study's prediction compares with (a study with `survey_summary`).
    "survey_rows": Record("prediction/survey_rows.json", needs_config="survey_summary"),
    "direction_witness": Record("protocol/direction_witness.json"),
}

FILES: dict[str, str] = {
    "checkout": "kernelbench/checkout",
    "checkout_record": "kernelbench/checkout.json",
    "task_pin": "kernelbench/tasks/{task}.json",
    "artifact": "compile/{variant}/tails.bin",
    "summary": "summary/{name}",
    "manifest": "manifest.json",
    "bundle": "bundle/kbfuse-results.tar.gz",
    # the survey (workflow/rules/survey*.smk): its task list, one pin and one record per task
    # (and numerics mode), their logs, the shared compile caches, the summary folder
    "survey_task_list": "survey/task_list.json",
    "survey_task_list_log": "survey/logs/task_list.log",
    # the cross-device check before the survey's task jobs (kbfuse.survey.agreement)
    "survey_devices": "survey/devices.json",
    "survey_devices_log": "survey/logs/devices.log",
    "survey_pin": "survey/pins/{survey_task}.json",
    "survey_pin_log": "survey/logs/pins/{survey_task}.log",
    "survey_floor": "survey/floors/{survey_task}.json",
    "survey_floor_log": "survey/logs/floors/{survey_task}.log",
    "survey_record": "survey/{numerics}/tasks/{survey_task}.json",
    "survey_log": "survey/logs/tasks/{survey_task}.log",
    "survey_cache": "survey/.cache",
    "survey_summary": "survey/summary",
    "survey_summary_log": "survey/logs/summary.log",
    # kbfuse check (workflow/rules/check.smk): one verdict per candidate, and their summary
    "check_verdict": "check/{candidate}.json",
    "check_summary": "check/summary/{name}",
    # kbfuse audit (workflow/rules/audit.smk): one folder per audited corpus, AUDIT_FILES in it
    "audit_root": "audit/{audit}",
}

# The files of one audit, under its folder (FILES["audit_root"], or `kbfuse audit --out`):
# the content-named candidate files (and task files, judged against the corpus's own
# references), the entries index, one verdict per entry and numerics mode, the summary.
AUDIT_FILES: dict[str, str] = {
    "candidate": "candidates/{entry}.py",
    "task": "tasks/{entry}.py",
    "index": "entries.json",
    "verdict": "verdicts/{numerics}/{entry}.json",
    "summary": "summary/{name}",
}


@dataclass(frozen=True)
class Table:
    """A summary table: one line saying what it holds, its workflow-report category, and
    whether only the second study (a config with `survey_summary`) writes it."""

    description: str
    category: str
    second_study: bool = False


TABLES: dict[str, Table] = {
    "correctness": Table(
        "task x variant: cases, official passes, bit identity, largest errors", "Bits"
    ),
    "correctness_cases": Table("every correctness case of every task x implementation", "Bits"),
    "baseline_bit_identity": Table("TorchScript and Inductor against eager, per task", "Bits"),
    "compiler_contract": Table(
        "variant: route, options, compiler, FTZ requested/expected/effective", "Bits"
    ),
    "timing_full": Table("full program time per task x implementation x method", "Time"),
    "timing_tail": Table(
        "tail time per task x implementation x method, against the copy floor", "Time"
    ),
    "small_shapes": Table("the small-shape timings per task", "Time"),
    "ftz_cost": Table("paired FTZ-on over FTZ-off cost per task and route", "Time"),
    "position_effect": Table(
        "per timed block: first (last) position over the others, round levels removed", "Time"
    ),
    "tiny_values": Table("tiny-value control cases per task x variant", "Bits"),
    "exhaustive": Table(
        "every float32 input per task x variant: outputs whose bits differ from eager", "Bits"
    ),
    "control_bit_equality": Table(
        "bit-equal elements per variant x control set (the plot's data)", "Bits"
    ),
    "witness81": Table("the minimal task-81 witness per variant and input", "Bits"),
    "toolchains": Table(
        "each variant beside its twin compiled by another NVRTC: artifact, FTZ, bits", "Bits"
    ),
    "margin_audit": Table("official vs historical error ratios of every audited record", "Bits"),
    "direction_witness": Table(
        "a float32 pair on which allclose(a, b) and allclose(b, a) disagree", "Bits"
    ),
    "skipped": Table(
        "implementations gated out of timing (main and small shape), with reasons", "Bits"
    ),
    "environment": Table("the fingerprint of the machine that produced the results", "Environment"),
    "contract": Table(
        "task x variant: the numerical contract named, and whether every case holds it",
        "Bits",
        second_study=True,
    ),
    "prediction": Table(
        "task x variant: end-to-end time beside the survey's prediction, tail vs copy floor",
        "Time",
        second_study=True,
    ),
}
PLOT_CONTROL_BIT_EQUALITY = "control_bit_equality.png"
PLOT_CATEGORY = "Plots"


class _KeepMissing(dict):
    """format_map helper: a wildcard not given stays `{name}`."""

    def __missing__(self, key: str) -> str:
        return "{" + key + "}"


def _under(results: str | Path, pattern: str, wildcards: Mapping[str, Any]) -> str:
    return f"{Path(results).as_posix()}/{pattern.format_map(_KeepMissing(wildcards))}"


def record(kind: str, /, results: str | Path = RESULTS, **wildcards: Any) -> str:
    """The path of the record of `kind` (wildcards not given stay Snakemake wildcards)."""
    return _under(results, RECORDS[kind].path, wildcards)


def file(name: str, /, results: str | Path = RESULTS, **wildcards: Any) -> str:
    """The path of one of FILES (wildcards not given stay Snakemake wildcards)."""
    return _under(results, FILES[name], wildcards)


def audit_file(name: str, /, root: str | Path, **wildcards: Any) -> str:
    """The path of one of AUDIT_FILES under an audit's folder `root` (wildcards not given
    stay Snakemake wildcards)."""
    return _under(root, AUDIT_FILES[name], wildcards)


# The survey of KernelBench level 2 lives under survey/; another level's under survey/level<N>/
# (its own task list, pins, records, logs and summary; the compile caches are shared).
SURVEY_LEVEL = 2


def survey_root(level: int = SURVEY_LEVEL) -> str:
    """The folder (under results/) of the survey of one KernelBench level."""
    return "survey" if level == SURVEY_LEVEL else f"survey/level{level}"


def survey_file(name: str, /, level: int = SURVEY_LEVEL, **wildcards: Any) -> str:
    """`file(name)` for the survey of `level` (the shared compile cache whatever the level)."""
    path = file(name, **wildcards)
    if name == "survey_cache" or level == SURVEY_LEVEL:
        return path
    return path.replace(f"{RESULTS}/survey/", f"{RESULTS}/{survey_root(level)}/", 1)


def log(stage: str, results: str | Path = RESULTS) -> str:
    """A job's log file; `stage` names it, e.g. "timing/{task}"."""
    return f"{Path(results).as_posix()}/logs/{stage}.log"


def benchmark(stage: str, results: str | Path = RESULTS) -> str:
    """A job's Snakemake benchmark file; `stage` as for `log`."""
    return f"{Path(results).as_posix()}/benchmarks/{stage}.tsv"


def wildcards_of(pattern: str) -> list[str]:
    """The wildcard names of a path pattern, in order."""
    return [name for _, name, _, _ in string.Formatter().parse(pattern) if name]


def record_keys(config: Mapping[str, Any]) -> Iterator[tuple]:
    """(kind, *wildcard values) of every record a run of `config` writes, in RECORDS order,
    tasks and variants in config order."""
    values = {"task": list(config["tasks"]), "variant": list(config["variants"])}
    for kind, entry in RECORDS.items():
        if entry.needs_task is not None and entry.needs_task not in values["task"]:
            continue
        if entry.needs_config is not None and not config.get(entry.needs_config):
            continue
        names = wildcards_of(entry.path)
        for combo in itertools.product(*(values[name] for name in names)):
            yield (kind, *combo)


def result_paths(config: Mapping[str, Any]) -> dict[tuple, str]:
    """Every record of a run, keyed by (kind, *wildcard values), relative to results/."""
    paths = {}
    for kind, *combo in record_keys(config):
        names = wildcards_of(RECORDS[kind].path)
        paths[(kind, *combo)] = RECORDS[kind].path.format(**dict(zip(names, combo, strict=True)))
    return paths


def record_files(
    config: Mapping[str, Any], kinds: Iterable[str], results: str | Path = RESULTS
) -> list[str]:
    """The paths of every record of `kinds` a run of `config` writes, kind by kind."""
    paths = result_paths(config)
    return [
        f"{Path(results).as_posix()}/{paths[key]}"
        for kind in kinds
        for key in paths
        if key[0] == kind
    ]


# --------------------------------------------------------------------------- the summary


def tail_plot_name(task: int) -> str:
    return f"tail_time_{task}.png"


def study_tables(config: Mapping[str, Any]) -> list[str]:
    """The names of the tables a study of `config` writes, in TABLES order."""
    second = bool(config.get("survey_summary"))
    return [name for name, table in TABLES.items() if second or not table.second_study]


def summary_outputs(config: Mapping[str, Any]) -> list[str]:
    """File names (relative to the summary directory) that `write_summary` writes."""
    names = [f"{table}.{ext}" for table in study_tables(config) for ext in ("csv", "md")]
    names += [tail_plot_name(task) for task in config["tasks"]]
    names.append(PLOT_CONTROL_BIT_EQUALITY)
    return names


def report_category(output: str) -> str:
    """The workflow-report category of one summary output (table or plot)."""
    if output.endswith(".png"):
        return PLOT_CATEGORY
    return TABLES[output.split(".")[0]].category


def caption_name(output: str) -> str:
    """The caption file in workflow/report/ for one summary output (table or plot)."""
    name = Path(output).name
    stem = name.split(".")[0]
    if name.endswith(".png"):
        return ("tail_time" if stem.startswith("tail_time_") else stem) + "_plot.rst"
    return f"{stem}.rst"


def summary_inputs(config: Mapping[str, Any], results_dir: str | Path = RESULTS) -> list[str]:
    """The input paths of the summary rule (results_dir joined), in a stable order."""
    return [str(Path(results_dir) / rel) for rel in result_paths(config).values()]
