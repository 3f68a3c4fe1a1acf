"""The declarative mapping of a JSON or JSONL corpus: which key of a record holds what.

A mapping is a small YAML file (the packaged ones in mappings/, named without `.yaml`, or any
path), checked here before the corpus is read, each problem named by the mapping and key:

    name: cuda-l1                  # letters, digits, '-', '_'
    format: jsonl                  # jsonl (one record per line) or json (a list of records)
    fields:
      level: level_id              # required: the KernelBench level (an integer)
      task: task_id                # required: the task number (an integer)
      candidate: custom_code       # required: the candidate's code (a ModelNew), or null
      reference: ref_code          # optional: the task code the claims were made against
    claims:                        # optional: claim name -> the record's key
      over_eager: {key: score_default, against: eager}
      over_cuda_graph: {key: score_cuda_graph}   # kept, compared with nothing measured
    numerics: kernelbench-defaults # the numerics mode the claims were made in
    filters: {level: [2]}          # optional: only records whose field is one of these

A folder of candidate files needs no mapping: each file names its task on a `# kbfuse-task:
2/53` line. A mapping of `format: folder` names the task from the file name instead, by a
regular expression with the groups `level` and `task`, matched against the whole stem:

    name: my-folder
    format: folder
    name_pattern: 'level(?P<level>[0-9]+)_task(?P<task>[0-9]+)_.*'

A claim is a speedup: the baseline's time over the candidate's (> 1: the candidate is faster).
`against` names the measured figure it stands beside: `eager`, `best_compiled` (the faster of
the compiled baselines the check timed), or one compiled baseline (`inductor`, `torchscript`).
`numerics` is the mode the claims were made in (kbfuse.candidates.spec.NUMERICS:
`kernelbench-defaults`, PyTorch's defaults, unless the corpus says otherwise); the audit
measures in it, and in the other modes `audit.numerics` names.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from kbfuse import untrusted
from kbfuse.candidates.spec import NUMERICS
from kbfuse.errors import KbfuseError

FORMATS = ("json", "jsonl", "folder")
FIELDS = ("level", "task", "candidate", "reference")
REQUIRED_FIELDS = ("level", "task", "candidate")
FILTERABLE = ("level", "task")
AGAINST = ("eager", "best_compiled", "inductor", "torchscript")
KEYS = ("name", "format", "fields", "claims", "numerics", "filters", "name_pattern")
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")
CLAIM_NAME = re.compile(r"[a-z][a-z0-9_]{0,63}")
MAPPING_BYTES = 64 << 10


@dataclass(frozen=True)
class Claim:
    name: str
    key: str
    against: str | None  # None: kept beside the others, compared with nothing measured


@dataclass(frozen=True)
class Mapping:
    name: str
    format: str
    fields: dict[str, str]
    claims: tuple[Claim, ...] = ()
    numerics: str = "kernelbench-defaults"
    filters: dict[str, tuple[int, ...]] = field(default_factory=dict)
    name_pattern: re.Pattern | None = None  # format folder: the task from the file's stem
    source: str = ""  # where it was read from


def packaged() -> list[str]:
    """The names of the packaged mappings (mappings/<name>.yaml)."""
    folder = resources.files("kbfuse.audit").joinpath("mappings")
    return sorted(p.name[: -len(".yaml")] for p in folder.iterdir() if p.name.endswith(".yaml"))


def mapping_text(name_or_path: str) -> tuple[str, str]:
    """(YAML text, where it came from) of a packaged mapping's name or a mapping file."""
    if name_or_path in packaged():
        folder = resources.files("kbfuse.audit").joinpath("mappings")
        return folder.joinpath(f"{name_or_path}.yaml").read_text(), f"mapping {name_or_path}"
    path = Path(name_or_path)
    if not path.exists():
        raise KbfuseError(
            f"mapping {name_or_path!r} is neither a packaged mapping ({', '.join(packaged())}) "
            "nor a file"
        )
    raw = untrusted.read_bytes(path, MAPPING_BYTES, follow=True)
    return raw.decode("utf-8", errors="replace"), f"mapping {path}"


def _string(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value:
        raise KbfuseError(f"{where} is {value!r}: it must be a non-empty string")
    return value


def _mapping_of(value: Any, where: str) -> dict:
    if not isinstance(value, dict):
        raise KbfuseError(f"{where} is {value!r}: it must be a mapping")
    return value


def _fields(value: Any, where: str) -> dict[str, str]:
    given = _mapping_of(value, f"{where}: fields")
    unknown = sorted(set(given) - set(FIELDS))
    if unknown:
        raise KbfuseError(f"{where}: fields.{unknown[0]} is not a field; known: {list(FIELDS)}")
    missing = [name for name in REQUIRED_FIELDS if name not in given]
    if missing:
        raise KbfuseError(f"{where}: fields.{missing[0]} is missing (required: {REQUIRED_FIELDS})")
    return {name: _string(key, f"{where}: fields.{name}") for name, key in given.items()}


def _claims(value: Any, where: str) -> tuple[Claim, ...]:
    claims = []
    for name, spec in _mapping_of(value, f"{where}: claims").items():
        at = f"{where}: claims.{name}"
        if not isinstance(name, str) or not CLAIM_NAME.fullmatch(name):
            raise KbfuseError(f"{at}: a claim name is lowercase letters, digits and '_'")
        spec = _mapping_of(spec, at)
        unknown = sorted(set(spec) - {"key", "against"})
        if unknown:
            raise KbfuseError(f"{at}.{unknown[0]} is not a setting; known: ['against', 'key']")
        against = spec.get("against")
        if against is not None and against not in AGAINST:
            raise KbfuseError(f"{at}.against is {against!r}; known: {list(AGAINST)} or none")
        claims.append(Claim(name, _string(spec.get("key"), f"{at}.key"), against))
    return tuple(claims)


def _filters(value: Any, where: str) -> dict[str, tuple[int, ...]]:
    filters = {}
    for name, allowed in _mapping_of(value, f"{where}: filters").items():
        if name not in FILTERABLE:
            raise KbfuseError(f"{where}: filters.{name} is not a filter; known: {FILTERABLE}")
        if (
            not isinstance(allowed, list)
            or not allowed
            or not all(isinstance(v, int) and not isinstance(v, bool) for v in allowed)
        ):
            raise KbfuseError(f"{where}: filters.{name} is {allowed!r}: a list of integers")
        filters[name] = tuple(allowed)
    return filters


def _name_pattern(value: Any, where: str) -> re.Pattern:
    text = _string(value, f"{where}: name_pattern")
    try:
        pattern = re.compile(text)
    except re.error as exc:
        raise KbfuseError(
            f"{where}: name_pattern {text!r} is not a regular expression: {exc}"
        ) from None
    if not {"level", "task"} <= set(pattern.groupindex):
        raise KbfuseError(
            f"{where}: name_pattern {text!r} needs the groups (?P<level>) and (?P<task>)"
        )
    return pattern


def parse_mapping(data: Any, where: str) -> Mapping:
    """A Mapping from the parsed YAML `data`; KbfuseError naming `where` and the key."""
    data = _mapping_of(data, where)
    unknown = sorted(set(data) - set(KEYS))
    if unknown:
        raise KbfuseError(f"{where}: {unknown[0]} is not a mapping key; known: {list(KEYS)}")
    name = data.get("name")
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise KbfuseError(f"{where}: name is {name!r}: letters, digits, '-' and '_'")
    form = data.get("format")
    if form not in FORMATS:
        raise KbfuseError(f"{where}: format is {form!r}; known: {list(FORMATS)}")
    numerics = data.get("numerics", "kernelbench-defaults")
    if numerics not in NUMERICS:
        raise KbfuseError(f"{where}: numerics is {numerics!r}; known: {list(NUMERICS)}")
    if form == "folder":
        extra = sorted(set(data) & {"fields", "claims"})
        if extra:
            raise KbfuseError(f"{where}: {extra[0]} is for a JSON corpus, not format folder")
        return Mapping(
            name=name,
            format=form,
            fields={},
            numerics=numerics,
            filters=_filters(data.get("filters") or {}, where),
            name_pattern=_name_pattern(data.get("name_pattern"), where),
            source=where,
        )
    if "name_pattern" in data:
        raise KbfuseError(f"{where}: name_pattern is for format folder, not {form}")
    return Mapping(
        name=name,
        format=form,
        fields=_fields(data.get("fields"), where),
        claims=_claims(data.get("claims") or {}, where),
        numerics=numerics,
        filters=_filters(data.get("filters") or {}, where),
        source=where,
    )


def load_mapping(name_or_path: str) -> Mapping:
    """The mapping of a packaged name (e.g. `cuda_l1`) or a YAML file, checked."""
    text, where = mapping_text(name_or_path)
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise KbfuseError(f"{where} is not YAML: {' '.join(str(exc).split())}") from None
    return parse_mapping(data, where)
