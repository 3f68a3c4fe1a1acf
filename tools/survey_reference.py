"""Copy a finished survey run's results into a reference folder, with a manifest of them.

    python tools/survey_reference.py --results RUN/results --out results/reference/h200/survey

A run of another level (`survey.level`) is a reference of its own, beside level 2's (for
example `--out results/reference/h200/survey-level3`): each run has its machine's fingerprint.
Copies, keeping their paths under `results/`: every survey record and summary file
(`kbfuse.results.manifest.survey_files`), the task list and per-task pins, the survey jobs'
Snakemake benchmark files (of level 2 under `survey/`, of every other level surveyed there
under `survey/level<N>/`), the environment fingerprint and the KernelBench checkout record
(the survey's pin of the commit) and the official contract every record was judged by
(`kernelbench/contract.json`, read from the pinned evaluator). The job logs stay out: their
warnings quote the run machine's paths. Then writes `manifest.json` over the copies (the
manifest quotes the checkout record as its pin), with the study config that was in force
(`--config`, the default config/config.yaml). Check it with `kbfuse verify-bundle FOLDER`.

A run may hold several levels (level 2's files, and `survey/level<N>/` beside them). Only
levels whose summary exists are kept (a level the run did not finish is named and left out),
or only `--level N`'s.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from kbfuse.errors import KbfuseError  # noqa: E402
from kbfuse.io import copy_files  # noqa: E402
from kbfuse.layout import RECORDS, survey_root  # noqa: E402
from kbfuse.results.manifest import (  # noqa: E402
    CHECKOUT_PIN,
    FINGERPRINT,
    build_manifest,
    survey_files,
)
from kbfuse.workflow.config import load_config  # noqa: E402

FINGERPRINT_TARGET = "results/env/fingerprint.json"
SUMMARY = re.compile(r"survey/(level\d+/)?summary/")  # level 2's, or another level's
LEVEL = re.compile(r"(?:^|/)survey/level(\d+)/")  # a file of a level other than 2
CONTRACT = RECORDS["kernelbench_contract"].path
EXTRA_GLOBS = tuple(
    pattern.format(root=root)
    for root in ("survey", "survey/level*")
    for pattern in ("{root}/task_list.json", "{root}/pins/*.json", "benchmarks/{root}/*.tsv")
)


def level_of(rel: str) -> int:
    """The survey level a result file belongs to (level 2's have no `survey/level<N>/`)."""
    match = LEVEL.search(rel)
    return int(match[1]) if match else 2


def reference_files(results: Path, level: int | None = None) -> list[str]:
    """The files a survey reference keeps (relative POSIX paths, sorted): those of `level`,
    or of every level that has a summary."""
    found = set(survey_files(results))
    for pattern in EXTRA_GLOBS:
        found.update(p.relative_to(results).as_posix() for p in results.glob(pattern))
    summarised = {level_of(rel) for rel in found if SUMMARY.match(rel)}
    kept = {level} if level is not None else summarised
    for left_out in sorted({level_of(rel) for rel in found} - kept):
        why = "" if level is not None or left_out in summarised else " (no summary: unfinished)"
        print(f"survey_reference: level {left_out} left out{why}", file=sys.stderr)
    found = {rel for rel in found if level_of(rel) in kept}
    for required in (FINGERPRINT, CHECKOUT_PIN, CONTRACT):
        if not (results / required).is_file():
            raise KbfuseError(
                f"{results / required} is missing: run `snakemake survey {FINGERPRINT_TARGET}`"
                " to its end first"
            )
        found.add(required)
    if not any(SUMMARY.match(rel) for rel in found):
        where = (
            "survey/summary (or survey/level<N>/summary)"
            if level is None
            else f"{survey_root(level)}/summary"
        )
        raise KbfuseError(f"{results}/{where} holds nothing: run the survey to its end")
    return sorted(found)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, required=True, help="a finished run's results")
    parser.add_argument("--out", type=Path, required=True, help="the reference folder")
    parser.add_argument("--config", type=Path, default=ROOT / "config" / "config.yaml")
    parser.add_argument(
        "--level", type=int, help="keep this survey level only (default: every finished one)"
    )
    args = parser.parse_args(argv)
    try:
        files = reference_files(args.results, args.level)
        config = load_config(args.config)
        copy_files(args.results, files, args.out)
        build_manifest(args.out, files, config, args.out / "manifest.json", pin=CHECKOUT_PIN)
    except (KbfuseError, OSError) as exc:
        print(f"survey_reference: {exc}", file=sys.stderr)
        return 1
    print(f"{len(files)} files and manifest.json in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
