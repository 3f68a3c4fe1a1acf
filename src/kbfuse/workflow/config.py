"""The study configuration: schema validation plus the checks a schema cannot express.

Contract: a config is refused before any job is scheduled, with one line per problem naming the
key and its value (shortened, never the whole config). In order:

1. `check_config_files`: every YAML file the config came from (config/config.yaml and each
   `--configfile`) is re-read with a loader that refuses a key given twice in one mapping
   (PyYAML and Snakemake silently keep the last one: a second `noftz` variant would replace the
   first), or more than MAX_CONFIG_VALUES values once YAML aliases are expanded. Values given
   with `--config` are parsed by Snakemake itself and are not re-read, so a key repeated inside
   one `--config` value is not detected.
2. `coerce_numbers`: Snakemake parses `--config 'tasks=[81]'` and `--config 'timing={rounds:
   25}'` into strings ('81', '25'), and YAML 1.1 reads `1e-4` (no dot) as a string too.
   Where the schema wants a number, a string spelling a decimal number (YAML 1.2's syntax) is
   read as that number, and where it wants a boolean, 'true' or 'false' is read as one;
   anything else stays and is refused by the schema.
3. `validate_schema`: no retired key (`tolerance`: read from the pinned KernelBench now), no
   control character in any key or string, no non-finite number, integer
   keys hold integers (not 25.0), then the JSON Schema (workflow/schemas/config.schema.yaml).
4. `check_config`: options against their route's allow-list (kbfuse.compilation.routes), kernel
sources
   and their headers (kbfuse.compilation.kernelsrc), value ranges (tiny_values low < high).

Together these refuse everything the jobs' own validators (timing.check_protocol,
controls.check_controls_cfg, correctness.check_request, compile.resolve_arch) would refuse
later on a GPU; tests check that claim.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Hashable, Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml

from kbfuse.compilation import kernelsrc
from kbfuse.compilation.compile import NVRTC_ROUTES
from kbfuse.compilation.routes import option_problems
from kbfuse.errors import KbfuseError

SCHEMA = Path(__file__).resolve().parents[3] / "workflow" / "schemas" / "config.schema.yaml"
SHOWN_CHARS = 80  # a value longer than this is shortened in messages
MAX_CONFIG_VALUES = 100_000  # the study's config has about 100
MAX_INTEGER_BITS = 128  # no key takes more (seeds: 64); larger ones are refused before the schema
_INTEGER = re.compile(r"[-+]?[0-9]{1,18}")  # longer stays a string: refused, not int()-ed
_DECIMAL = re.compile(r"[-+]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][-+]?[0-9]+)?")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_FLOW_HINT = (
    "on the command line give lists and mappings in YAML flow style, e.g. "
    "--config 'tasks=[53, 81]' or --config 'timing={rounds: 25, warmup: 8}'"
)


def _schema_path(schema: str | Path | None) -> Path:
    return Path(schema) if schema is not None else SCHEMA


def _key(path) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "<top level>"


def shown(value: Any) -> str:
    """repr of `value`, shortened to about SHOWN_CHARS characters."""
    try:
        text = repr(value)
    except ValueError:  # an integer too long for repr (sys.get_int_max_str_digits)
        return f"<an integer of {value.bit_length()} bits>"
    return text if len(text) <= SHOWN_CHARS else text[: SHOWN_CHARS - 5] + " ...]"


def invalid(problems: list[str]) -> KbfuseError:
    return KbfuseError("invalid config:\n  " + "\n  ".join(problems))


# --- 1. the files ------------------------------------------------------------------------------


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that refuses a mapping key given twice."""

    def construct_mapping(self, node, deep=False):
        seen: dict[Any, Any] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if not isinstance(key, Hashable):
                break  # SafeLoader refuses it ("found unhashable key")
            if key in seen:
                raise KbfuseError(
                    f"key {key!r} is given twice in one mapping (lines {seen[key] + 1} and "
                    f"{key_node.start_mark.line + 1}): YAML would silently keep only the last"
                )
            seen[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep=deep)


def read_config_file(path: str | Path) -> Any:
    """The YAML (or JSON) document of a config file; KbfuseError naming the file if a key
    repeats or the text is not YAML."""
    try:
        with open(path, encoding="utf-8") as fh:
            return yaml.load(fh, Loader=_UniqueKeyLoader)  # noqa: S506 (a SafeLoader)
    except KbfuseError as exc:
        raise KbfuseError(f"config file {path}: {exc}") from None
    except (OSError, ValueError, yaml.YAMLError) as exc:  # ValueError: bad UTF-8, huge integer
        raise KbfuseError(f"config file {path}: {' '.join(str(exc).split())}") from None
    except RecursionError:
        raise KbfuseError(f"config file {path}: nested too deeply to read") from None


def _too_many_values(document: Any) -> bool:
    """Whether `document`, its YAML aliases expanded, holds more than MAX_CONFIG_VALUES values
    (a few aliases of aliases make a small file a huge config: every later check walks it)."""
    pending, seen = [document], 0
    while pending:
        value = pending.pop()
        seen += 1
        if seen > MAX_CONFIG_VALUES:
            return True
        if isinstance(value, dict):
            pending.extend(value.values())
        elif isinstance(value, list):
            pending.extend(value)
    return False


def check_config_files(paths: Iterable[str | Path]) -> None:
    """Refuse a config file with a repeated key, too many values or a document that is not a
    mapping."""
    problems = []
    for path in paths:
        try:
            document = read_config_file(path)
        except KbfuseError as exc:
            problems.append(str(exc))
            continue
        if not isinstance(document, dict):
            problems.append(f"config file {path}: expected a mapping, got {shown(document)}")
        elif _too_many_values(document):
            problems.append(
                f"config file {path}: more than {MAX_CONFIG_VALUES} values once its YAML "
                "aliases are expanded"
            )
    if problems:
        raise invalid(problems)


# --- 2. numbers given as strings ---------------------------------------------------------------


def _number(text: str, kind: str) -> int | float | str:
    if _INTEGER.fullmatch(text.strip()):
        return int(text)
    if kind == "number" and _DECIMAL.fullmatch(text.strip()):
        return float(text)
    return text


def coerce_numbers(value: Any, schema: Mapping[str, Any]) -> Any:
    """`value` with strings that spell a number (true / false, null) turned into numbers
    (booleans, None) where `schema` wants one.

    Mappings and lists are changed in place (Snakemake's `config` is the object it keeps)."""
    kind = schema.get("type")
    kinds = kind if isinstance(kind, list) else [kind]
    if isinstance(value, str) and value == "null" and "null" in kinds:
        return None  # --config 'survey={min_sample_ms: null}' arrives as 'null'
    number = next((k for k in kinds if k in ("integer", "number")), None)
    if isinstance(value, str) and number is not None:
        return _number(value, number)
    if isinstance(value, str) and kind == "boolean" and value in ("true", "false"):
        return value == "true"  # --config 'check={in_manifest: true}' arrives as 'true'
    # a key that takes a word or a list (survey.tasks: all | [1, 2]) coerces the list's items
    if isinstance(value, list) and (kind == "array" or "array" in (kind or ())):
        items = schema.get("items", {})
        value[:] = [coerce_numbers(item, items) for item in value]
    elif isinstance(value, dict) and kind == "object":
        properties = schema.get("properties", {})
        other = schema.get("additionalProperties")
        for key, item in value.items():
            sub = properties.get(key, other if isinstance(other, dict) else {})
            value[key] = coerce_numbers(item, sub)
    return value


# --- 3. the schema -----------------------------------------------------------------------------


def _value_problems(value: Any, path: tuple = ()) -> list[str]:
    """Control characters in keys or strings, non-finite numbers and integers too large for
    any key (jsonschema's messages could not even print them), anywhere in `value`."""
    if isinstance(value, float) and not math.isfinite(value):
        return [f"config key {_key(path)}: {value!r} is not a finite number"]
    if isinstance(value, int) and value.bit_length() > MAX_INTEGER_BITS:
        return [f"config key {_key(path)}: {shown(value)} is out of range"]
    if isinstance(value, str) and _CONTROL.search(value):
        return [f"config key {_key(path)}: {shown(value)} contains a control character"]
    problems = []
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                problems.append(
                    f"config key {_key(path)}: key {shown(key)} is not a string "
                    f"(in YAML, quote it: '{key}')"
                )
            elif _CONTROL.search(key):
                where = _key(path)
                problems.append(f"config key {where}: key {shown(key)} has a control character")
            else:
                problems += _value_problems(item, (*path, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            problems += _value_problems(item, (*path, index))
    return problems


@functools.lru_cache(maxsize=4)
def _schema(path: Path) -> tuple[dict, Any]:
    """(schema document, validator) of the schema file at `path`, read once per process."""
    import jsonschema

    with open(path) as fh:  # libyaml's loader where built: a tenth of the pure-Python time
        schema_doc = yaml.load(fh, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    # JSON Schema's integer admits 25.0; the jobs (timing.int_at_least) do not.
    checker = jsonschema.Draft202012Validator.TYPE_CHECKER.redefine(
        "integer", lambda _, value: isinstance(value, int) and not isinstance(value, bool)
    )
    strict = jsonschema.validators.extend(jsonschema.Draft202012Validator, type_checker=checker)
    return schema_doc, strict(schema_doc)


def _describe(error) -> list[str]:
    """One line per problem of a jsonschema error, naming key and (shortened) value."""
    path = list(error.absolute_path)
    where = _key(path)
    instance = error.instance
    if error.validator == "additionalProperties" and isinstance(instance, dict):
        known = list(error.schema.get("properties", {}))
        prefix = f"{where}." if path else ""
        return [
            f"config key {prefix}{key}: unknown key (known here: {', '.join(known)})"
            for key in instance
            if key not in known
        ]
    if error.validator == "required" and isinstance(instance, dict):
        prefix = f"{where}." if path else ""
        return [
            f"config key {prefix}{key}: missing (required)"
            for key in error.validator_value
            if key not in instance
        ]
    message = error.message.replace(repr(instance), shown(instance))
    line = f"config key {where}: {shown(instance)} is invalid: {message}"
    if error.validator == "pattern" and error.schema.get("description"):
        line += f" ({' '.join(error.schema['description'].split())})"
    if error.validator == "type" and error.validator_value in ("array", "object"):
        line += f" ({_FLOW_HINT})"
    return [line]


# Keys earlier configs had, with what replaced them (a plain "not allowed" would not say).
RETIRED_KEYS = {
    "tolerance": "the official tolerance is read from the pinned KernelBench's evaluator "
    "(kbfuse.tasks.evaluator, written to results/kernelbench/contract.json) for every judge; "
    "remove this key",
}


def _retired_key_problems(config: Mapping) -> list[str]:
    return [
        f"config key {key}: no longer a setting: {why}"
        for key, why in RETIRED_KEYS.items()
        if key in config
    ]


def validate_schema(config: dict, schema: str | Path | None = None) -> dict:
    """Coerce numbers, refuse bad values, validate against the schema and fill its defaults.

    Messages name the offending key (jsonschema directly; the Snakefile then calls
    snakemake.utils.validate, which fills the same defaults).
    """
    schema_doc, validator = _schema(_schema_path(schema).resolve())
    if not isinstance(config, dict):
        raise invalid([f"config: expected a mapping, got {shown(config)}"])
    coerce_numbers(config, schema_doc)
    problems = _retired_key_problems(config) + _value_problems(config)
    if problems:
        raise invalid(problems)
    errors = sorted(validator.iter_errors(config), key=lambda e: list(e.absolute_path))
    # dict.fromkeys: jsonschema reports each missing required key as its own error, and
    # _describe names all of them for each one; a line is printed once, in order
    problems = list(dict.fromkeys(line for error in errors for line in _describe(error)))
    if problems:
        raise invalid(problems)
    _fill_variant_defaults(config)
    config.setdefault("kernelbench", {}).setdefault("level", 2)
    select_toolchains(config)
    if isinstance(config.get("fused2"), dict):
        select_toolchains(config["fused2"], config["nvrtc_versions"], "fused2.")
        config["fused2"]["controls"]["small_shape"].setdefault("seed", 371)
    return config


def select_toolchains(config: dict, versions=None, key: str = "") -> dict:
    """Leave out of the study every variant that names an NVRTC version (`nvrtc: "12.9"`) not
    listed in `nvrtc_versions` (or `versions`, for the second study's block, which shares the
    top level's); variants without `nvrtc` use the default NVRTC and always stay. Done in
    place, so every stage, the summary and the manifest see the same variants."""
    included = set(config.setdefault("nvrtc_versions", []) if versions is None else versions)
    config["variants"] = {
        name: spec
        for name, spec in config.get("variants", {}).items()
        if spec.get("nvrtc") is None or spec["nvrtc"] in included
    }
    if not config["variants"]:
        raise KbfuseError(
            f"config key nvrtc_versions: {sorted(included)!r} leaves no variant in the study"
            + (f" ({key}variants)" if key else "")
        )
    return config


def _fill_variant_defaults(config: dict) -> None:
    blocks = [config.get("variants", {})]
    if isinstance(config.get("fused2"), dict):
        blocks.append(config["fused2"].get("variants", {}))
    for variants in blocks:
        for spec in variants.values():
            spec.setdefault("kernel", "naive")


def _kernel_problems(name: str, kernel: str, kernels_dir: Path, prefix: str = "") -> list[str]:
    key = f"config key {prefix}variants.{name}.kernel"
    source = kernels_dir / f"{kernel}.cu"
    if not source.is_file():
        return [f"{key}: {kernel!r} has no source {source}"]
    if source.resolve().parent != kernels_dir.resolve():
        return [f"{key}: {kernel!r}: {source} is a link out of {kernels_dir}"]
    try:
        kernelsrc.load(source)
    except KbfuseError as exc:
        return [f"{key}: {exc}"]
    return []


def _study_problems(config: Mapping[str, Any], kernels_dir: Path, key: str = "") -> list[str]:
    """What the schema cannot say about one study (the top level, or the `fused2.` block):
    options against their route, the kernel sources, the kernels they define for the study's
    tasks, the small shape's sizes for its tasks' library op, the tiny-value range."""
    from kbfuse.workflow.studies import kernel_problems, numerics_problems

    problems: list[str] = numerics_problems(config, key)
    sources: list[str] = []
    for name, spec in config["variants"].items():
        route, options = spec["route"], list(spec["options"])
        for problem in option_problems(route, options):
            problems.append(f"config key {key}variants.{name}.options: {problem}")
        if spec.get("nvrtc") is not None and route not in NVRTC_ROUTES:
            problems.append(
                f"config key {key}variants.{name}.nvrtc: {spec['nvrtc']!r} applies only to the "
                f"routes {list(NVRTC_ROUTES)}, not {route!r}"
            )
        sources += _kernel_problems(name, spec.get("kernel", "naive"), kernels_dir, key)
    # which kernels a source defines, once every source loads
    problems += sources or kernel_problems(config, kernels_dir, key)
    problems += _small_shape_problems(config, key)
    tiny = config["controls"]["tiny_values"]
    if not tiny["low"] < tiny["high"]:
        problems.append(
            f"config key {key}controls.tiny_values: low {tiny['low']!r} "
            f"must be below high {tiny['high']!r}"
        )
    return problems


def _small_shape_problems(config: Mapping[str, Any], key: str) -> list[str]:
    """The small shape must name the sizes its tasks' tails resize (kbfuse.tasks.tailbase
    `small_shape_keys`): one kind of library op per study."""
    from kbfuse.tasks.registry import TAIL_TASKS
    from kbfuse.tasks.tails import tail_for

    shape = set(config["controls"]["small_shape"]) - {"seed"}
    problems = []
    for task in config["tasks"]:
        if task not in TAIL_TASKS:
            continue  # the schema names it
        wanted = set(tail_for(task).small_shape_keys)
        if shape != wanted:
            problems.append(
                f"config key {key}controls.small_shape: task {task} needs "
                f"{sorted(wanted)} (besides seed), got {sorted(shape)}"
            )
    return problems


def check_config(config: Mapping[str, Any], kernels_dir: str | Path = "kernels") -> None:
    """Semantic checks after the schema. Raises KbfuseError listing every problem."""
    from kbfuse.workflow.studies import FUSED2, fused2_config

    problems = _study_problems(config, Path(kernels_dir))
    second = fused2_config(config)
    if second is not None:
        problems += _study_problems(second, Path(kernels_dir), f"{FUSED2}.")
    problems += _check_block_problems(config.get("check"))
    problems += _audit_block_problems(config.get("audit"))
    if problems:
        raise invalid(problems)


def _check_block_problems(block: Any) -> list[str]:
    """What the schema cannot say about the `check:` block (kbfuse check, docs/check.md)."""
    from kbfuse.candidates.spec import check_settings

    try:
        check_settings(block)
    except KbfuseError as exc:
        return [f"config key {exc}"]
    return []


def _audit_block_problems(block: Any) -> list[str]:
    """What the schema cannot say about the `audit:` block (docs/audit.md); its corpus and
    mapping are read by workflow/rules/audit.smk, which names their problems too."""
    from kbfuse.audit.settings import audit_settings

    try:
        audit_settings(block)
    except KbfuseError as exc:
        return [f"config key {exc}"]
    return []


def check_workflow_config(
    config: dict, configfiles: Iterable[str | Path], kernels_dir: str | Path
) -> dict:
    """Everything above, for the Snakefile: the files, then the merged `config` (in place)."""
    check_config_files(configfiles)
    validate_schema(config)
    check_config(config, kernels_dir)
    return config


def load_config(path: str | Path, kernels_dir: str | Path = "kernels") -> dict:
    """Read, validate and check a config file (for tools outside Snakemake)."""
    check_config_files([path])
    return check_workflow_config(read_config_file(path), [], kernels_dir)


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
