"""Result records and manifests as untrusted input: parsed strictly, checked against schemas.

Every JSON file kbfuse reads back (a result record of docs/contracts.md, or a manifest) may
come from another machine or have been edited, so it is validated where it is read, before
any value is used:

- reading and parsing are strict (kbfuse.untrusted): a regular file (a FIFO, a device or a
  link to one is refused), at most `MAX_RECORD_BYTES` (checked before reading), UTF-8, no
  `NaN`/`Infinity` literals (kbfuse writes non-finite floats as the strings "nan", "inf",
  "-inf", and only where a float may be non-finite), no key given twice in one object, at
  most kbfuse.untrusted.MAX_JSON_DEPTH levels of nesting;
- the record is checked against its JSON Schema (`src/kbfuse/schemas/<kind>.schema.json`,
  shipped with the package): booleans are JSON booleans (the string "false" is not a pass),
  counts are non-negative integers, measured times are finite and not negative, names that
  become paths or table keys match a safe pattern;
- what a schema cannot say is checked here: counts that add up (bit-equal elements never
  exceed the elements, a summary's totals equal the sums over its cases, quartiles in order).

Two helpers serve the readers: `inside(root, rel)` refuses a path built from a config or
manifest name that would leave its root, and `staged(outdir)` lets a writer put its files in
place only when all are complete.

Every refusal is a `KbfuseError` naming the file, the field and the bad value. The schemas are
the machine-checked form of the record contracts in docs/contracts.md: change both together.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator, Mapping
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any
from urllib.parse import urldefrag, urljoin

from kbfuse import untrusted
from kbfuse.errors import KbfuseError
from kbfuse.layout import RECORDS

MAX_RECORD_BYTES = 64 << 20
# Every result record (kbfuse.layout.RECORDS), the manifest and the survey's records (its tasks',
# and its cross-device check's) have a schema of their own.
SCHEMA_KINDS = (*RECORDS, "manifest", "survey_task", "survey_devices", "survey_floor")
_SHOWN_ERRORS = 5


def schema_text(name: str) -> str:
    """The text of one packaged schema file (`<kind>.schema.json` or `defs.schema.json`)."""
    return resources.files("kbfuse").joinpath("schemas", name).read_text()


@cache
def _registry():
    from referencing import Registry, Resource

    names = [f"{kind}.schema.json" for kind in SCHEMA_KINDS] + ["defs.schema.json"]
    return Registry().with_resources(
        (name, Resource.from_contents(json.loads(schema_text(name)))) for name in names
    )


def inline_refs(schema: Any, registry, base: str) -> Any:
    """`schema` (found at URI `base`) with every `$ref` replaced by what it points to in
    `registry`: a `$ref` with sibling keywords becomes those siblings and an `allOf` of the
    target; a `$ref` back into a schema being inlined stays, made absolute. Validation then
    never looks a reference up, where half of validating a survey record went. The errors are
    the same: jsonschema reports a failure under `$ref` or `allOf` as the target's own."""
    return _inlined(schema, registry, base, (base,))


def _inlined(schema: Any, registry, base: str, seen: tuple[str, ...]) -> Any:
    if isinstance(schema, list):
        return [_inlined(item, registry, base, seen) for item in schema]
    if not isinstance(schema, dict):
        return schema
    if isinstance(schema.get("$id"), str):
        base = urljoin(base, schema["$id"])
    out = {key: _inlined(value, registry, base, seen) for key, value in schema.items()}
    ref = out.pop("$ref", None)
    if ref is None:
        return out
    uri = urljoin(base, ref)
    if uri in seen:
        return {**out, "$ref": uri}
    target = registry.resolver(base_uri=base).lookup(ref).contents
    target = _inlined(target, registry, urldefrag(uri).url, (*seen, uri))
    return {**out, "allOf": [*out.get("allOf", []), target]} if out else target


@cache
def _validator(kind: str):
    import jsonschema

    if kind not in SCHEMA_KINDS:
        raise KbfuseError(f"no record schema for kind {kind!r}; known: {list(SCHEMA_KINDS)}")
    schema = json.loads(schema_text(f"{kind}.schema.json"))
    inlined = inline_refs(schema, _registry(), schema["$id"])
    return jsonschema.Draft202012Validator(inlined, registry=_registry())


def _dotted(path: Iterable[Any]) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "<top level>"


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _error_line(error) -> str:
    path = list(error.absolute_path)
    if error.validator == "required" and isinstance(error.instance, Mapping):
        missing = [k for k in error.validator_value if k not in error.instance]
        return "; ".join(f"field {_dotted([*path, k])} is missing" for k in missing)
    return f"field {_dotted(path)} is {_shown(error.instance)}: {error.message[:200]}"


def validate_record(data: Any, kind: str, label: str) -> None:
    """Check one parsed record (or manifest) against its schema, then its counts."""
    errors = sorted(
        _validator(kind).iter_errors(data), key=lambda e: list(map(str, e.absolute_path))
    )
    if errors:
        lines = list(dict.fromkeys(_error_line(e) for e in errors[:_SHOWN_ERRORS]))
        more = len(errors) - _SHOWN_ERRORS
        if more > 0:
            lines.append(f"... and {more} more")
        raise KbfuseError(
            f"{label} does not follow the {kind} record schema:\n  " + "\n  ".join(lines)
        )
    problems = count_problems(data)
    if problems:
        raise KbfuseError(f"{label}: counts do not add up:\n  " + "\n  ".join(problems))


def parse_json(raw: bytes, label: str) -> Any:
    """Strict JSON (kbfuse.untrusted.parse_json): UTF-8, no NaN/Infinity literals, no key
    given twice in one object, not nested too deeply, at most MAX_RECORD_BYTES."""
    return untrusted.parse_json(raw, label, MAX_RECORD_BYTES)


def read_limited(path: str | Path) -> bytes:
    """A record file's bytes: a regular file (or a link to one), refused before reading when
    over MAX_RECORD_BYTES (a FIFO or a link to /dev/zero is refused, never read)."""
    return untrusted.read_bytes(path, MAX_RECORD_BYTES, follow=True)


def read_record(path: str | Path, kind: str) -> dict:
    """Read, parse and validate one record file; KbfuseError naming the file otherwise."""
    data = parse_json(read_limited(path), str(path))
    validate_record(data, kind, str(path))
    return data


# ---------------------------------------------------------------- relations


def _case_problems(case: Mapping, where: str) -> list[str]:
    problems = []
    elements = case["elements"]
    for key in ("bit_equal", "nonfinite_reference", "nonfinite_candidate", "nonfinite_mismatch"):
        if case[key] > elements:
            problems.append(f"{where}.{key} is {case[key]}, more than its {elements} elements")
    return problems


def _summary_problems(checked: Mapping, where: str) -> list[str]:
    cases, summary = checked["cases"], checked.get("summary")
    problems = []
    for i, case in enumerate(cases):
        problems += _case_problems(case, f"{where}cases[{i}]")
    if not isinstance(summary, Mapping):
        return problems
    sums = {
        "cases": len(cases),
        "elements": sum(c["elements"] for c in cases),
        "elements_bit_equal": sum(c["bit_equal"] for c in cases),
        "bit_identical_cases": sum(c["bit_equal"] == c["elements"] for c in cases),
    }
    for key, total in sums.items():
        if key in summary and summary[key] != total:
            problems.append(
                f"{where}summary.{key} is {_shown(summary[key])}, its cases add up to {total}"
            )
    return problems


def _measurement_problems(node: Any, where: str) -> list[str]:
    """Quartiles in order wherever a measurement (samples_ms + median/q1/q3) appears."""
    problems: list[str] = []
    if isinstance(node, Mapping):
        if {"samples_ms", "median_ms", "q1_ms", "q3_ms"} <= set(node):
            q1, median, q3 = node["q1_ms"], node["median_ms"], node["q3_ms"]
            if not q1 <= median <= q3:
                problems.append(f"{where}: q1_ms {q1} <= median_ms {median} <= q3_ms {q3} fails")
        for key, value in node.items():
            problems += _measurement_problems(value, f"{where}.{key}" if where else key)
    return problems


def _exhaustive_problems(exhaustive: Mapping) -> list[str]:
    problems = []
    for variant, rec in exhaustive.items():
        if not rec["nan_payload_only"] <= rec["differ"] <= rec["inputs"]:
            problems.append(
                f"exhaustive.{variant}: nan_payload_only {rec['nan_payload_only']} <= "
                f"differ {rec['differ']} <= inputs {rec['inputs']} fails"
            )
    return problems


def count_problems(data: Mapping) -> list[str]:
    """The relations between counts (and times) of a record that has passed its schema."""
    kind = data["kind"]
    problems: list[str] = []
    if kind == "correctness":
        problems += _summary_problems(data, "")
    elif kind == "correctness_baselines":
        for impl, checked in data["implementations"].items():
            problems += _summary_problems(checked, f"implementations.{impl}.")
    elif kind == "controls":
        for variant, rec in data["tiny_values"].items():
            for i, case in enumerate(rec["cases"]):
                problems += _case_problems(case, f"tiny_values.{variant}.cases[{i}]")
        problems += _exhaustive_problems(data.get("exhaustive", {}))
    if kind in ("timing", "controls"):
        problems += _measurement_problems(data, "")
    return problems


def inside(root: str | Path, rel: str | Path) -> Path:
    """root / rel, refused unless it stays inside root (names from a config or a manifest
    become paths: `../` segments or an absolute name must not reach anything else)."""
    root = Path(root)
    path = root / rel
    if Path(rel).is_absolute() or not path.resolve().is_relative_to(root.resolve()):
        raise KbfuseError(f"path {str(rel)!r} leaves the directory {root}; refusing to read it")
    return path


STAGING_PREFIX = ".partial-"


@contextlib.contextmanager
def staged(outdir: str | Path) -> Iterator[Path]:
    """A staging directory inside outdir; its files move into outdir when the block ends
    without an exception, and none of them before. Staging left by a killed run is removed
    first; the output directory is created, an existing file of that name is refused."""
    outdir = Path(outdir)
    if outdir.exists() and not outdir.is_dir():
        raise KbfuseError(f"output directory {outdir} exists and is not a directory")
    outdir.mkdir(parents=True, exist_ok=True)
    for stale in outdir.glob(STAGING_PREFIX + "*"):
        shutil.rmtree(stale, ignore_errors=True)
    stage = Path(tempfile.mkdtemp(dir=outdir, prefix=STAGING_PREFIX))
    try:
        yield stage
        for path in sorted(stage.iterdir()):
            os.replace(path, outdir / path.name)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
