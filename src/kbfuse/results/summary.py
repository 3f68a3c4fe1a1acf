"""The study's summary: every GPU result file read, its provenance checked, tables written.

`build_tables` turns the result files of one run (the layout under `results/`, see
docs/contracts.md) into pandas DataFrames; `write_summary` writes each as `<name>.csv` and
`<name>.md` next to the plots. Rows come only from what the files record: a table holds
exactly the tasks, variants, cases and measurements found in its inputs.

The parts: `kbfuse.results.study` reads the results and checks their provenance,
`kbfuse.results.tables` builds each table (`<name>_table` for every table of
`kbfuse.layout.TABLES`), this module builds them all and writes them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from kbfuse.errors import KbfuseError
from kbfuse.faults import checkpoint
from kbfuse.io import write_text
from kbfuse.layout import PLOT_CONTROL_BIT_EQUALITY, TABLES, study_tables, tail_plot_name
from kbfuse.results import tables as table_builders
from kbfuse.results.records import staged
from kbfuse.results.study import StudyResults, load_results


def builders(
    config: Mapping[str, Any] | None = None,
) -> dict[str, Callable[[StudyResults], pd.DataFrame]]:
    """Table name -> its builder: `<name>_table` of kbfuse.results.tables, for every table of
    kbfuse.layout.TABLES (those a study of `config` writes, when given), in that order (a
    table without a builder is an error here)."""
    names = list(TABLES) if config is None else study_tables(config)
    found = {name: getattr(table_builders, f"{name}_table", None) for name in names}
    missing = [name for name, build in found.items() if not callable(build)]
    if missing:
        raise KbfuseError(f"summary tables {missing} have no builder (<name>_table)")
    return found


def tables_from_results(res: StudyResults) -> dict[str, pd.DataFrame]:
    tables = {}
    for name, build in builders(res.config).items():
        try:
            tables[name] = build(res)
        except (KeyError, TypeError, AttributeError) as exc:
            raise KbfuseError(
                f"summary table {name}: a result file under {res.root} does not follow "
                f"docs/contracts.md ({type(exc).__name__}: {exc})"
            ) from exc
    return tables


def build_tables(results_dir: str | Path, config: Mapping[str, Any]) -> dict[str, pd.DataFrame]:
    """Read and provenance-check the results of one run; return every summary table."""
    return tables_from_results(load_results(results_dir, config))


# ---------------------------------------------------------------- writing


def table_markdown(df: pd.DataFrame) -> str:
    """A Markdown table; missing values are blank, floats to 6 significant digits (the CSV
    keeps every digit)."""
    if df.empty:
        return "| " + " | ".join(df.columns) + " |\n\n(no rows)\n"
    cells = df.astype(object).where(df.notna(), None)
    return cells.to_markdown(index=False, floatfmt=".6g", missingval="") + "\n"


def table_csv(df: pd.DataFrame) -> str:
    return df.to_csv(index=False, lineterminator="\n")


def write_table(df: pd.DataFrame, outdir: str | Path, name: str) -> list[Path]:
    outdir = Path(outdir)
    csv_path, md_path = outdir / f"{name}.csv", outdir / f"{name}.md"
    write_text(csv_path, table_csv(df))
    write_text(md_path, table_markdown(df))
    return [csv_path, md_path]


def write_summary(
    results_dir: str | Path, config: Mapping[str, Any], outdir: str | Path
) -> list[Path]:
    """Write every table (CSV + Markdown) and plot; return the paths written."""
    from kbfuse.results import plots  # matplotlib only where plots are drawn

    tables = build_tables(results_dir, config)
    written: list[Path] = []
    with staged(outdir) as stage:  # nothing appears in outdir before every file is complete
        for name, df in tables.items():
            written += write_table(df, stage, name)
            checkpoint("summary", name)
        for task in config["tasks"]:
            written.append(stage / tail_plot_name(task))
            plots.plot_tail_times(tables["timing_tail"], task, written[-1])
        written.append(stage / PLOT_CONTROL_BIT_EQUALITY)
        plots.plot_control_bit_equality(tables["control_bit_equality"], written[-1])
    return [Path(outdir) / p.name for p in written]
