"""The committed H200 run (results/reference/h200) summarised again, on the CPU.

Three ways in, one answer: `kbfuse summarize` (the library call), the summary, manifest and
bundle *rules* of a copy of the workflow run on the recorded result files, and the tables
checked against the raw case records they are built from. The tables are deterministic, so
the rebuilt CSV and Markdown must equal the committed ones byte for byte.

Running the aggregate rules on recorded files (what Snakemake 9 needs, found out here):
`--allowed-rules summary manifest bundle all` leaves every other rule out of the DAG, so the
recorded results are plain source files: no rule that could remake them is consulted, and
neither their missing job metadata nor their mtimes relative to one another matter. The
three aggregates are left out of the copy and rebuilt: their outputs are missing, so they
run. Copying the committed aggregates in instead would not be "up to date": without job
metadata Snakemake falls back to mtimes, and the library modules the summary rule lists as
inputs (copied with their repository mtimes) may be newer than them. After one real run the
metadata holds a checksum of every input: a recorded file that is only touched keeps the
tree up to date, a changed one reruns exactly summary, manifest and bundle. Without
`--allowed-rules` the same tree plans the whole study again (31 jobs), starting with the
KernelBench checkout, which is not committed.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml
from conftest import copy_workflow, snakemake
from summary_tables import assert_same_summary

from kbfuse.io import read_json
from kbfuse.layout import summary_outputs
from kbfuse.results.bundle import verify_bundle
from kbfuse.results.summary import build_tables
from kbfuse.tasks.kernelbench import recorded_config
from kbfuse.workflow import cli
from kbfuse.workflow.config import load_config

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "results/reference/h200"
SUMMARY = REFERENCE / "summary"
CONFIG = ROOT / "config/config.yaml"
BUNDLE = "bundle/kbfuse-results.tar.gz"
# Produced by the aggregate rules, so not copied into the workflow copy.
AGGREGATES = ("summary", "manifest.json", "bundle")
ALLOWED = ("--allowed-rules", "summary", "manifest", "bundle", "all")
FLUSHING = (
    "cupy-default",
    "nvrtc-cubin-ftz",
    "nvrtc-ptx-ftz",
    "nvrtc12-cubin-ftz",
    "nvrtc12-ptx-ftz",
)
KEEPING = ("nvrtc-cubin-noftz", "nvrtc-ptx-noftz", "nvrtc12-cubin-noftz", "nvrtc12-ptx-noftz")


@pytest.fixture(scope="module")
def config() -> dict:
    return load_config(CONFIG, ROOT / "kernels")


@pytest.fixture(scope="module")
def tables(config) -> dict[str, pd.DataFrame]:
    return build_tables(REFERENCE, config)


def recorded(rel: str) -> dict:
    return read_json(REFERENCE / rel)


# ---------------------------------------------------------------- kbfuse summarize


def test_summarize_rebuilds_the_committed_summary(config, tmp_path, capsys):
    out = tmp_path / "summary"
    rc = cli.main(["summarize", str(REFERENCE), "--config", str(CONFIG), "--out", str(out)])
    assert rc == cli.EXIT_OK
    printed = capsys.readouterr().out.split()
    assert sorted(Path(p).name for p in printed) == sorted(summary_outputs(config))
    assert len(printed) == 40  # 18 tables x (csv, md) + 3 tail plots + the bit-equality plot
    assert_same_summary(SUMMARY, out)


def test_summarize_refuses_a_config_for_another_kernelbench_commit(tmp_path, capsys):
    cfg = yaml.safe_load(CONFIG.read_text())
    cfg["kernelbench"]["commit"] = "0" * 40
    other = tmp_path / "other.yaml"
    other.write_text(yaml.safe_dump(cfg))
    args = ["summarize", str(REFERENCE), "--config", str(other), "--out", str(tmp_path / "s")]
    assert cli.main(args) == cli.EXIT_PROBLEMS
    err = capsys.readouterr().err
    assert "kernelbench/pin.json: field commit is '423217d9" in err
    assert "stale or tampered" in err
    assert not (tmp_path / "s").exists()  # refused before any table is written


def test_summarize_names_a_missing_result_and_a_missing_config(tmp_path, capsys):
    out = str(tmp_path / "s")
    args = ["summarize", str(tmp_path), "--config", str(CONFIG), "--out", out]
    assert cli.main(args) == cli.EXIT_PROBLEMS
    assert "summary input " in capsys.readouterr().err
    missing = str(tmp_path / "nope.yaml")
    args = ["summarize", str(REFERENCE), "--config", missing, "--out", out]
    assert cli.main(args) == cli.EXIT_CANNOT_RUN
    assert f"config file {missing} does not exist" in capsys.readouterr().err


# ---------------------------------------------------------------- tables vs records


def test_correctness_rows_are_the_recorded_task_variant_files(config, tables):
    files = {
        (int(p.parent.name), p.stem)
        for p in (REFERENCE / "correctness").glob("*/*.json")
        if p.stem != "baselines"
    }
    assert len(files) == 33
    assert files == {(t, v) for t in config["tasks"] for v in config["variants"]}
    df = tables["correctness"]
    assert list(zip(df["task"], df["variant"], strict=True)) == [
        (t, v) for t in config["tasks"] for v in config["variants"]
    ]
    for row in df.itertuples():
        rec = recorded(f"correctness/{row.task}/{row.variant}.json")
        cases = rec["cases"]
        assert row.cases == len(cases) == rec["summary"]["cases"]
        assert row.elements == sum(c["elements"] for c in cases) == rec["summary"]["elements"]
        assert row.elements_bit_equal == sum(c["bit_equal"] for c in cases)
        assert row.elements_bit_equal == rec["summary"]["elements_bit_equal"]
        assert row.bit_identical_cases == sum(c["bit_equal"] == c["elements"] for c in cases)
        assert row.official_passes == sum(c["official_pass"] for c in cases)
        assert row.passed == rec["passed"] is True
    # The recorded numbers themselves: every variant passes the gate on every task; only
    # the variants that keep subnormals are bit-identical on every element.
    by = df.set_index(["task", "variant"])
    assert by.loc[(81, "nvrtc-cubin-noftz"), "elements"] == 220_200_960
    assert by.loc[(81, "cupy-default"), "elements_bit_equal"] == 219_840_412
    for task in config["tasks"]:
        for v in KEEPING:
            row = by.loc[(task, v)]
            assert row["elements_bit_equal"] == row["elements"]
            assert row["bit_identical_cases"] == row["cases"]
        for v in FLUSHING:
            assert by.loc[(task, v), "elements_bit_equal"] < by.loc[(task, v), "elements"]


def test_case_tables_hold_every_recorded_case_once(config, tables):
    expected = []
    for task in config["tasks"]:
        for v in config["variants"]:
            rec = recorded(f"correctness/{task}/{v}.json")
            expected += [(task, v, c["name"], c["elements"], c["bit_equal"]) for c in rec["cases"]]
        base = recorded(f"correctness/{task}/baselines.json")["implementations"]
        for impl in ("torchscript", "inductor"):
            expected += [
                (task, impl, c["name"], c["elements"], c["bit_equal"]) for c in base[impl]["cases"]
            ]
    df = tables["correctness_cases"]
    cols = ["task", "implementation", "name", "elements", "bit_equal"]
    assert list(df[cols].itertuples(index=False, name=None)) == expected
    assert len(expected) == 1209  # (30 + 30 + 33 cases) x (11 variants + 2 baselines)

    tiny = []
    for task in config["tasks"]:
        ctl = recorded(f"controls/{task}.json")["tiny_values"]
        tiny += [(task, v, c["name"], c["bit_equal"]) for v in ctl for c in ctl[v]["cases"]]
    df = tables["tiny_values"]
    got = df[["task", "variant", "name", "bit_equal"]].itertuples(index=False, name=None)
    assert sorted(got) == sorted(tiny)
    assert len(tiny) == 3 * 11 * 5  # tasks x variants x control cases


def test_timing_rows_are_the_recorded_measurements(config, tables):
    for scope in ("full", "tail"):
        df = tables[f"timing_{scope}"]
        expected = set()
        for task in config["tasks"]:
            tim = recorded(f"timing/{task}.json")
            assert tim["skipped"] == {}
            for key, per_impl in tim["measurements"].items():
                if key.startswith(scope + "/"):
                    method = key.partition("/")[2]
                    for impl, m in per_impl.items():
                        expected.add((task, impl, method, len(m["samples_ms"]), m["median_ms"]))
        got = df[["task", "impl", "method", "rounds", "median_ms"]].itertuples(index=False)
        assert {tuple(r) for r in got} == expected
        assert len(df) == 3 * 2 * 14  # tasks x methods x (3 baselines + 11 variants)
    assert tables["skipped"].empty


def test_compiler_contract_shows_cupys_hidden_ftz(config, tables):
    df = tables["compiler_contract"].set_index("variant")
    assert list(df.index) == list(config["variants"])
    cupy = df.loc["cupy-default"]
    assert cupy["requested_ftz"] is None  # the options do not name --ftz
    assert [cupy["expected_ftz"], cupy["effective_ftz"]] == [True, True]
    assert cupy["implicit_options"] == "-ftz=true"
    assert "implicit -ftz=true flushes subnormals" in cupy["finding"]
    flags = df[["requested_ftz", "expected_ftz", "effective_ftz"]].astype(object)
    for v in KEEPING:
        assert flags.loc[v].tolist() == [False, False, False]
        assert df.loc[v, "finding"] == ""
    for v in ("nvrtc-cubin-ftz", "nvrtc-ptx-ftz"):
        assert flags.loc[v].tolist() == [True, True, True]
    assert not df["mismatch"].any()
    # CuPy's default route and --ftz=true on the cubin route give the same cubin.
    assert df.loc["cupy-default", "artifact_sha256"] == df.loc["nvrtc-cubin-ftz", "artifact_sha256"]
    # As committed (CSV): a blank requested_ftz, True/True and the finding.
    csv = pd.read_csv(SUMMARY / "compiler_contract.csv").set_index("variant")
    assert pd.isna(csv.loc["cupy-default", "requested_ftz"])
    assert csv.loc["cupy-default", ["expected_ftz", "effective_ftz"]].tolist() == [True, True]
    assert csv.loc[list(KEEPING), "effective_ftz"].tolist() == [False] * len(KEEPING)


def test_witness81_table_is_the_recorded_witness(tables):
    df = tables["witness81"]
    w = recorded("controls/witness81.json")
    assert len(df) == sum(len(records) for records in w["variants"].values()) == 22
    at88 = df[df["input"] == -88.0].set_index("variant")
    assert set(at88["reference_bits"]) == {"0x82b54ddb"}
    assert set(at88["reference"]) == {-2.6640246534862188e-37}
    for v in FLUSHING:
        assert at88.loc[v, "output_bits"] == "0x80000000"  # -0.0
        assert not at88.loc[v, "bit_equal"]
    for v in KEEPING:
        assert at88.loc[v, "output_bits"] == "0x82b54ddb"
        assert at88.loc[v, "bit_equal"]


# ---------------------------------------------------------------- the rules on recorded files


def make_recorded_copy(dest: Path) -> tuple[Path, Path]:
    """A copy of the workflow with the recorded results (without the aggregates) under
    results/, and a config overlay with the recorded KernelBench pin; (workdir, overlay)."""
    workdir = copy_workflow(dest)
    shutil.copytree(
        REFERENCE,
        workdir / "results",
        ignore=lambda d, names: AGGREGATES if d == str(REFERENCE) else (),
    )
    # As after a run, the results are newer than the code that made them (a fresh clone
    # writes files in no particular order, so their checkout times say nothing).
    now = time.time()
    for path in (workdir / "results").rglob("*"):
        os.utime(path, (now, now))
    pin = read_json(REFERENCE / "kernelbench/pin.json")
    overlay = workdir / "recorded-config.yaml"
    cfg = {"kernelbench": {"url": pin["url"], "commit": pin["commit"]}, "arch": "auto"}
    overlay.write_text(yaml.safe_dump(cfg))
    return workdir, overlay


def run_aggregates(workdir: Path, overlay: Path, *extra: str):
    return snakemake(workdir, "--cores", "1", "all", *ALLOWED, "--configfile", str(overlay), *extra)


def planned_rules(proc) -> list[str]:
    if "Nothing to be done" in proc.stdout + proc.stderr:
        return []
    return sorted(re.findall(r"^(?:local)?rule (\w+):$", proc.stdout, re.M))


@pytest.fixture(scope="module")
def recorded_run(tmp_path_factory) -> tuple[Path, Path]:
    workdir, overlay = make_recorded_copy(tmp_path_factory.mktemp("recorded") / "wf")
    assert not (workdir / "results/summary").exists()
    run_aggregates(workdir, overlay)
    return workdir, overlay


def test_rules_on_recorded_files_rebuild_summary_manifest_bundle(recorded_run, config):
    workdir, _ = recorded_run
    results = workdir / "results"
    assert sorted(p.name for p in (results / "summary").iterdir()) == sorted(
        summary_outputs(config)
    )
    assert_same_summary(SUMMARY, results / "summary")

    report = verify_bundle(results / BUNDLE)
    assert report["ok"], report
    assert report["checked"] == 121
    assert report["changed"] == report["missing"] == report["extra"] == []
    pin = read_json(REFERENCE / "kernelbench/pin.json")
    assert report["pin"] == {"url": pin["url"], "commit": config["kernelbench"]["commit"]}
    assert report["environment"]["gpu"] == "NVIDIA H200"

    manifest = read_json(results / "manifest.json")
    committed = read_json(REFERENCE / "manifest.json")
    assert sorted(manifest["files"]) == sorted(committed["files"])
    # The rules record the KernelBench URL as recorded_url names it (a local path as "local
    # mirror"); a reference recorded with a local path differs from its rebuild there alone.
    expected_config = recorded_config(committed["config"])
    assert manifest["config"] == expected_config
    for key in ("fingerprint", "kernelbench_pin"):
        assert manifest[key] == committed[key], key
    for rel, entry in committed["files"].items():
        if not rel.endswith(".png"):
            assert manifest["files"][rel] == entry, rel
    same_plots = all(
        manifest["files"][rel] == entry
        for rel, entry in committed["files"].items()
        if rel.endswith(".png")
    )
    if same_plots and expected_config == committed["config"]:
        # the plots too (same matplotlib): the whole bundle is reproduced exactly
        assert (results / "manifest.json").read_bytes() == (
            REFERENCE / "manifest.json"
        ).read_bytes()
        assert (results / BUNDLE).read_bytes() == (REFERENCE / BUNDLE).read_bytes()


def test_recorded_files_stay_up_to_date_until_one_changes(recorded_run):
    workdir, overlay = recorded_run
    assert planned_rules(run_aggregates(workdir, overlay, "--dry-run")) == []
    # The whole study without --allowed-rules: the recorded run is complete, so nothing runs,
    # not even the KernelBench checkout the copy lacks (no job that would read it is due;
    # which jobs a code edit reruns is tests/test_workflow.py's business).
    full = snakemake(workdir, "--dry-run", "--cores", "1", "all", "--configfile", str(overlay))
    assert planned_rules(full) == []
    # Newer alone is not enough: the run recorded the checksum of every input, so a touched
    # but unchanged result keeps the aggregates up to date; a changed one reruns exactly them.
    timing = workdir / "results/timing/53.json"
    original, before = timing.read_bytes(), timing.stat()
    newer = (workdir / "results/manifest.json").stat().st_mtime_ns + 10**9
    try:
        os.utime(timing, ns=(newer, newer))
        assert planned_rules(run_aggregates(workdir, overlay, "--dry-run")) == []
        timing.write_bytes(original + b"\n")
        os.utime(timing, ns=(newer, newer))
        proc = run_aggregates(workdir, overlay, "--dry-run")
        assert planned_rules(proc) == ["all", "bundle", "manifest", "summary"]
        assert "Updated input files: results/timing/53.json" in proc.stdout
    finally:
        timing.write_bytes(original)
        os.utime(timing, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert planned_rules(run_aggregates(workdir, overlay, "--dry-run")) == []


# ---------------------------------------------------------------- README tables


def test_readme_tables_print_the_recorded_numbers(capsys):
    spec = importlib.util.spec_from_file_location("readme_tables", ROOT / "tools/readme_tables.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    assert tool.main([]) == 0
    out = capsys.readouterr().out
    # docs/h200-reference.md is this output under a title: regenerate it with the tool
    committed = (ROOT / "docs/h200-reference.md").read_text()
    assert committed == "# The H200 reference run: every table\n\n" + out
    sections = re.split(r"^### ", out, flags=re.M)
    rows = [len(re.findall(r"^\| (?!:|variant|task)", s, re.M)) for s in sections[1:]]
    # variants; (variants + 2 baselines) x tasks; 14 x 3; variants x tasks; 11 x 2; twins;
    # tasks x routes; timed blocks
    assert rows == [11, 39, 42, 33, 22, 5, 6, 30]
    assert "NVIDIA H200 (132 SMs), driver 580.159.04" in sections[0]
    cupy = re.search(r"^\| cupy-default .*$", sections[1], re.M).group(0)
    assert "`-ftz=true`" in cupy and "| not named " in cupy and "85 (0 in" in cupy
    assert "| 81     | nvrtc-cubin-noftz        | pass   | 29/30 " in sections[2]
    assert "0 of 220,200,960" in sections[2] and "360,548 of 220,200,960" in sections[2]
    assert "39 case records fail the official predicate: `tail/nonfinite`." in sections[2]
    tail81 = re.search(r"^\| 81 +\| nvrtc-cubin-noftz .*$", sections[3], re.M).group(0)
    assert "| 35.6 " in tail81 and "3.14 (3.12–3.15)" in tail81 and "vs inductor" in tail81
    fast95 = re.search(r"^\| 95 +\| fast-nvrtc-cubin-noftz .*$", sections[4], re.M).group(0)
    assert "| 0 of 4,294,967,296 " in fast95 and "| yes " in fast95
    assert "| 50,513,346 of 4,294,967,296 " in sections[4]  # task 81 or 95, FTZ on
    assert "| -88 " in sections[5] and "-0.0 (`0x80000000`)" in sections[5]
    assert "-2.6640246534862188e-37 (`0x82b54ddb`)" in sections[5]
    twins = re.search(r"^\| nvrtc-cubin-ftz / nvrtc12-cubin-ftz .*$", sections[6], re.M).group(0)
    assert twins.count("151,358,334 inputs differ") == 2 and "nvrtc 12.9:" in twins
    assert "| 95     | nvrtc-cubin | 1.0308 (1.0283–1.0320)" in sections[7]
    # the two-band block (task 81's small-shape tail in CUDA graphs), its round levels removed
    small81 = re.search(r"^\| 81 +\| small/tail/graph .*$", sections[8], re.M).group(0)
    assert re.split(r" *\| *", small81)[3:6] == ["0.996", "0.994", "0.992–1.012"]
    assert "- 18 CUDA-graph blocks: first / others 0.995–1.002 (median 1.000)" in sections[8]
    assert "- 12 event-timed blocks: first / others 0.963–1.034 (median 0.993)" in sections[8]


def test_readme_and_findings_quote_the_reference_times():
    """The time figures README's findings and docs/findings.md quote are the reference run's."""
    tail = pd.read_csv(SUMMARY / "timing_tail.csv")
    fast = tail[(tail["method"] == "graph") & tail["impl"].str.startswith("fast-")]
    over_best = {
        task: sorted(f"{v:.2f}" for v in group["best_compiled_over_impl"])
        for task, group in fast.groupby("task")
    }
    assert over_best == {53: ["0.99", "0.99"], 81: ["0.93", "0.94"], 95: ["0.93", "0.93"]}
    floor = {task: sorted(round(v) for v in g["pct_of_floor"]) for task, g in fast.groupby("task")}
    assert floor == {53: [85, 85], 81: [67, 67], 95: [53, 53]}
    ftz = pd.read_csv(SUMMARY / "ftz_cost.csv")
    percent = {}
    for task, group in ftz.groupby("task"):
        costs = pd.concat([group["on_over_off"], group["on_over_off_balanced"]])
        percent[task] = (f"{100 * (costs.min() - 1):.1f}", f"{100 * (costs.max() - 1):.1f}")
    assert percent == {53: ("0.7", "0.7"), 81: ("0.5", "0.6"), 95: ("3.0", "3.2")}
    readme = (ROOT / "README.md").read_text()
    findings = (ROOT / "docs/findings.md").read_text()
    quoted_in_readme = (
        "0.93-0.94x of Inductor's speed",
        "(0.99x, quartiles 0.98-1.00)",
        "0.5-0.7 % slower on\n  tasks 53 and 81 and 3.0-3.2 %",
    )
    quoted_in_findings = (
        "0.94x and 0.93x of Inductor's speed on tasks 81 and 95 (67 % and 53 %",
        "(0.99x,\n  quartiles 0.98-1.00; 85 % of the floor)",
        "0.7 % slower on task 53, 0.5-0.6 % on task 81 and 3.0-3.2 % on task 95",
    )
    for quoted in quoted_in_readme:
        assert quoted in readme, quoted
    for quoted in quoted_in_findings:
        assert quoted in findings, quoted


def test_readme_and_findings_quote_the_pooled_position_figures():
    """The position figures README and docs/findings.md quote: the summary's pooled
    position_effect table and the bands of task 81's small-shape tail (tools/round_bands.py)."""
    from kbfuse.results.rounds import read_block, two_bands

    df = pd.read_csv(SUMMARY / "position_effect.csv")
    events = df["block"].str.endswith("/events")
    graph, timed = df[~events], df[events]

    def span(values) -> str:
        return f"{values.min():.3f}-{values.max():.3f}"

    assert (len(graph), len(timed)) == (18, 12)
    assert span(graph["first_over_others"]) == "0.995-1.002"
    assert span(graph["last_over_others"]) == "0.994-1.007"
    assert span(timed["first_over_others"]) == "0.963-1.034"
    assert f"{timed['first_over_others'].median():.3f}" == "0.993"
    assert f"{timed['each_position_min'].min():.3f}-{timed['each_position_max'].max():.3f}" == (
        "0.957-1.047"
    )
    small81 = df[(df["task"] == 81) & (df["block"] == "small/tail/graph")].iloc[0]
    assert (f"{small81.first_over_others:.3f}", f"{small81.last_over_others:.3f}") == (
        "0.996",
        "0.994",
    )
    bands = two_bands(read_block(REFERENCE, 81, "small/tail/graph"))
    assert (bands["slow_rounds"][0], bands["slow_rounds"][-1]) == (4, 15)
    levels = (f"{bands['slow_level_ms'] * 1e3:.2f}", f"{bands['fast_level_ms'] * 1e3:.2f}")
    assert levels == ("4.50", "3.04")
    readme = " ".join((ROOT / "README.md").read_text().split())
    findings = " ".join((ROOT / "docs/findings.md").read_text().split())
    for quoted in ("is 0.995-1.002 in every CUDA-graph block", "0.963-1.034 like any position",
                   "in rounds 4-15 every one-kernel graph"):  # fmt: skip
        assert quoted in readme, quoted
    for quoted in (
        "first / others is 0.995-1.002 and last / others 0.994-1.007",
        "0.963-1.034 (median 0.993)",
        "(each position over the others: 0.957-1.047)",
        "where the pooled reading gives 0.996 first and 0.994 last",
        "Rounds 4-15 of 25 ran at a level of 4.50 µs per call, the others at 3.04 µs",
        "took 2 % longer (10.09 against 10.30 µs)",
    ):
        assert quoted in findings, quoted
