"""The audit's claims-vs-measured table, tallies and plot from verdict records made here: one
real CPU verdict (tests/data/audit/verdict_cpu.json, kbfuse check of tests/candidates/cpu/
good.py) with its timing replaced by GPU-shaped `events` samples of known ratios, its
verdict, failed checks and findings set per case; the speedups recomputed by the check's own
kbfuse.candidates.verdict.speedups. Every figure asserted is one those samples give."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pandas as pd
import pytest

from kbfuse.audit import claims
from kbfuse.audit.corpus import Corpus, Entry, Skipped
from kbfuse.audit.mapping import load_mapping
from kbfuse.audit.materialise import materialise, read_index
from kbfuse.audit.references import pinned_digests, reference_status
from kbfuse.audit.settings import audit_settings
from kbfuse.audit.summary import OUTPUTS, write_audit_summary
from kbfuse.candidates import verdict as verdicts
from kbfuse.errors import KbfuseError
from kbfuse.io import write_json

DATA = Path(__file__).parent / "data" / "audit"
BASE = json.loads((DATA / "verdict_cpu.json").read_text())
REFERENCE = "import torch\n\nclass Model:\n    pass\n"
ONES = [1.0, 1.0, 1.0, 1.0]


def _measurement(samples: list[float]) -> dict:
    q1, median, q3 = pd.Series(samples).quantile([0.25, 0.5, 0.75])
    return {
        "median_ms": median,
        "q1_ms": q1,
        "q3_ms": q3,
        "samples_ms": samples,
        "positions": list(range(len(samples))),
    }


def verdict(
    candidate=ONES, eager=None, torchscript=None, inductor=None, failed=(), findings=(), mode=None
):
    """BASE with an `events` block of these samples (ms), this verdict, measured in `mode`."""
    record = copy.deepcopy(BASE)
    record["settings"]["numerics"] = mode
    block = {"candidate": _measurement(candidate)}
    for name, samples in (("eager", eager), ("torchscript", torchscript), ("inductor", inductor)):
        if samples is not None:
            block[name] = _measurement(samples)
    record["timing"] = {"events": block}
    record["speedup"] = verdicts.speedups(record["timing"])
    record["failed_checks"] = list(failed)
    for name in failed:
        record["checks"][name] = {"status": "fail", "detail": "made so by the test"}
    record["verdict"] = "fail" if failed else "pass"
    record["findings"] = list(findings)
    verdicts.validate(record, "the test's verdict")
    return record


# a check that did not start: the machine's scratch disk could not hold its cases
REFUSED = {
    "kind": "check_refused",
    "schema_version": 1,
    "candidate": {"file": "x.py", "sha256": "0" * 64},
    "task": {"level": 2, "task": 53, "file": "53_Gemm.py", "commit": None},
    "numerics": "kernelbench-defaults",
    "verdict": "not checked",
    "why": "needs 76.9 GB of scratch disk, 67.5 GB free here",
    "scratch": {"need_bytes": 76_900_000_000, "free_bytes": 67_500_000_000},
}

# (code, claims over eager / over torch.compile, verdict)
CASES = {
    "fast": (
        {"over_eager": 2.0, "over_torch_compile": 3.0},
        verdict(eager=[1.8, 2.0, 2.2, 2.4], torchscript=[2.0] * 4, inductor=[1.5] * 4),
    ),
    "blind": (
        {"over_eager": 80.0, "over_torch_compile": 20.0},
        verdict(eager=[4.0] * 4, inductor=[3.0] * 4, findings=["blind_spot", "not_bit_identical"]),
    ),
    "even": (
        {"over_eager": 1.0, "over_torch_compile": None},
        verdict(eager=[1.0] * 4, inductor=[0.9, 0.95, 1.05, 1.1]),
    ),
    "slow": (
        {"over_eager": 1.5, "over_torch_compile": 1.2},
        verdict(eager=[0.8] * 4, inductor=[0.5] * 4),
    ),
    "side": (
        {"over_eager": 13.0, "over_torch_compile": 5.0},
        verdict(eager=[13.0] * 4, inductor=[6.0] * 4, failed=["official", "side_stream"]),
    ),
    "weights": (
        {"over_eager": 3.0, "over_torch_compile": 2.0},
        verdict(eager=[3.0] * 4, inductor=[2.5] * 4, failed=["changed_weights"]),
    ),
    "untimed": ({"over_eager": 2.0, "over_torch_compile": 2.0}, None),
    "refused": ({"over_eager": 5.0, "over_torch_compile": 2.0}, REFUSED),
}


def _entry(code: str, claimed: dict) -> Entry:
    body = f"# {code}\nclass ModelNew:\n    pass\n"
    return Entry(f"c.json line {list(CASES).index(code) + 1}", 2, 53, body, REFERENCE, claimed)


@pytest.fixture(scope="module")
def audit(tmp_path_factory):
    """An audit folder: the index of CASES (and one skipped entry), a verdict per checked
    entry but `untimed`, a pinned checkout whose task 53 is the entries' reference."""
    root = tmp_path_factory.mktemp("audit")
    mapping = load_mapping("cuda_l1")
    entries = [_entry(code, claimed) for code, (claimed, _) in CASES.items()]
    skipped = [Skipped("c.json line 9", 2, 2, "the corpus holds no candidate code for it")]
    settings = audit_settings({"corpus": str(root / "c.json"), "mapping": "cuda_l1"})
    names = materialise(Corpus(str(root / "c.json"), entries, skipped, 3), mapping, settings, root)
    by_code = dict(zip(CASES, names, strict=True))
    paths = []
    for code, (_, record) in CASES.items():
        if record is not None:
            paths.append(root / "verdicts" / f"{by_code[code]}.json")
            write_json(paths[-1], record)
    checkout = root / "checkout"
    (checkout / "KernelBench" / "level2").mkdir(parents=True)
    (checkout / "KernelBench" / "level2" / "53_Gemm.py").write_text(REFERENCE)
    out = root / "summary"
    written = write_audit_summary(root / "entries.json", paths, checkout, out)
    frame = pd.read_csv(out / "table.csv")
    frame.index = [*CASES, "skipped"]
    return root, written, frame, by_code


def test_every_output_is_written(audit):
    root, written, _, _ = audit
    assert [p.name for p in written] == list(OUTPUTS)
    assert all(p.is_file() for p in written)


def test_measured_speedups_are_the_verdicts_paired_ratios(audit):
    _, _, frame, _ = audit
    fast = frame.loc["fast"]
    assert fast["method"] == "events"
    # eager [1.8, 2.0, 2.2, 2.4] over a candidate of 1 ms: ratios' quartiles 1.95, 2.1, 2.25
    assert (fast["measured_over_eager_q1"], fast["measured_over_eager"]) == pytest.approx(
        (1.95, 2.1)
    )
    assert fast["measured_over_eager_q3"] == pytest.approx(2.25)
    assert fast["best_compiled"] == "inductor"
    assert fast["measured_over_best_compiled"] == pytest.approx(1.5)
    # the torch.compile claim stands beside Inductor's ratio, read from the samples
    assert fast["against_over_torch_compile"] == "inductor"
    assert fast["measured_over_torch_compile"] == pytest.approx(1.5)
    assert frame.loc["slow", "measured_over_best_compiled"] == pytest.approx(0.5)


def test_claim_statuses(audit):
    _, _, frame, _ = audit
    assert frame.loc["fast", "status_over_eager"] == "reproduces"  # 2.0 <= q3 2.25
    assert frame.loc["fast", "status_over_torch_compile"] == "does not reproduce"  # 3.0 > 1.5
    assert frame.loc["blind", "status_over_eager"] == "does not reproduce"  # 80 > 4
    assert frame.loc["even", "status_over_torch_compile"] == "no claim"
    assert frame.loc["side", "status_over_eager"] == "fails check"
    assert frame.loc["untimed", "status_over_eager"] == "no verdict"
    assert frame.loc["skipped", "status_over_eager"] == "not checked"
    assert frame.loc["refused", "status_over_eager"] == "not checked"
    assert frame.loc["refused", "status_over_torch_compile"] == "not checked"
    assert frame.loc["refused", "claim_over_eager"] == 5.0
    assert frame.loc["fast", "claim_over_cuda_graph"] != frame.loc["fast", "claim_over_cuda_graph"]


def test_outcomes(audit):
    _, _, frame, _ = audit
    assert dict(frame["outcome"]) == {
        "fast": "passes and is faster than the best compiled",
        "blind": "passes only where a trivial output passes",
        "even": "passes, within the spread of the best compiled",
        "slow": "passes and is slower than the best compiled",
        "side": "fails: side stream",
        "weights": "fails: ignores changed weights",
        "untimed": "no verdict",
        "refused": "not checked: needs 76.9 GB of scratch disk, 67.5 GB free here",
        "skipped": "not checked: the corpus holds no candidate code for it",
    }
    assert frame.loc["refused", "verdict"] == "not checked"
    assert frame.loc["side", "failed_checks"] == "official side_stream"
    assert frame.loc["blind", "findings"] == "blind_spot not_bit_identical"
    assert frame.loc["fast", "reference_vs_pinned"] == "same"


def test_tallies_count_every_kind(audit):
    root, _, _, _ = audit
    tallies = pd.read_csv(root / "summary" / "tallies.csv")
    counts = {(g, k): n for g, k, n in tallies.itertuples(index=False)}
    assert counts[("outcome", "not checked")] == 2  # skipped by the corpus, refused here
    assert counts[("outcome", "no verdict")] == 1
    assert counts[("outcome", "fails: side stream")] == 1
    assert counts[("failed check", "official")] == 1
    assert counts[("finding", "blind_spot")] == 1
    claim = "claim over_eager (against eager)"
    assert counts[(claim, "reproduces")] == 2  # fast, even
    assert counts[(claim, "does not reproduce")] == 2  # blind, slow
    assert counts[(claim, "fails check")] == 2
    assert counts[("reference vs pinned", "same")] == 6
    assert sum(n for (g, _), n in counts.items() if g == "outcome") == 9


def test_the_markdown_states_the_modes_and_shows_quartiles(audit):
    root, _, _, by_code = audit
    text = (root / "summary" / "table.md").read_text()
    assert "claims made in numerics mode `kernelbench-defaults`" in text
    assert "measured in `kernelbench-defaults`" in text and "timing method events" in text
    assert (
        "8 candidates (6 with a verdict, 1 not started: too large for the scratch disk), "
        "1 not checked, 3 left out by the mapping's filters" in text
    )
    row = next(line for line in text.splitlines() if line.startswith(f"| {by_code['fast']}"))
    assert "2.1 [1.95, 2.25]" in row and "does not reproduce" in row
    assert "cheat" not in text.lower() and "fraud" not in text.lower()


def test_the_plot_is_a_png_of_a_screen_size(audit):
    root, _, _, _ = audit
    png = (root / "summary" / "claims.png").read_bytes()
    assert png.startswith(b"\x89PNG")
    width, height = int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")
    assert 800 <= width <= 1600 and 400 <= height <= 800
    assert len(png) > 20_000


def test_the_plot_of_a_corpus_without_compared_claims(tmp_path):
    from kbfuse.audit.plot import plot

    plot(pd.DataFrame({"verdict": ["pass"], "outcome": ["x"]}), [], tmp_path / "p.png", "t")
    assert (tmp_path / "p.png").stat().st_size > 1000


def test_reference_statuses(tmp_path):
    folder = tmp_path / "KernelBench" / "level2"
    folder.mkdir(parents=True)
    (folder / "53_Gemm.py").write_text(REFERENCE)
    pinned = pinned_digests(tmp_path, 2, 53)
    same = {"sha256": pinned["sha256"], "sha256_words": pinned["sha256_words"]}
    assert reference_status(same, pinned) == "same"
    spaced = {"sha256": "0" * 64, "sha256_words": pinned["sha256_words"]}
    assert reference_status(spaced, pinned) == "same except whitespace"
    assert reference_status({"sha256": "0" * 64, "sha256_words": "1" * 64}, pinned) == "differs"
    assert reference_status(None, pinned) == "none given"
    assert reference_status(same, pinned_digests(tmp_path, 2, 81)) == "not compared"
    assert pinned_digests(None, 2, 53) is None


def test_a_verdict_that_breaks_its_schema_is_named(audit, tmp_path):
    root, _, _, _ = audit
    bad = tmp_path / "l2_t53_00000000.json"
    bad.write_text(json.dumps({"kind": "check_candidate"}))
    with pytest.raises(KbfuseError, match=r"l2_t53_00000000.json: field <top level>"):
        write_audit_summary(root / "entries.json", [bad], None, tmp_path / "s")
    refusal = {key: value for key, value in REFUSED.items() if key != "why"}
    bad.write_text(json.dumps({**refusal, "scratch": {"need_bytes": -1, "free_bytes": 0}}))
    with pytest.raises(KbfuseError, match=r"l2_t53_00000000.json: field <top level>: 'why'"):
        write_audit_summary(root / "entries.json", [bad], None, tmp_path / "s")
    bad.write_text(json.dumps({**REFUSED, "scratch": {"need_bytes": -1, "free_bytes": 0}}))
    with pytest.raises(KbfuseError, match=r"field scratch.need_bytes: -1 is less than"):
        write_audit_summary(root / "entries.json", [bad], None, tmp_path / "s")


def test_an_index_without_entries_still_summarises(tmp_path):
    mapping = load_mapping("cuda_l1")
    settings = audit_settings({"corpus": str(tmp_path / "c.json"), "mapping": "cuda_l1"})
    materialise(Corpus(str(tmp_path / "c.json"), [], [], 0), mapping, settings, tmp_path)
    assert read_index(tmp_path / "entries.json")["entries"] == []
    write_audit_summary(tmp_path / "entries.json", [], None, tmp_path / "s")
    assert "(no entries)" in (tmp_path / "s" / "table.md").read_text()
    assert claims.tallies(pd.DataFrame(columns=["verdict", "outcome"]), [], []).empty


def test_a_second_mode_stands_beside_the_claims_mode(tmp_path):
    mapping = load_mapping("cuda_l1")
    settings = audit_settings(
        {
            "corpus": str(tmp_path / "c.json"),
            "mapping": "cuda_l1",
            "numerics": ["kernelbench-defaults", "strict"],
        }
    )
    entry = _entry("fast", CASES["fast"][0])
    names = materialise(
        Corpus(str(tmp_path / "c.json"), [entry], [], 0), mapping, settings, tmp_path
    )
    name = next(iter(names))
    paths = [
        tmp_path / "verdicts" / mode / f"{name}.json" for mode in ("kernelbench-defaults", "strict")
    ]
    write_json(paths[0], CASES["fast"][1])
    # strict FP32: slower, and now slower than Inductor
    write_json(paths[1], verdict(eager=[1.0] * 4, inductor=[0.8] * 4, mode="strict"))
    write_audit_summary(tmp_path / "entries.json", paths, None, tmp_path / "s")
    row = pd.read_csv(tmp_path / "s" / "table.csv").iloc[0]
    assert row["numerics"] == "kernelbench-defaults" and row[
        "measured_over_eager"
    ] == pytest.approx(2.1)
    assert row["strict_verdict"] == "pass"
    assert row["strict_measured_over_best_compiled"] == pytest.approx(0.8)
    assert row["strict_outcome"] == "passes and is slower than the best compiled"
    assert (
        row["status_over_eager"] == "reproduces"
        and row["strict_status_over_eager"] == "does not reproduce"
    )
    tallies = pd.read_csv(tmp_path / "s" / "tallies.csv")
    groups = set(tallies["group"])
    assert {"outcome", "outcome (strict)", "claim over_eager (against eager, strict)"} <= groups
    text = (tmp_path / "s" / "table.md").read_text()
    assert "measured in `kernelbench-defaults`, `strict`" in text
    assert (
        "| over best compiled (strict) |" in text.replace("  ", " ")
        or "over best compiled (strict)" in text
    )
