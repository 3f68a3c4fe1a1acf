"""Build Snakemake's HTML report of a recorded run (default: results/reference/h200).

    python tools/reference_report.py [--reference DIR] [--out FILE] [--workdir DIR]
    python tools/reference_report.py --aggregates [--reference DIR] [--workdir DIR]
        [--kernelbench PATH]

Contract: writes one self-contained HTML file (default `reference-report.html`) whose
tables, plots, config and environment are those *recorded* with the run, not the current
checkout's; no GPU and no network are needed. Nothing is written to the repository except
`--out`; on any failure no report file is left behind.

Why a script and not a bare `snakemake --report`: the recorded results come without
Snakemake's per-job metadata (it lives in `.snakemake/`, not in the results), so a naive
report warns "Missing metadata" for every file and names no job, and it shows whatever
`config/config.yaml` says today. Here, in a scratch copy of the workflow:

1. `config/config.yaml` is replaced by the resolved config recorded in the run's
   `manifest.json`, so the report's config, its description and the rebuilt tables are the
   recorded ones;
2. the recorded result files go under `results/` without the aggregates (summary, manifest,
   bundle), which the workflow's own rules rebuild from them; `--allowed-rules` (those three
   and the one below) keeps every other rule out of the DAG, so the GPU stages' files are
   plain inputs and nothing is recomputed or fetched;
3. one more rule, in the copy only, renders each summary table as HTML, which the report
   shows in the page (CSV and Markdown are only offered as downloads);
4. `snakemake --report` with the same `--allowed-rules` then finds job metadata for every
   job in its DAG: no "Missing metadata" warning (without them, every recorded GPU-stage
   file is a job output without metadata, one warning each).

The environment table in the report is the recorded fingerprint (`env/fingerprint.json`).

With `--aggregates` no report is built: the same copy rebuilds the run's summary, manifest and
bundle with the current code and they replace the run's own (nothing else is written). That is
how a committed reference follows a change to the summary's code (a new estimator, a new
column) without a GPU: its recorded results stay as they are, byte for byte.

Two kinds of change since a run are bridged, each checked rather than assumed: a config key
retired since (`kbfuse.workflow.config.RETIRED_KEYS`, e.g. `tolerance`) is dropped from the
recorded config; and a run made before kbfuse read the official check from the pinned
KernelBench (no `kernelbench/contract.json`) gets its contract read now from a clone of the
pinned commit (`--kernelbench PATH`, any clone or mirror that holds it), by the function the
workflow's rule calls, and kept with the aggregates. The summary then refuses the run unless
every record it judged names the contract's tolerance, so neither step can change a verdict
silently.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from kbfuse.errors import KbfuseError

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_REFERENCE = ROOT / "results/reference/h200"
WORKFLOW_FILES = ("Snakefile", "workflow", "config", "kernels", "src", "profiles", "envs")
# Made by the aggregate rules from the other recorded files, so rebuilt, never copied.
AGGREGATES = ("summary", "manifest.json", "bundle")
CONTRACT = "kernelbench/contract.json"
ALLOWED = ("--allowed-rules", "summary", "manifest", "bundle", "report_tables", "all")
# Snakemake's report shows HTML files in the page but offers CSV and Markdown only as
# downloads: in the scratch copy, one more rule renders each summary table as HTML, with the
# table's own caption and category. The repository's workflow is not changed.
TABLES_RULE = """

rule report_tables:
    input:
        [f"results/summary/{name}" for name in summary_outputs(config) if name.endswith(".csv")],
    output:
        [
            report(
                f"results/report/{name[:-4]}.html",
                caption=f"workflow/report/{caption_name(name)}",
                category=report_category(name),
                subcategory="Tables",
            )
            for name in summary_outputs(config)
            if name.endswith(".csv")
        ],
    run:
        import pandas as pd

        for src, dst in zip(input, output):
            table = pd.read_csv(src).to_html(index=False, na_rep="", border=0)
            head = f"<!DOCTYPE html><meta charset=utf-8><style>{STYLE}</style>"
            Path(dst).write_text(head + table)
"""
STYLE = (
    "table{border-collapse:collapse;font:13px sans-serif}"
    "th,td{border:1px solid #ccc;padding:2px 6px;text-align:left;white-space:nowrap}"
    "th{background:#eee}"
)


def recorded_config(reference: Path) -> dict:
    """The resolved config recorded in the run's manifest."""
    manifest = reference / "manifest.json"
    if not manifest.is_file():
        raise KbfuseError(f"{manifest}: no manifest, so no recorded config to report")
    config = json.loads(manifest.read_text()).get("config")
    if not isinstance(config, dict):
        raise KbfuseError(f"{manifest}: field 'config' is {config!r}, not a mapping")
    return config


def in_checkout_order(config: dict) -> dict:
    """`config` with its variants in the order of the checkout's config/config.yaml (those it
    does not name after them, sorted). The manifest records mappings with sorted keys, and
    the summary's tables list variants in config order: a rebuild in sorted order would move
    their rows."""
    current = yaml.safe_load((ROOT / "config/config.yaml").read_text()) or {}
    order = list(current.get("variants") or {})
    variants = config.get("variants") or {}
    names = [n for n in order if n in variants] + sorted(set(variants) - set(order))
    return {**config, "variants": {name: variants[name] for name in names}}


def without_retired_keys(config: dict) -> dict:
    from kbfuse.workflow.config import RETIRED_KEYS

    return {key: value for key, value in config.items() if key not in RETIRED_KEYS}


def read_contract_at_pin(results: Path, config: dict, kernelbench: Path | None) -> None:
    """Write results/kernelbench/contract.json from a clone of the pinned commit, older than
    the recorded results (as the workflow's rule would have written it first)."""
    from kbfuse.tasks.evaluator import write_contract

    if kernelbench is None:
        raise KbfuseError(
            f"the recorded run has no {CONTRACT} (made before kbfuse read the official check "
            "from the pinned KernelBench): give --kernelbench PATH, a clone that holds the "
            "pinned commit, to read it"
        )
    checkout = results / "kernelbench/checkout"
    commit = config["kernelbench"]["commit"]
    for args in (("clone", "-q", "--no-checkout", str(kernelbench), str(checkout)),
                 ("-C", str(checkout), "checkout", "-q", commit)):  # fmt: skip
        done = subprocess.run(["git", *args], capture_output=True, text=True, timeout=300)
        if done.returncode != 0:
            raise KbfuseError(f"git {' '.join(args)}: {done.stderr.strip()}")
    write_contract(checkout, results / "kernelbench/checkout.json", results / CONTRACT)
    shutil.rmtree(checkout)
    then = time.time() - 60
    os.utime(results / CONTRACT, (then, then))


def make_recorded_workdir(reference: Path, dest: Path, kernelbench: Path | None = None) -> Path:
    """A copy of the workflow at `dest` with the recorded config and results; returns dest."""
    config = in_checkout_order(without_retired_keys(recorded_config(reference)))
    if dest.exists():
        raise KbfuseError(f"--workdir {dest}: exists; give a folder that does not exist yet")
    dest.mkdir(parents=True)
    for name in WORKFLOW_FILES:
        src = ROOT / name
        ignore = shutil.ignore_patterns("__pycache__", "*.egg-info")
        if src.is_dir():
            shutil.copytree(src, dest / name, ignore=ignore)
        else:
            shutil.copy2(src, dest / name)
    (dest / "config/config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    snakefile = dest / "Snakefile"
    snakefile.write_text(snakefile.read_text() + f"\n\nSTYLE = {STYLE!r}\n" + TABLES_RULE)
    top = str(reference)
    shutil.copytree(
        reference, dest / "results", ignore=lambda d, names: AGGREGATES if d == top else ()
    )
    # Results newer than the code that made them, as after a run (a clone's file times
    # say nothing about which was written first).
    now = time.time()
    for path in (dest / "results").rglob("*"):
        os.utime(path, (now, now))
    if not (dest / "results" / CONTRACT).is_file():
        read_contract_at_pin(dest / "results", config, kernelbench)
    return dest


def snakemake(workdir: Path, *args: str) -> str:
    """Run snakemake in workdir with the copy's own kbfuse first on the path; its output."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(workdir / "src"), env.get("PYTHONPATH")]))
    proc = subprocess.run(
        [sys.executable, "-m", "snakemake", *args],
        cwd=workdir,
        env=env,
        capture_output=True,
        text=True,
    )
    output = proc.stdout + proc.stderr
    if proc.returncode != 0:
        raise KbfuseError(f"snakemake {' '.join(args)} failed ({proc.returncode}):\n{output}")
    return output


def build_report(reference: Path, out: Path, workdir: Path) -> str:
    """Write the report of `reference` to `out`, working in `workdir` (must not exist).
    Returns Snakemake's output of both calls."""
    make_recorded_workdir(reference, workdir)
    log = snakemake(workdir, "--cores", "1", "all", "report_tables", *ALLOWED)
    page = workdir / "report.html"
    log += snakemake(workdir, "--report", str(page), "all", "report_tables", *ALLOWED)
    out.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(page, out)
    return log


def rebuild_aggregates(reference: Path, workdir: Path, kernelbench: Path | None = None) -> str:
    """Rebuild `reference`'s summary, manifest and bundle in `workdir` (must not exist) with
    the current code (and its official contract, when the run has none), then put them in
    place of the reference's own. Returns Snakemake's output. On any failure before the copy
    the reference is left as it was."""
    make_recorded_workdir(reference, workdir, kernelbench)
    log = snakemake(workdir, "--cores", "1", "all", *ALLOWED)
    if not (reference / CONTRACT).is_file():
        shutil.copy2(workdir / "results" / CONTRACT, reference / CONTRACT)
    for name in AGGREGATES:
        rebuilt, target = workdir / "results" / name, reference / name
        if rebuilt.is_dir():
            shutil.rmtree(target, ignore_errors=True)
            shutil.copytree(rebuilt, target)
        else:
            shutil.copyfile(rebuilt, target)
    return log


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reference", type=Path, default=DEFAULT_REFERENCE)
    parser.add_argument("--out", type=Path, default=Path("reference-report.html"))
    parser.add_argument("--workdir", type=Path, help="scratch copy (default: a temporary one)")
    parser.add_argument(
        "--kernelbench",
        type=Path,
        help="with --aggregates: a clone holding the pinned commit, to read the official "
        "contract of a run recorded without one",
    )
    parser.add_argument(
        "--aggregates",
        action="store_true",
        help="rebuild the run's summary, manifest and bundle in place instead of a report",
    )
    args = parser.parse_args(argv)
    reference = args.reference.resolve()

    def build(workdir: Path) -> None:
        if args.aggregates:
            rebuild_aggregates(reference, workdir, args.kernelbench)
        else:
            build_report(reference, args.out, workdir)

    try:
        if args.workdir is not None:
            build(args.workdir)
        else:
            with tempfile.TemporaryDirectory(prefix="kbfuse-report-") as tmp:
                build(Path(tmp) / "wf")
    except KbfuseError as exc:
        print(f"reference_report: {exc}", file=sys.stderr)
        return 1
    print(*(reference / name for name in AGGREGATES) if args.aggregates else [args.out], sep="\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
