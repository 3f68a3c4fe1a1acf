"""A corpus read into entries: each a candidate's code, its task, the reference it was
claimed against and its claims.

Two forms (docs/audit.md):
- a folder of KernelBench-format files (`*.py`), each naming its task on a `# kbfuse-task:
  2/53` line (kbfuse.candidates.spec.task_of_file) or, with a mapping of `format: folder`, by
  its file name; no claims;
- a JSON or JSONL file, read through a mapping (kbfuse.audit.mapping).

The corpus is untrusted input read at every Snakemake start, so within bounds: regular files
only, CORPUS_BYTES in all, strict JSON per record, at most MAX_ENTRIES entries, each
candidate at most kbfuse.candidates.spec.CANDIDATE_BYTES. A record that is malformed (a
level that is not an integer, a claim that is not a positive number) stops the reading with a
KbfuseError naming the file, the line (or index) and the key; a record the audit cannot check
(no candidate code, code that names no `ModelNew`, a level kbfuse
check does not judge) is kept as skipped, with the reason.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kbfuse import untrusted
from kbfuse.audit.mapping import Mapping
from kbfuse.candidates.spec import CANDIDATE_BYTES, LEVELS, MAX_CANDIDATES, task_of_file
from kbfuse.errors import KbfuseError

CORPUS_BYTES = 512 << 20
MAX_ENTRIES = MAX_CANDIDATES


@dataclass(frozen=True)
class Entry:
    """One candidate of a corpus. `code` is None for a record without candidate code."""

    source: str  # where in the corpus: "h100.json line 53", "my_kernel.py"
    level: int
    task: int
    code: str | None
    reference: str | None = None
    claims: dict[str, float | None] = field(default_factory=dict)


@dataclass(frozen=True)
class Skipped:
    source: str
    level: int
    task: int
    why: str


@dataclass(frozen=True)
class Corpus:
    path: str
    entries: list[Entry]
    skipped: list[Skipped]
    filtered_out: int  # records the mapping's filters left out


def _integer(value: Any, where: str, least: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise KbfuseError(f"{where} is {value!r}: it must be an integer >= {least}")
    return value


def _text(value: Any, where: str) -> str | None:
    if value is not None and not isinstance(value, str):
        raise KbfuseError(f"{where} is a {type(value).__name__}: it must be a string or null")
    return value


def _claim(value: Any, where: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise KbfuseError(f"{where} is {value!r}: a claimed speedup is a number > 0 or null")
    if value <= 0:
        raise KbfuseError(f"{where} is {value!r}: a claimed speedup is a number > 0 or null")
    return float(value)


def _records(path: Path, form: str) -> list[tuple[str, Any]]:
    """(label, record) of every record of a JSON (a list) or JSONL file."""
    raw = untrusted.read_bytes(path, CORPUS_BYTES, follow=True)
    if form == "json":
        data = untrusted.parse_json(raw, str(path), CORPUS_BYTES)
        if not isinstance(data, list):
            raise KbfuseError(f"{path}: a JSON corpus is a list of records, not a {type(data)}")
        found = [(f"{path.name} record {index}", record) for index, record in enumerate(data)]
    else:
        found = [
            (
                f"{path.name} line {number}",
                untrusted.parse_json(line, f"{path} line {number}", len(line)),
            )
            for number, line in enumerate(raw.split(b"\n"), start=1)
            if line.strip()
        ]
    if len(found) > MAX_ENTRIES:
        raise KbfuseError(f"{path} holds {len(found)} records, over {MAX_ENTRIES}")
    return found


def _entry(label: str, record: Any, mapping: Mapping) -> Entry:
    if not isinstance(record, dict):
        raise KbfuseError(f"{label} is a {type(record).__name__}, not a JSON object")
    keys = mapping.fields

    def value(name: str, required: bool) -> Any:
        if keys[name] not in record and required:
            raise KbfuseError(f"{label} has no key {keys[name]!r} ({mapping.source}: {name})")
        return record.get(keys[name])

    return Entry(
        source=label,
        level=_integer(value("level", True), f"{label}: {keys['level']}", 1),
        task=_integer(value("task", True), f"{label}: {keys['task']}", 1),
        code=_text(value("candidate", True), f"{label}: {keys['candidate']}"),
        reference=_text(value("reference", False), f"{label}: {keys['reference']}")
        if "reference" in keys
        else None,
        claims={c.name: _claim(record.get(c.key), f"{label}: {c.key}") for c in mapping.claims},
    )


def _kept(entry: Entry, mapping: Mapping | None) -> bool:
    filters = mapping.filters if mapping is not None else {}
    return all(getattr(entry, name) in allowed for name, allowed in filters.items())


def _why_skipped(entry: Entry) -> str | None:
    if entry.code is None:
        return "the corpus holds no candidate code for it"
    if entry.level not in LEVELS:
        return f"level {entry.level}: kbfuse check judges levels {list(LEVELS)}"
    if len(entry.code.encode()) > CANDIDATE_BYTES:
        return f"its code is over {CANDIDATE_BYTES} bytes"
    if "ModelNew" not in entry.code:
        return f"its code names no ModelNew: {entry.code[:40]!r}"
    return None


def _sorted_out(path: Path, entries: list[Entry], mapping: Mapping | None) -> Corpus:
    kept = [e for e in entries if _kept(e, mapping)]
    checked, skipped = [], []
    for entry in kept:
        why = _why_skipped(entry)
        if why is None:
            checked.append(entry)
        else:
            skipped.append(Skipped(entry.source, entry.level, entry.task, why))
    return Corpus(str(path), checked, skipped, len(entries) - len(kept))


def read_records(path: str | Path, mapping: Mapping) -> Corpus:
    """The entries of a JSON/JSONL corpus read through `mapping`."""
    path = Path(path)
    records = _records(path, mapping.format)
    entries = [_entry(label, record, mapping) for label, record in records]
    for claim in mapping.claims:
        if records and not any(isinstance(r, dict) and claim.key in r for _, r in records):
            raise KbfuseError(
                f"{path}: no record has the key {claim.key!r} ({mapping.source}: "
                f"claims.{claim.name})"
            )
    return _sorted_out(path, entries, mapping)


def _folder_task(path: Path, mapping: Mapping | None) -> tuple[int, int]:
    if mapping is None:
        return task_of_file(path)
    match = mapping.name_pattern.fullmatch(path.stem)
    if match is None:
        raise KbfuseError(
            f"{path}: its name does not match {mapping.source}'s name_pattern "
            f"{mapping.name_pattern.pattern!r}"
        )
    return int(match.group("level")), int(match.group("task"))


def read_folder(folder: str | Path, mapping: Mapping | None = None) -> Corpus:
    """The entries of a folder of candidate files (`*.py`), in name order."""
    folder = Path(folder)
    entries = []
    for count, path in enumerate(sorted(folder.glob("*.py")), start=1):
        if count > MAX_ENTRIES:
            raise KbfuseError(f"corpus folder {folder} holds more than {MAX_ENTRIES} *.py files")
        level, task = _folder_task(path, mapping)
        raw = untrusted.read_bytes(path, CANDIDATE_BYTES, follow=True)
        entries.append(Entry(path.name, level, task, raw.decode("utf-8", errors="replace")))
    if not entries:
        raise KbfuseError(f"corpus folder {folder} holds no *.py file")
    return _sorted_out(folder, entries, mapping)


def read_corpus(path: str | Path, mapping: Mapping | None) -> Corpus:
    """A folder (no mapping, or one of format folder) or a JSON/JSONL file (its mapping)."""
    path = Path(path)
    if path.is_dir():
        if mapping is not None and mapping.format != "folder":
            raise KbfuseError(
                f"corpus {path} is a folder, but {mapping.source} is for a {mapping.format} file"
            )
        return read_folder(path, mapping)
    if not path.exists():
        raise KbfuseError(f"corpus {path} does not exist")
    if mapping is None or mapping.format == "folder":
        raise KbfuseError(
            f"corpus {path} is a file: name the mapping that reads it (e.g. cuda_l1; docs/audit.md)"
        )
    return read_records(path, mapping)
