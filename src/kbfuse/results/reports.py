"""What every benchmark script (benchmarks/) does with its result.

Kept out of kbfuse.io, which every workflow job imports: a module no rule runs can change
without rerunning the study.
"""

from __future__ import annotations

from typing import Any

from kbfuse.io import write_json, write_text


def emit_report(
    report: Any, text: str, json_path: str | None = None, markdown_path: str | None = None
) -> None:
    """The Markdown `text` on stdout; `report` as JSON and `text` as a Markdown file where
    asked."""
    print(text, end="")
    if json_path:
        write_json(json_path, report)
    if markdown_path:
        write_text(markdown_path, text)
