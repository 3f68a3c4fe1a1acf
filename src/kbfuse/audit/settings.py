"""The `audit:` config block (`snakemake audit`, docs/audit.md): every key optional, defaults
in DEFAULTS, each value checked here and named by key before the corpus is read.

The checks themselves take the `check:` block's settings (limits, trials, timing;
kbfuse.candidates.spec), but for the numerics mode: this block says what is audited, where it
goes, and in which modes it is measured (the claims' mode always).
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kbfuse.candidates.spec import NUMERICS
from kbfuse.errors import KbfuseError

REFERENCES = ("pinned", "corpus")
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")
MAX_LIMIT = 10_000
DEFAULTS: dict[str, Any] = {
    "corpus": None,  # None: no audit configured
    "mapping": None,  # a packaged mapping's name or a YAML file; None for a folder
    "name": None,  # None: made from the corpus's file name
    "references": "pinned",
    "limit": None,
    "tasks": None,  # None: every task; else only these task numbers' records
    "numerics": None,  # None: the mode the claims were made in only
    "in_manifest": False,
}


def default_name(corpus: str) -> str:
    """The audit's name from its corpus's path: its stem, other characters made '-'."""
    stem = re.sub(r"[^A-Za-z0-9_-]", "-", Path(corpus).stem).strip("-_")[:64]
    return stem or "corpus"


def audit_settings(given: Mapping[str, Any] | None) -> dict:
    """The settings with defaults filled in; KbfuseError naming the first bad key and value."""
    if given is not None and not isinstance(given, Mapping):
        raise KbfuseError(f"audit is {given!r}: it must be a mapping")
    given = dict(given or {})
    unknown = sorted(set(given) - set(DEFAULTS))
    if unknown:
        raise KbfuseError(f"audit.{unknown[0]} is not a setting; known: {sorted(DEFAULTS)}")
    s = {**copy.deepcopy(DEFAULTS), **given}
    for key in ("corpus", "mapping"):
        if s[key] is not None and (not isinstance(s[key], str) or not s[key]):
            raise KbfuseError(f"audit.{key} is {s[key]!r}: a path or name, or null")
    if s["corpus"] is not None and set("{}") & set(s["corpus"]):
        raise KbfuseError(f"audit.corpus is {s['corpus']!r}: no braces in the path")
    if s["name"] is None and s["corpus"] is not None:
        s["name"] = default_name(s["corpus"])
    if s["name"] is not None and (not isinstance(s["name"], str) or not NAME.fullmatch(s["name"])):
        raise KbfuseError(
            f"audit.name is {s['name']!r}: letters, digits, '-' and '_', at most 64 characters"
        )
    if s["references"] not in REFERENCES:
        raise KbfuseError(f"audit.references is {s['references']!r}; known: {list(REFERENCES)}")
    limit = s["limit"]
    if limit is not None and (
        isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIMIT
    ):
        raise KbfuseError(f"audit.limit is {limit!r}: an integer from 1 to {MAX_LIMIT}, or null")
    tasks = s["tasks"]
    if tasks is not None and (
        not isinstance(tasks, list)
        or not tasks
        or any(isinstance(t, bool) or not isinstance(t, int) or t < 1 for t in tasks)
        or len(set(tasks)) != len(tasks)
    ):
        raise KbfuseError(
            f"audit.tasks is {tasks!r}: a list of distinct task numbers (integers from 1), or null"
        )
    modes = s["numerics"]
    if modes is not None and (
        not isinstance(modes, list)
        or not modes
        or len(set(map(str, modes))) != len(modes)
        or any(mode not in NUMERICS for mode in modes)
    ):
        raise KbfuseError(
            f"audit.numerics is {modes!r}: a list of distinct modes of {list(NUMERICS)}, or null"
        )
    if not isinstance(s["in_manifest"], bool):
        raise KbfuseError(f"audit.in_manifest is {s['in_manifest']!r}: it must be true or false")
    return s


def measured_modes(settings: dict, claims_mode: str) -> list[str]:
    """The numerics modes the audit measures in: the claims' mode first, then the others
    `audit.numerics` names; KbfuseError when a list is given without the claims' mode."""
    modes = settings["numerics"]
    if modes is None:
        return [claims_mode]
    if claims_mode not in modes:
        raise KbfuseError(
            f"audit.numerics is {modes!r}: it must include {claims_mode!r}, the mode the "
            "corpus's claims were made in (its mapping's numerics)"
        )
    return [claims_mode, *(mode for mode in modes if mode != claims_mode)]


def audit_targets(settings: dict, files: list[str]) -> list[str]:
    """The `audit` target's inputs, `files`; KbfuseError saying what to set when the config
    names no corpus."""
    if settings["corpus"] is None:
        raise KbfuseError(
            "snakemake audit needs the config key audit.corpus, e.g. --config "
            "audit='{corpus: h100.json, mapping: cuda_l1}' (docs/audit.md)"
        )
    return files
