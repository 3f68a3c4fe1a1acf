"""The summary of an audit: the claims-vs-measured table, the tallies and the plot.

`write_audit_summary` reads the entries index (kbfuse.audit.materialise) and the verdicts of its
entries (one `results/audit/<name>/verdicts/<numerics>/<entry>.json` per entry and mode
measured, validated against check_candidate.json, or a check_refused record where the check
did not start), compares each entry's reference with the
pinned task file where a checkout is given (kbfuse.audit.references), and writes OUTPUTS:
table.csv (every column), table.md (the corpus, the numerics mode of the claims and of the
measurement, and the main columns), tallies.csv and tallies.md (kbfuse.audit.claims.tallies),
claims.png (kbfuse.audit.plot). Words are neutral: what was measured, what does not reproduce,
which check fails.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import pandas as pd

from kbfuse import untrusted
from kbfuse.audit import claims as claims_of
from kbfuse.audit.materialise import read_index
from kbfuse.audit.plot import compared_claims, plot
from kbfuse.audit.references import pinned_digests
from kbfuse.candidates.verdict import validate, validate_refusal
from kbfuse.io import write_text

OUTPUTS = ("table.csv", "table.md", "tallies.csv", "tallies.md", "claims.png")
VERDICT_BYTES = 64 << 20
# the mode of a verdict whose settings name none: PyTorch's defaults as the check found them
MEASURED_NUMERICS = "kernelbench-defaults"


def read_verdicts(paths: Iterable[str | Path]) -> dict[str, dict[str, dict]]:
    """{numerics mode: {entry name (the file's stem): verdict}}, each verdict checked against
    its schema, its mode the one its settings record (none named: PyTorch's defaults)."""
    verdicts: dict[str, dict[str, dict]] = {}
    for path in map(Path, paths):
        record = untrusted.read_json(path, VERDICT_BYTES, follow=True)
        if claims_of.is_refusal(record):
            validate_refusal(record, str(path))
            mode = record["numerics"] or MEASURED_NUMERICS
        else:
            validate(record, str(path))
            mode = record["settings"].get("numerics") or MEASURED_NUMERICS
        verdicts.setdefault(mode, {})[path.stem] = record
    return verdicts


def _figure(row: pd.Series, column: str) -> str:
    median = row.get(column)
    if median is None or pd.isna(median):
        return ""
    return f"{median:.3g} [{row[f'{column}_q1']:.3g}, {row[f'{column}_q3']:.3g}]"


def _number(value) -> str:
    return "" if value is None or pd.isna(value) else f"{value:.4g}"


def _text(row: pd.Series, column: str) -> str:
    value = row.get(column)
    return value if isinstance(value, str) else ""  # a skipped entry's cells are NaN


def markdown_rows(frame: pd.DataFrame, claims: list[dict], modes: list[str]) -> pd.DataFrame:
    """The main columns, each measured figure as `median [q1, q3]`; for each mode measured
    besides the claims', its verdict and speedup over the best compiled baseline."""
    rows = []
    for _, row in frame.iterrows():
        cells = {
            "entry": _text(row, "entry") or row["source"],
            "task": row["task"],
            "verdict": row["verdict"],
            "outcome": row["outcome"],
            "failed checks": _text(row, "failed_checks"),
            "reference": _text(row, "reference_vs_pinned"),
            "measured over eager": _figure(row, "measured_over_eager"),
            "measured over best compiled": _figure(row, "measured_over_best_compiled"),
        }
        for claim in compared_claims(claims):
            name = claim["name"]
            cells[f"claimed {name}"] = _number(row.get(f"claim_{name}"))
            if claim["against"] not in ("eager", "best_compiled"):  # else a column already
                cells[f"measured over {claim['against']}"] = _figure(row, f"measured_{name}")
            cells[name] = row.get(f"status_{name}", "")
        for mode in modes[1:]:
            prefix = claims_of.mode_prefix(mode)
            cells[f"verdict ({mode})"] = _text(row, f"{prefix}verdict")
            cells[f"over best compiled ({mode})"] = _figure(
                row, f"{prefix}measured_over_best_compiled"
            )
        rows.append(cells)
    return pd.DataFrame(rows)


def header(index: dict, frame: pd.DataFrame) -> str:
    corpus = index["corpus"]
    methods = sorted({m for m in frame.get("method", []) if isinstance(m, str)})
    judged = (
        int((~frame["verdict"].isin([claims_of.NOT_CHECKED, claims_of.NO_VERDICT])).sum())
        if len(frame)
        else 0
    )
    # entries whose check did not start here (check_refused); the skipped rows have no entry
    refused = (
        int(((frame["verdict"] == claims_of.NOT_CHECKED) & (frame["entry"] != "")).sum())
        if len(frame)
        else 0
    )
    not_started = f", {refused} not started: too large for the scratch disk" if refused else ""
    return "\n".join(
        [
            f"# Audit {index['name']}",
            "",
            f"- corpus: `{Path(corpus['path']).name}` (mapping {corpus['mapping'] or 'none'}), "
            f"{len(index['entries'])} candidates ({judged} with a verdict{not_started}), "
            f"{len(index['skipped'])} not checked, "
            f"{corpus['filtered_out']} left out by the mapping's filters"
            + ("" if corpus["tasks"] is None else f", tasks {corpus['tasks']} only"),
            f"- claims made in numerics mode `{corpus['numerics']}` and compared with the "
            f"measurement in it; measured in {', '.join(f'`{m}`' for m in corpus['measured'])}; "
            f"timing method {', '.join(methods) or 'none'}",
            f"- judged against the {corpus['references']} task files; `reference` says how the "
            "corpus's reference compares with the pinned one",
            "- speedups: baseline time over the candidate's (> 1: faster), median [quartiles] "
            "of per-round paired ratios; a claim `reproduces` when it is at most the measured "
            "upper quartile",
            "",
            "",
        ]
    )


def write_audit_summary(
    index_path: str | Path,
    verdict_paths: Iterable[str | Path],
    checkout: str | Path | None,
    out: str | Path,
) -> list[Path]:
    """OUTPUTS under `out` (see the module docstring)."""
    out = Path(out)
    index = read_index(index_path)
    verdicts = read_verdicts(verdict_paths)
    tasks = {(e["level"], e["task"]) for e in index["entries"]}
    pinned = {key: pinned_digests(checkout, *key) for key in sorted(tasks)}
    frame = claims_of.table(index, verdicts, pinned)
    modes = index["corpus"]["measured"]
    counts = claims_of.tallies(frame, index["claims"], modes)
    written = [out / name for name in OUTPUTS]
    write_text(written[0], frame.to_csv(index=False))
    main = markdown_rows(frame, index["claims"], modes)
    text = main.to_markdown(index=False, missingval="") if len(main) else "(no entries)"
    write_text(written[1], header(index, frame) + text + "\n")
    write_text(written[2], counts.to_csv(index=False))
    write_text(written[3], counts.to_markdown(index=False) + "\n")
    plot(frame, index["claims"], written[4], f"Audit {index['name']}: claimed vs measured")
    return written
