"""Compilation routes and the compiler options a variant may give them.

A variant is a route plus a list of NVRTC-style options, one option per list item, written
`--name=value` (or NVRTC's short form `-name=value`; `-DNAME=VAL`, `-UNAME` glued).

Options are an allow-list, checked by `option_problems` when the config is checked (before any
job) and again by the compile job: an option must be one of `_OPTION_SPECS`, its value must fit
its kind (and `value_pattern`), and options that read or write files kbfuse does not track
(`-I`, `-include`, the precompiled-header family, `--fdevice-time-trace`, `--time`) are refused
with the reason. Values can carry no shell character: nvcc hands `-D` values to a shell, so
`-DX=$(cmd)` would run `cmd`. Every option is ASCII and printable (NVRTC takes C strings).

CuPy 14's `RawModule(code=..., options=user)` compiles with NVRTC and passes, in this order
(cupy v14.2.0: `assemble_cupy_compiler_options` in cupy/_core/core.pyx lines 2581-2618,
`_compile_with_cache_cuda` in cupy/cuda/compiler.py line 667, `_compile_using_nvrtc_no_warning`
in cupy/cuda/compiler.py lines 356-379):

    -I<cupy>/include/cupy/_cccl/{cub,thrust,libcudacxx}    CCCL headers bundled with CuPy
    <user options>
    --std=c++17                                             only when no -std/--std was given
    -I<cupy>/include  -I<CUDA include dir>                  CuPy and CUDA runtime headers
    -ftz=true                                               always, after the user's options
    -arch=sm_XY                                             (-arch=compute_XY, PTX, when
                                                             CUPY_COMPILE_WITH_PTX=1 or the GPU
                                                             is newer than NVRTC knows)
    --device-as-default-execution-space                     (not added with jitify=True)
    --pch                                                   only with CUPY_NVRTC_USE_PCH=1

Only `-ftz=true` changes the numerics, so it is the route's `implicit_options`; the rest are
bookkeeping (see `is_cupy_bookkeeping_option`). NVRTC lets a later occurrence of an option override
an earlier one and only warns ("--ftz(-ftz)=false" followed by "--ftz(-ftz)=true"; checked with
NVRTC 13.0.88), and so does nvcc ("incompatible redefinition for option 'ftz', the last value of
this option was used"). So a user `--ftz=false` on the cupy-default route is overridden by CuPy's
appended `-ftz=true`: `expected_ftz` is True there, and verify shows requested != effective.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from kbfuse.errors import KbfuseError


@dataclass(frozen=True)
class Route:
    name: str
    artifact_kind: str  # "cubin" | "ptx"
    compiler: str  # "nvrtc" | "nvcc"
    implicit_options: tuple[str, ...]  # appended by the route itself, after the user's options
    needs_cupy: bool
    needs_nvcc: bool
    needs_gpu_to_compile: bool


ROUTES: dict[str, Route] = {
    "cupy-default": Route(
        name="cupy-default",
        artifact_kind="cubin",
        compiler="nvrtc",
        implicit_options=("-ftz=true",),
        needs_cupy=True,
        needs_nvcc=False,
        needs_gpu_to_compile=True,  # CuPy picks -arch from the current device
    ),
    "nvrtc-cubin": Route("nvrtc-cubin", "cubin", "nvrtc", (), False, False, False),
    "nvrtc-ptx": Route("nvrtc-ptx", "ptx", "nvrtc", (), False, False, False),
    "nvcc-cubin": Route("nvcc-cubin", "cubin", "nvcc", (), False, True, False),
}


@dataclass(frozen=True)
class OptionSpec:
    """One NVRTC option. kind: flag (no value), bool (true|false), choice, int, or value.

    `refused` says why kbfuse never passes the option (it reads or writes files kbfuse does not
    track); `value_pattern` is what a `value` option may carry (a full match), so that no value
    can reach a shell, name a file or smuggle in a second option.
    """

    name: str  # canonical long name, without dashes
    short: str | None = None  # NVRTC's short alias, without the dash
    kind: str = "flag"
    choices: tuple[str, ...] = ()
    repeatable: bool = False
    nvcc: bool = False  # nvcc accepts the same spelling (checked with nvcc 13.0.88 -cubin)
    changes_output: bool = False  # makes NVRTC emit something other than PTX/cubin
    refused: str | None = None
    value_pattern: str | None = None


_IDENTIFIER = r"[A-Za-z_][A-Za-z0-9_]*"
# -DNAME or -DNAME=literal: a C identifier, optionally = a number or identifier-like token. No
# quote, space, $, (, `, comma (nvcc splits -D values at commas) or other shell character.
MACRO_DEFINITION = rf"{_IDENTIFIER}(=[A-Za-z0-9_.+-]*)?"
# -Xptxas values kbfuse passes on (ptxas options that only report or tune, never name a file).
PTXAS_OPTION = (
    r"-v|--verbose|-O[0-3]|--opt-level=[0-3]|--warn-on-spills|--warn-on-local-memory-usage"
    r"|--warn-on-double-precision-use|--allow-expensive-optimizations=(true|false)"
    r"|--maxrregcount=[0-9]+"
)
_DIAGNOSTICS = r"[A-Za-z0-9_]+(,[A-Za-z0-9_]+)*"
_READS_HEADERS = (
    "reads headers from outside kernels/, which kbfuse cannot hash; put the header in kernels/ "
    'and #include "it.cuh"'
)
_PCH = "reads or writes precompiled header files, which kbfuse cannot track"

# The options of the NVRTC 13 user guide ("Supported Compile Options"); every spelling below was
# accepted by NVRTC 13.0.88.
_OPTION_SPECS = (
    OptionSpec("gpu-architecture", "arch", "value"),
    OptionSpec("relocatable-device-code", "rdc", "bool", nvcc=True),
    OptionSpec("extensible-whole-program", "ewp", nvcc=True),
    OptionSpec("device-debug", "G", nvcc=True),
    OptionSpec("generate-line-info", "lineinfo", nvcc=True),
    OptionSpec("dopt", "dopt", "choice", ("on", "off"), nvcc=True),
    OptionSpec("Ofast-compile", "Ofc", "choice", ("0", "min", "mid", "max"), nvcc=True),
    OptionSpec(
        "ptxas-options", "Xptxas", "value", repeatable=True, nvcc=True, value_pattern=PTXAS_OPTION
    ),
    OptionSpec("maxrregcount", "maxrregcount", "int", nvcc=True),
    OptionSpec("ftz", "ftz", "bool", nvcc=True),
    OptionSpec("prec-sqrt", "prec-sqrt", "bool", nvcc=True),
    OptionSpec("prec-div", "prec-div", "bool", nvcc=True),
    OptionSpec("fmad", "fmad", "bool", nvcc=True),
    OptionSpec("use_fast_math", "use_fast_math", nvcc=True),
    OptionSpec("extra-device-vectorization", "extra-device-vectorization", nvcc=True),
    OptionSpec("modify-stack-limit", "modify-stack-limit", "bool"),
    OptionSpec("dlink-time-opt", "dlto", changes_output=True),
    OptionSpec("gen-opt-lto", "gen-opt-lto"),
    OptionSpec("optix-ir", "optix-ir", changes_output=True),
    OptionSpec("jump-table-density", "jtd", "int", nvcc=True),
    OptionSpec("device-stack-protector", "device-stack-protector", "bool"),
    OptionSpec("split-compile", "split-compile", "int", nvcc=True),
    OptionSpec("fdevice-syntax-only", "fdevice-syntax-only", changes_output=True),
    OptionSpec("minimal", "minimal"),
    OptionSpec("device-int128", "device-int128"),
    OptionSpec("device-float128", "device-float128"),
    OptionSpec("frandom-seed", "frandom-seed", "value", value_pattern=r"[A-Za-z0-9_]+"),
    OptionSpec("fdevice-time-trace", "fdevice-time-trace", "value", refused="writes a trace file"),
    OptionSpec(
        "define-macro",
        "D",
        "value",
        repeatable=True,
        nvcc=True,
        value_pattern=MACRO_DEFINITION,
    ),
    OptionSpec(
        "undefine-macro", "U", "value", repeatable=True, nvcc=True, value_pattern=_IDENTIFIER
    ),
    OptionSpec("include-path", "I", "value", repeatable=True, nvcc=True, refused=_READS_HEADERS),
    OptionSpec(
        "pre-include", "include", "value", repeatable=True, nvcc=True, refused=_READS_HEADERS
    ),
    OptionSpec("no-source-include", "no-source-include"),
    OptionSpec("std", "std", "choice", ("c++03", "c++11", "c++14", "c++17", "c++20"), nvcc=True),
    OptionSpec("builtin-move-forward", "builtin-move-forward", "bool"),
    OptionSpec("builtin-initializer-list", "builtin-initializer-list", "bool"),
    OptionSpec("pch", "pch", refused=_PCH),
    OptionSpec("create-pch", "create-pch", "value", refused=_PCH),
    OptionSpec("use-pch", "use-pch", "value", refused=_PCH),
    OptionSpec("pch-dir", "pch-dir", "value", refused=_PCH),
    OptionSpec("pch-verbose", "pch-verbose", "bool", refused=_PCH),
    OptionSpec("pch-messages", "pch-messages", "bool", refused=_PCH),
    OptionSpec(
        "instantiate-templates-in-pch", "instantiate-templates-in-pch", "bool", refused=_PCH
    ),
    OptionSpec("disable-warnings", "w", nvcc=True),
    OptionSpec("restrict", "restrict", nvcc=True),
    OptionSpec("device-as-default-execution-space", "default-device"),
    OptionSpec("optimization-info", "opt-info", "choice", ("inline",)),
    OptionSpec("display-error-number", "err-no", nvcc=True),
    OptionSpec("no-display-error-number", "no-err-no"),
    *(
        OptionSpec(name, name, "value", repeatable=True, nvcc=True, value_pattern=_DIAGNOSTICS)
        for name in ("diag-error", "diag-suppress", "diag-warn")
    ),
    OptionSpec("brief-diagnostics", "brief-diag", "bool"),
    OptionSpec("time", "time", "value", refused="writes a timing file"),
)

OPTIONS: dict[str, OptionSpec] = {spec.name: spec for spec in _OPTION_SPECS}
_BY_SPELLING: dict[str, OptionSpec] = {}
for _spec in _OPTION_SPECS:
    _BY_SPELLING["--" + _spec.name] = _spec
    _BY_SPELLING["-" + _spec.name] = _spec
    if _spec.short:
        _BY_SPELLING["-" + _spec.short] = _spec
_GLUED_SHORT = ("-D", "-U", "-I")  # -DNAME=1, -UNAME, -I/dir

# What --use_fast_math implies (NVRTC and nvcc documentation). An explicit option overrides the
# implication whatever the order (NVRTC 13.0.88: `--use_fast_math --ftz=false` emits no .ftz).
FAST_MATH_IMPLIES = {"ftz": "true", "prec-div": "false", "prec-sqrt": "false", "fmad": "true"}


@dataclass(frozen=True)
class ParsedOption:
    text: str
    spec: OptionSpec
    value: str | None


def parse_option(option) -> tuple[ParsedOption | None, str | None]:
    """(parsed, None) for a well-formed NVRTC option, (None, reason) otherwise."""
    if not isinstance(option, str):
        return None, f"option {option!r} is not a string"
    if not option:
        return None, "empty option string"
    if option != option.strip() or any(ch.isspace() for ch in option):
        return None, (
            f"option {option!r} contains whitespace: give one option per list item, "
            "written --name=value"
        )
    if not option.startswith("-"):
        return None, f"option {option!r} does not start with '-'"
    name, sep, value = option.partition("=")
    spec = _BY_SPELLING.get(name)
    if spec is None:
        for prefix in _GLUED_SHORT:
            if option.startswith(prefix) and len(option) > len(prefix):
                spec = _BY_SPELLING[prefix]
                return ParsedOption(option, spec, option[len(prefix) :]), None
        return None, f"option {option!r} is not an NVRTC option"
    value = value if sep else None
    if spec.kind == "flag":
        if value is not None:
            return None, f"option {option!r}: --{spec.name} takes no value"
    elif value is None or value == "":
        expected = {"bool": "true or false", "int": "an integer", "choice": "|".join(spec.choices)}
        return None, f"option {option!r}: --{spec.name} needs ={expected.get(spec.kind, 'a value')}"
    elif spec.kind == "bool" and value not in ("true", "false"):
        return None, f"option {option!r}: --{spec.name} expects true or false, not {value!r}"
    elif spec.kind == "choice" and value not in spec.choices:
        return None, f"option {option!r}: --{spec.name} expects one of {'|'.join(spec.choices)}"
    elif spec.kind == "int" and not re.fullmatch(r"[0-9]+", value):
        return None, f"option {option!r}: --{spec.name} expects a non-negative integer"
    return ParsedOption(option, spec, value), None


def _refusal(parsed: ParsedOption) -> str | None:
    """Why kbfuse will not pass a well-formed option to a compiler, or None."""
    text, spec, value = parsed.text, parsed.spec, parsed.value
    if not text.isascii() or not text.isprintable():
        return "it contains a non-ASCII or control character"
    if spec.refused is not None:
        return f"it {spec.refused}"
    if spec.value_pattern is not None and not re.fullmatch(spec.value_pattern, value or ""):
        return (
            f"--{spec.name} values must match {spec.value_pattern} (no shell characters, "
            "paths or commas)"
        )
    return None


def get_route(route: str) -> Route:
    try:
        return ROUTES[route]
    except KeyError:
        raise KbfuseError(f"unknown route {route!r}; known routes: {sorted(ROUTES)}") from None


def option_problems(route: str, options) -> list[str]:
    """Everything wrong with `options` for `route`, one message each naming option and route."""
    if route not in ROUTES:
        return [f"unknown route {route!r}; known routes: {sorted(ROUTES)}"]
    r = ROUTES[route]
    if isinstance(options, str) or not isinstance(options, list | tuple):
        return [f"route {route}: options must be a list of strings, got {options!r}"]
    problems = []
    seen: dict[str, ParsedOption] = {}
    for option in options:
        parsed, reason = parse_option(option)
        if parsed is None:
            problems.append(f"route {route}: {reason}")
            continue
        refusal = _refusal(parsed)
        if refusal is not None:
            problems.append(f"route {route}: option {option!r} is refused: {refusal}")
            continue
        spec = parsed.spec
        if spec.name == "gpu-architecture":
            problems.append(
                f"route {route}: option {option!r} sets the architecture, which the route and "
                "the config key `arch` own; remove it"
            )
            continue
        if spec.changes_output:
            problems.append(
                f"route {route}: option {option!r} makes the compiler emit something other than "
                f"the route's {r.artifact_kind}"
            )
        if r.compiler == "nvcc" and not spec.nvcc:
            problems.append(
                f"route {route}: option {option!r} is an NVRTC-only option with no nvcc equivalent"
            )
        earlier = seen.get(spec.name)
        if earlier is not None and not spec.repeatable:
            if earlier.value != parsed.value:
                problems.append(
                    f"route {route}: option {option!r} contradicts {earlier.text!r} "
                    f"(both set --{spec.name})"
                )
            else:
                problems.append(
                    f"route {route}: option --{spec.name} is given twice "
                    f"({earlier.text!r} and {option!r})"
                )
        seen.setdefault(spec.name, parsed)
    if "use_fast_math" in seen:
        for name, implied in FAST_MATH_IMPLIES.items():
            given = seen.get(name)
            if given is not None and given.value != implied:
                problems.append(
                    f"route {route}: option {given.text!r} contradicts "
                    f"{seen['use_fast_math'].text!r}, which implies --{name}={implied}"
                )
    return problems


def last_option_value(options, name: str) -> str | None:
    """Value of the last occurrence of option `name` (canonical long name) in `options`."""
    value = None
    for option in options:
        parsed, _ = parse_option(option)
        if parsed is not None and parsed.spec.name == name:
            value = parsed.value
    return value


def _has_fast_math(options) -> bool:
    return any(
        parsed is not None and parsed.spec.name == "use_fast_math"
        for parsed, _ in map(parse_option, options)
    )


def requested_ftz(options) -> bool | None:
    """The flush-to-zero mode the options ask for: last --ftz wins, --use_fast_math implies true;
    None when they say nothing about it."""
    value = last_option_value(options, "ftz")
    if value is not None:
        return value == "true"
    return True if _has_fast_math(options) else None


def ftz_from_options(options) -> bool:
    """The flush-to-zero mode a compiler given exactly `options` uses (NVRTC's default: false)."""
    requested = requested_ftz(options)
    return bool(requested)


def effective_options(route: str, options) -> list[str]:
    """The numerically relevant options as the route passes them: requested + implicit, in the
    order the compiler sees them (the architecture option is added separately, from `arch`)."""
    return [*options, *get_route(route).implicit_options]


def expected_ftz(route: str, options) -> bool:
    """Flush-to-zero mode the compiled code should have on `route` given the variant's options."""
    return ftz_from_options(effective_options(route, options))


def is_cupy_bookkeeping_option(option: str) -> bool:
    """Options CuPy adds that do not change numerics: include paths, the architecture, the default
    execution space, the default C++ standard and precompiled headers (see the module docstring)."""
    if option.startswith("-I"):  # include paths, even ones parse_option rejects for whitespace
        return True
    parsed, _ = parse_option(option)
    if parsed is None:
        return False
    return parsed.spec.name in (
        "include-path",
        "gpu-architecture",
        "device-as-default-execution-space",
        "pch",
    ) or option in ("--std=c++17",)
