"""The study configuration: schema validation plus the checks a schema cannot express.

Snakemake's `validate` (JSON Schema, defaults filled in) runs first; `check_config` then
rejects what is well-formed but wrong: an option that contradicts its route or is given
twice, a kernel source that does not exist, an empty value range. Every message names the
key and the value, and all of this happens before any job is scheduled.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from kbfuse import kernelsrc
from kbfuse.compile import NVRTC_ROUTES
from kbfuse.errors import KbfuseError
from kbfuse.routes import option_problems

SCHEMA = Path(__file__).resolve().parents[2] / "workflow" / "schemas" / "config.schema.yaml"


def _schema_path(schema: str | Path | None) -> Path:
    return Path(schema) if schema is not None else SCHEMA


def _key(path) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "<top level>"


def validate_schema(config: dict, schema: str | Path | None = None) -> dict:
    """Fill schema defaults and reject schema violations, naming key and value.

    Uses snakemake.utils.validate for defaults (the same call the Snakefile makes) and
    jsonschema directly for a message that names the offending key.
    """
    import jsonschema

    with open(_schema_path(schema)) as fh:
        schema_doc = yaml.safe_load(fh)
    validator = jsonschema.Draft202012Validator(schema_doc)
    errors = sorted(validator.iter_errors(config), key=lambda e: list(e.absolute_path))
    if errors:
        lines = [
            f"config key {_key(e.absolute_path)}: {e.instance!r} is invalid: {e.message}"
            for e in errors
        ]
        raise KbfuseError("invalid config:\n  " + "\n  ".join(lines))
    _fill_variant_defaults(config)
    config.setdefault("kernelbench", {}).setdefault("level", 2)
    select_toolchains(config)
    return config


def select_toolchains(config: dict) -> dict:
    """Leave out of the study every variant that names an NVRTC version (`nvrtc: "12.9"`) not
    listed in `nvrtc_versions`; variants without `nvrtc` use the default NVRTC and always stay.
    Done in place, so every stage, the summary and the manifest see the same variants."""
    included = set(config.setdefault("nvrtc_versions", []))
    config["variants"] = {
        name: spec
        for name, spec in config.get("variants", {}).items()
        if spec.get("nvrtc") is None or spec["nvrtc"] in included
    }
    if not config["variants"]:
        raise KbfuseError(
            f"config key nvrtc_versions: {sorted(included)!r} leaves no variant in the study"
        )
    return config


def _fill_variant_defaults(config: dict) -> None:
    for spec in config.get("variants", {}).values():
        spec.setdefault("kernel", "naive")


def check_config(config: Mapping[str, Any], kernels_dir: str | Path = "kernels") -> None:
    """Semantic checks after the schema. Raises KbfuseError listing every problem."""
    problems: list[str] = []
    for name, spec in config["variants"].items():
        route, options = spec["route"], list(spec["options"])
        for problem in option_problems(route, options):
            problems.append(f"config key variants.{name}.options: {problem}")
        if spec.get("nvrtc") is not None and route not in NVRTC_ROUTES:
            problems.append(
                f"config key variants.{name}.nvrtc: {spec['nvrtc']!r} applies only to the "
                f"routes {list(NVRTC_ROUTES)}, not {route!r}"
            )
        source = Path(kernels_dir) / f"{spec.get('kernel', 'naive')}.cu"
        if not source.is_file():
            problems.append(
                f"config key variants.{name}.kernel: {spec.get('kernel')!r} has no source {source}"
            )
        else:
            try:
                kernelsrc.load(source)
            except KbfuseError as exc:
                problems.append(f"config key variants.{name}.kernel: {exc}")
    tiny = config["controls"]["tiny_values"]
    if not tiny["low"] < tiny["high"]:
        problems.append(
            f"config key controls.tiny_values: low {tiny['low']!r} "
            f"must be below high {tiny['high']!r}"
        )
    if problems:
        raise KbfuseError("invalid config:\n  " + "\n  ".join(problems))


def load_config(path: str | Path, kernels_dir: str | Path = "kernels") -> dict:
    """Read, validate and check a config file (for tools outside Snakemake)."""
    with open(path) as fh:
        config = yaml.safe_load(fh)
    if not isinstance(config, dict):
        raise KbfuseError(f"config file {path}: expected a mapping, got {type(config).__name__}")
    validate_schema(config)
    check_config(config, kernels_dir)
    return config


def variant_spec(config: Mapping[str, Any], name: str) -> dict:
    """The resolved spec of one variant: route, kernel, options (a list)."""
    try:
        spec = config["variants"][name]
    except KeyError:
        raise KbfuseError(
            f"unknown variant {name!r}; configured: {sorted(config['variants'])}"
        ) from None
    resolved = {
        "name": name,
        "route": spec["route"],
        "kernel": spec.get("kernel", "naive"),
        "options": list(spec["options"]),
    }
    if spec.get("nvrtc") is not None:
        resolved["nvrtc"] = spec["nvrtc"]
    return resolved
