"""Corpus entries as candidate files named after their content, and the entries index.

Each entry becomes `<root>/candidates/<name>.py`, its code behind a `# kbfuse-task: L/T` line
(so `kbfuse check` reads the file alone too), named `l<level>_t<task>_<sha8>`: the first 8 hex
digits of the sha256 of that text (and, when the check judges against the corpus's own
reference, of the reference too, written to `<root>/tasks/<name>.py`). A file is written only
when its content changed, so that Snakemake, which reruns a job whose input is newer than its
output, reruns only the entries that changed: an interrupted audit resumes where it stopped,
and a corpus update checks only its new or changed candidates. Entries with the same content
are checked once; the index lists the others as its duplicates.

The index (`<root>/entries.json`, schema src/kbfuse/schemas/audit_entries.json) holds what the
summary needs besides the verdicts: the corpus, the mapping, the numerics mode the claims were
made in and the modes measured, per entry its source, task, claims and the sha256 of its
reference (exact and whitespace-insensitive), and the entries that are not checked, with the
reason.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from kbfuse import io, layout, untrusted
from kbfuse.audit.corpus import Corpus, Entry, Skipped
from kbfuse.audit.mapping import Mapping
from kbfuse.audit.settings import measured_modes
from kbfuse.candidates.spec import TASK_LINE, TASK_LINE_SEARCH
from kbfuse.errors import KbfuseError

KIND = "audit_entries"
SCHEMA_VERSION = 1
INDEX_BYTES = 64 << 20


@dataclass(frozen=True)
class Candidate:
    name: str
    entry: Entry
    text: str  # the candidate file's content


def candidate_text(entry: Entry) -> str:
    """The entry's code with a `# kbfuse-task:` line first, unless a line naming its task is
    among its first lines already."""
    head = entry.code.splitlines()[:TASK_LINE_SEARCH]
    named = [m.group(1) for m in (TASK_LINE.match(line.strip()) for line in head) if m]
    if named[:1] == [f"{entry.level}/{entry.task}"]:
        return entry.code
    return f"# kbfuse-task: {entry.level}/{entry.task}\n{entry.code}"


def entry_name(entry: Entry, references: str) -> str:
    """`l<level>_t<task>_<sha8>` of the candidate's text (and the corpus's reference, when
    the check judges against it)."""
    digest = hashlib.sha256(candidate_text(entry).encode())
    if references == "corpus":
        digest.update(b"\0" + (entry.reference or "").encode())
    return f"l{entry.level}_t{entry.task}_{digest.hexdigest()[:8]}"


def sha256_words(text: str) -> str:
    """The sha256 of `text` with every run of whitespace made one space (ends stripped)."""
    return io.sha256_bytes(" ".join(text.split()).encode())


def write_if_changed(path: Path, text: str) -> bool:
    """Write `text` to `path` unless it holds exactly that already; whether it wrote."""
    data = text.encode()
    if path.is_file() and not path.is_symlink():
        try:
            if untrusted.read_bytes(path, len(data)) == data:
                return False
        except KbfuseError:
            pass  # larger, or unreadable: written anew
    io.write_bytes(path, data)
    return True


def select(corpus: Corpus, references: str, limit: int | None, tasks: list[int] | None):
    """({name: Candidate} in corpus order, duplicates {name: [sources]}, skipped), of the
    records of `tasks` only when given (the skipped ones too), the first `limit` of them."""
    chosen: dict[str, Candidate] = {}
    duplicates: dict[str, list[str]] = {}
    wanted = None if tasks is None else set(tasks)
    skipped = [s for s in corpus.skipped if wanted is None or s.task in wanted]
    for entry in corpus.entries:
        if wanted is not None and entry.task not in wanted:
            continue
        if references == "corpus" and entry.reference is None:
            why = "the corpus holds no reference for it (audit.references: corpus)"
            skipped.append(Skipped(entry.source, entry.level, entry.task, why))
            continue
        name = entry_name(entry, references)
        if name in chosen:
            duplicates.setdefault(name, []).append(entry.source)
        elif limit is None or len(chosen) < limit:
            chosen[name] = Candidate(name, entry, candidate_text(entry))
    return chosen, duplicates, skipped


def _reference(entry: Entry) -> dict | None:
    if entry.reference is None:
        return None
    return {
        "sha256": io.sha256_bytes(entry.reference.encode()),
        "sha256_words": sha256_words(entry.reference),
    }


def claims_mode(mapping: Mapping | None) -> str:
    """The numerics mode a corpus's claims were made in: its mapping's, else PyTorch's
    defaults (a folder has no claims)."""
    return "kernelbench-defaults" if mapping is None else mapping.numerics


def index_record(
    corpus: Corpus, mapping: Mapping | None, settings: dict, chosen, duplicates, skipped
) -> dict:
    path = Path(corpus.path)
    return {
        "kind": KIND,
        "schema_version": SCHEMA_VERSION,
        "name": settings["name"],
        "corpus": {
            "path": str(path),
            "sha256": io.sha256_file(path) if path.is_file() else None,
            "mapping": None if mapping is None else mapping.name,
            "numerics": claims_mode(mapping),
            "measured": measured_modes(settings, claims_mode(mapping)),
            "references": settings["references"],
            "filtered_out": corpus.filtered_out,
            "limit": settings["limit"],
            "tasks": settings["tasks"],
        },
        "claims": []
        if mapping is None
        else [{"name": c.name, "key": c.key, "against": c.against} for c in mapping.claims],
        "entries": [
            {
                "name": name,
                "source": c.entry.source,
                "level": c.entry.level,
                "task": c.entry.task,
                "claims": c.entry.claims,
                "reference": _reference(c.entry),
                "duplicates": duplicates.get(name, []),
            }
            for name, c in chosen.items()
        ],
        "skipped": [
            {"source": s.source, "level": s.level, "task": s.task, "why": s.why} for s in skipped
        ],
    }


def materialise(corpus: Corpus, mapping: Mapping | None, settings: dict, root: str | Path) -> dict:
    """Write every chosen entry's candidate file (and task file, when judged against the
    corpus's reference) and the index under the audit's folder `root` (kbfuse.layout.
    AUDIT_FILES), each only when changed; {name: (level, task)} in corpus order."""
    measured_modes(settings, claims_mode(mapping))  # refused before anything is written
    chosen, duplicates, skipped = select(
        corpus, settings["references"], settings["limit"], settings["tasks"]
    )
    for name, candidate in chosen.items():
        write_if_changed(Path(layout.audit_file("candidate", root, entry=name)), candidate.text)
        if settings["references"] == "corpus":
            task = Path(layout.audit_file("task", root, entry=name))
            write_if_changed(task, candidate.entry.reference)
    record = index_record(corpus, mapping, settings, chosen, duplicates, skipped)
    validate(record, "the audit's entries index")
    write_if_changed(Path(layout.audit_file("index", root)), io.dumps_json(record))
    return {name: (c.entry.level, c.entry.task) for name, c in chosen.items()}


def schema() -> dict:
    text = resources.files("kbfuse").joinpath("schemas", "audit_entries.json").read_text()
    return json.loads(text)


def validate(record, label: str) -> None:
    import jsonschema

    errors = sorted(
        jsonschema.Draft202012Validator(schema()).iter_errors(record),
        key=lambda e: list(map(str, e.path)),
    )
    if errors:
        where = ".".join(map(str, errors[0].absolute_path)) or "<top level>"
        raise KbfuseError(f"{label}: field {where}: {errors[0].message[:300]}")


def read_index(path: str | Path) -> dict:
    """The entries index at `path`, read within bounds and checked against its schema."""
    record = untrusted.read_json(path, INDEX_BYTES, follow=True)
    validate(record, str(path))
    return record


def prepare(settings: dict, root: str | Path) -> tuple[dict, list[str]]:
    """The audit of checked `settings` (kbfuse.audit.settings) made ready to check: its mapping
    loaded, its corpus read, its entries materialised under `root`; ({name: (level, task)},
    the numerics modes it is measured in, the claims' first). Every problem of the mapping or
    the corpus is a KbfuseError, raised before anything is written."""
    from kbfuse.audit.corpus import read_corpus
    from kbfuse.audit.mapping import load_mapping

    mapping = None if settings["mapping"] is None else load_mapping(settings["mapping"])
    corpus = read_corpus(settings["corpus"], mapping)
    entries = materialise(corpus, mapping, settings, root)
    return entries, measured_modes(settings, claims_mode(mapping))
