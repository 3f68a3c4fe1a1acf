"""The compiler flags a candidate's extension was built with, and what they imply for the bits.

Two sources, both recorded: the arguments the candidate passed (`extra_cuda_cflags`,
`extra_cflags`, CuPy `options`), captured by wrapping `torch.utils.cpp_extension.load_inline`
/ `load` and `cupy.RawModule` / `cupy.RawKernel` in the candidate's process before its file is
imported; and the command lines torch really ran, read from the `build.ninja` files of the
scratch `TORCH_EXTENSIONS_DIR` (torch adds its own flags there: `-gencode`,
`--expt-relaxed-constexpr`, `-D__CUDA_NO_HALF_OPERATORS__`, `-std=c++17`, ...).

`implications` reads nvcc's numerics from a device flag list: the last `--ftz`, `--fmad`,
`--prec-div`, `--prec-sqrt` wins; `--use_fast_math` implies ftz=true, fmad=true,
prec-div=false, prec-sqrt=false unless the flag is given explicitly (kbfuse.compilation.routes'
FAST_MATH_IMPLIES); nvcc's defaults are ftz=false, fmad=true, prec-div=true, prec-sqrt=true.
Flags handed to ptxas (`-Xptxas`) and host flags that ask for fast math are listed apart:
they do not change the device arithmetic of nvcc's CUDA C++ front end, but a reader should
see them. This is what the flags *say*; `kbfuse.candidates.witness` measures FTZ.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable, Sequence
from pathlib import Path

from kbfuse.compilation.routes import FAST_MATH_IMPLIES

NVCC_DEFAULTS = {"ftz": "false", "fmad": "true", "prec-div": "true", "prec-sqrt": "true"}
BOOL_OPTIONS = tuple(NVCC_DEFAULTS)
FAST_MATH_SPELLINGS = ("--use_fast_math", "-use_fast_math", "--use-fast-math")
HOST_FAST_MATH = ("-ffast-math", "-Ofast", "-funsafe-math-optimizations")
# The build.ninja variables that hold compiler flags (torch.utils.cpp_extension).
NINJA_FLAG_VARS = ("cflags", "post_cflags", "cuda_cflags", "cuda_post_cflags", "ldflags")


def _bool_option(token: str, following: str | None) -> tuple[str, str, bool] | None:
    """(name, value, consumed_next) when `token` sets one of nvcc's numeric options."""
    stripped = token.lstrip("-")
    if token == stripped or len(token) - len(stripped) > 2:
        return None
    name, sep, value = stripped.partition("=")
    if name not in BOOL_OPTIONS:
        return None
    if sep:
        return name, value.lower(), False
    if following is not None and following.lower() in ("true", "false"):
        return name, following.lower(), True
    return None


def split_flags(flags: Iterable[str]) -> list[str]:
    """One token per list item: items that hold several flags ("-O3 --use_fast_math") are
    split as a shell would."""
    tokens: list[str] = []
    for item in flags:
        tokens.extend(shlex.split(str(item)))
    return tokens


def implications(device_flags: Sequence[str], host_flags: Sequence[str] = ()) -> dict:
    """What the flags say about the device numerics (see the module docstring)."""
    tokens = split_flags(device_flags)
    explicit: dict[str, str] = {}
    fast_math = False
    ptxas: list[str] = []
    host_fast = [t for t in split_flags(host_flags) if t in HOST_FAST_MATH]
    index = 0
    while index < len(tokens):
        token = tokens[index]
        following = tokens[index + 1] if index + 1 < len(tokens) else None
        if token in FAST_MATH_SPELLINGS:
            fast_math = True
        elif token in ("-Xptxas", "--ptxas-options") and following is not None:
            ptxas.append(following)
            index += 1
        elif token.startswith(("-Xptxas=", "--ptxas-options=")):
            ptxas.append(token.partition("=")[2])
        elif token in ("-Xcompiler", "--compiler-options") and following is not None:
            host_fast.extend(t for t in following.split(",") if t in HOST_FAST_MATH)
            index += 1
        else:
            parsed = _bool_option(token, following)
            if parsed is not None:
                name, value, consumed = parsed
                explicit[name] = value
                index += consumed
        index += 1
    effective = dict(NVCC_DEFAULTS)
    if fast_math:
        effective.update(FAST_MATH_IMPLIES)
    effective.update(explicit)
    return {
        "use_fast_math": fast_math,
        "explicit": explicit,
        "ftz": effective["ftz"] == "true",
        "fmad": effective["fmad"] == "true",
        "prec_div": effective["prec-div"] == "true",
        "prec_sqrt": effective["prec-sqrt"] == "true",
        "ptxas_options": ptxas,
        "host_fast_math": host_fast,
    }


def read_ninja_flags(path: str | Path) -> dict[str, list[str]]:
    """The flag variables of one torch-generated build.ninja, each split into tokens.

    Only `name = value` lines at the top level are read (torch writes its flags there);
    `$`-continued lines are joined first.
    """
    text = Path(path).read_text(errors="replace").replace("$\n", "")
    found: dict[str, list[str]] = {}
    for line in text.splitlines():
        if line[:1].isspace() or "=" not in line:
            continue
        name, _, value = line.partition("=")
        name = name.strip()
        if name in NINJA_FLAG_VARS:
            try:
                found[name] = shlex.split(value)
            except ValueError:
                found[name] = value.split()
    return found


def ninja_builds(extensions_dir: str | Path) -> list[dict]:
    """Every build.ninja under the scratch extensions directory: extension name and flags."""
    root = Path(extensions_dir)
    builds = []
    for ninja in sorted(root.rglob("build.ninja")) if root.is_dir() else []:
        flags = read_ninja_flags(ninja)
        device = [*flags.get("cuda_cflags", []), *flags.get("cuda_post_cflags", [])]
        host = [*flags.get("cflags", []), *flags.get("post_cflags", [])]
        builds.append(
            {
                "extension": ninja.parent.name,
                "cuda_flags": device,
                "host_flags": host,
                "implies": implications(device, host),
            }
        )
    return builds


def user_device_flags(captured: Sequence[dict]) -> list[str]:
    """The device flags the candidate itself asked for, over all its captured builds."""
    flags: list[str] = []
    for build in captured:
        flags.extend(split_flags(build.get("extra_cuda_cflags") or []))
        flags.extend(split_flags(build.get("options") or []))
    return flags
