"""Kernel sources: one translation unit per kernels/<name>.cu, and its launch contract.

`#include "file.cuh"` lines (quoted, next to the .cu) are inlined here before compiling, so
every compile route (NVRTC, CuPy, nvcc) sees the same single text and the compile record can
hash exactly what was compiled. Headers are inlined once each (a second include of the same
file is dropped, as `#pragma once` would). `#line` directives around each inlined header keep
compiler messages naming the right file and line.

Every byte that reaches the compiler is tracked: the only includes left to the compiler are
angle-bracket includes of `SYSTEM_HEADERS` (the toolchain's own, identified by the compiler
version the compile record holds). Any other file-reading directive is refused, naming the file
and line: another angle-bracket include, an include through a macro, a quoted include this
module cannot inline (e.g. one split by a line continuation or followed by a comment spanning
lines), `#include_next`, `#import`, `#embed` and `__has_include`. A header must be a regular file
in the directory of the kernel sources (kernels/), not a link out of it.

Each .cu declares how its kernels must be launched, in one comment line for all its kernels,
and optionally one line per kernel that launches differently:

    // kbfuse-launch: per-element threads=256
    // kbfuse-launch: grid-stride threads=256 blocks-per-sm=16 items-per-thread=8
    // kbfuse-launch tail53: grid-stride threads=256 blocks-per-sm=64 items-per-thread=8

`per-element`: one thread per element, grid = ceil(n / threads). `grid-stride`: every thread
loops over the tensor, so any grid is correct; the grid is `blocks-per-sm` blocks per SM,
capped at ceil(n / (threads * items-per-thread)) so small tensors get no idle blocks.
`per-block`: one block of `threads` per work item of the tail (a (sample, channel) plane of a
reduction, kbfuse.tasks.tailbase.Tail.launch_items), grid = n.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import asdict, dataclass
from pathlib import Path

from kbfuse.errors import KbfuseError

HEADER_SUFFIXES = (".cuh", ".h")
# Headers of the CUDA toolchain (and the C integer/float limits) a source may include with <...>.
SYSTEM_HEADERS = (
    "cuda_fp16.h",
    "cuda_bf16.h",
    "cuda_fp8.h",
    "cstdint",
    "stdint.h",
    "cfloat",
    "float.h",
    "climits",
    "limits.h",
)
_INCLUDE = re.compile(
    r'^[ \t]*#[ \t]*include[ \t]*"([^"\n]+)"[ \t]*(?:/\*(?:[^*\n]|\*(?!/))*\*/[ \t]*)*(?://.*)?\r?$',
    re.M,
)
# Comments and literals, left to right, as the compiler reads them (so "/*" in a string, a raw
# string R"(...)" or a digit separator 1'000 opens no comment and no character literal).
_COMMENT_OR_LITERAL = re.compile(
    r"""
    (?P<comment>//[^\n]*|/\*.*?(?:\*/|\Z))
    |(?P<raw>(?<![A-Za-z0-9_])(?:u8|u|U|L)?R"(?P<delim>[^()\\\s"]{0,16})\(.*?\)(?P=delim)")
    |(?<![A-Za-z0-9_])\.?[0-9](?:[eEpP][-+]|'[0-9A-Za-z_]|[0-9A-Za-z_.])*
    |"(?:\\.|[^"\\\n])*"
    |'(?:\\.|[^'\\\n])*'
    """,
    re.S | re.X,
)
_FILE_DIRECTIVE = re.compile(
    r"^[ \t]*(?:#|%:|\?\?=)[ \t]*(include_next|include|import|embed)\b[ \t]*(.*)$", re.M
)
_HAS_INCLUDE = re.compile(r"\b__has_(?:include|include_next|embed)\b")
_ANGLE = re.compile(r"^<([^<>]+)>")
_PRAGMA_ONCE = re.compile(r"^[ \t]*#[ \t]*pragma[ \t]+once[ \t]*$", re.M)
_LAUNCH_LINE = re.compile(r"^[ \t]*//[ \t]*kbfuse-launch(?:[ \t]+(\w+))?[ \t]*:(.*)$", re.M)

_FIELD_VALUE = re.compile(r"[0-9]{1,9}")
LAUNCH_MODES = ("per-element", "grid-stride", "per-block")
MAX_THREADS_PER_BLOCK = 1024


@dataclass(frozen=True)
class Launch:
    """How the kernels of one source are launched (the source's kbfuse-launch line)."""

    mode: str
    threads: int
    blocks_per_sm: int | None = None
    items_per_thread: int | None = None

    def record(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class LaunchPlan:
    """The launch of every kernel of one source: a default and per-kernel exceptions."""

    default: Launch
    per_kernel: dict[str, Launch]

    def for_kernel(self, name: str) -> Launch:
        return self.per_kernel.get(name, self.default)

    def record(self) -> dict:
        return {
            "default": self.default.record(),
            "per_kernel": {name: launch.record() for name, launch in self.per_kernel.items()},
        }

    @classmethod
    def from_record(cls, record) -> LaunchPlan:
        """The plan of a compile record's `launch`; TypeError/KeyError/AttributeError if bad."""
        return cls(
            default=Launch(**record["default"]),
            per_kernel={name: Launch(**rec) for name, rec in record["per_kernel"].items()},
        )


@dataclass(frozen=True)
class KernelSource:
    """A kernel source with its headers inlined."""

    path: Path
    text: str  # the translation unit that is compiled
    files: dict[str, str]  # file name -> sha256 of its bytes: the .cu first, then headers
    launch: LaunchPlan

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.text.encode()).hexdigest()


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def included_headers(path: str | Path) -> list[Path]:
    """Every header `path` includes with quotes, directly or through other headers, in order."""
    return [Path(path).parent / name for name in list(_expand(Path(path))[1])[1:]]


def _expand(path: Path) -> tuple[str, dict[str, str]]:
    files: dict[str, str] = {}
    text = _inline(path, files, chain=())
    return text, files


def _without_comments(text: str) -> str:
    """`text` with comments blanked and line continuations joined, literals kept."""

    def blank(match: re.Match) -> str:
        if match.group("comment") is not None:
            return " "
        return 'R""' if match.group("raw") is not None else match.group(0)

    return _COMMENT_OR_LITERAL.sub(blank, text.replace("\\\n", "").replace("\\\r\n", ""))


def _untracked_reads(path: Path, text: str) -> None:
    """Refuse every directive of `text` that reads a file, but for SYSTEM_HEADERS."""
    code = _without_comments(text)
    for match in _FILE_DIRECTIVE.finditer(code):
        directive, operand = match.group(1), match.group(2).strip()
        line = f"#{directive} {operand}"[:120]
        angle = _ANGLE.match(operand)
        if directive == "include" and angle and angle.group(1).strip() in SYSTEM_HEADERS:
            continue
        if directive != "include":
            why = "reads a file kbfuse cannot track"
        elif angle:
            why = f"only these toolchain headers may be included with <...>: {SYSTEM_HEADERS}"
        elif operand.startswith('"'):
            why = (
                "a quoted include must stand on its own line (a comment after it may not span "
                "lines) so that kbfuse can inline and hash it"
            )
        else:
            why = "an include through a macro cannot be tracked; name a header in quotes"
        raise KbfuseError(f"kernel source {path}: {line!r} is refused: {why}")
    if _HAS_INCLUDE.search(code):
        raise KbfuseError(
            f"kernel source {path}: __has_include is refused: it probes files kbfuse cannot track"
        )


def _check_inside(path: Path, root: Path | None) -> None:
    if root is not None and path.resolve().parent != root:
        raise KbfuseError(
            f"kernel source {path} resolves to {path.resolve()}, outside {root}: a header must "
            "be a file in the kernel sources' directory, not a link out of it"
        )


def _inline(
    path: Path, files: dict[str, str], chain: tuple[str, ...], root: Path | None = None
) -> str:
    if not path.is_file():
        via = f" (included from {chain[-1]})" if chain else ""
        raise KbfuseError(f"kernel source {path} does not exist{via}")
    _check_inside(path, root)
    root = path.resolve().parent if root is None else root
    data = path.read_bytes()
    try:
        text = data.decode()
    except UnicodeDecodeError as exc:
        raise KbfuseError(f"kernel source {path} is not UTF-8 text: {exc}") from None
    if "\0" in text:
        raise KbfuseError(f"kernel source {path} contains a NUL character")
    _untracked_reads(path, _INCLUDE.sub("", text))  # each file's own, for a precise message
    files[path.name] = _sha256(data)
    chain = (*chain, path.name)

    def replace(match: re.Match) -> str:
        name = match.group(1)
        if "/" in name or "\\" in name or not name.endswith(HEADER_SUFFIXES):
            raise KbfuseError(
                f'kernel source {path}: #include "{name}": only headers next to the kernel '
                f"sources, named *{' or *'.join(HEADER_SUFFIXES)}, can be included"
            )
        if name in chain:
            raise KbfuseError(
                f'kernel source {path}: #include "{name}" is circular '
                f"({' -> '.join((*chain, name))})"
            )
        if name in files:
            return f'// (#include "{name}": inlined above)'
        body = _PRAGMA_ONCE.sub("", _inline(path.parent / name, files, chain, root))
        # #line keeps compiler messages pointing at the file and line they are about
        resume = text.count("\n", 0, match.start()) + 2
        return f'#line 1 "{name}"\n{body.rstrip()}\n#line {resume} "{path.name}"'

    return _INCLUDE.sub(replace, text)


def parse_launch(text: str, where: str) -> LaunchPlan:
    """The kbfuse-launch lines of a source text; KbfuseError naming the problem."""
    default, per_kernel = [], {}
    for kernel, spec in _LAUNCH_LINE.findall(text):
        if not kernel:
            default.append(_parse_launch_spec(spec, where))
        elif kernel in per_kernel:
            raise KbfuseError(f"kernel source {where}: two kbfuse-launch lines for {kernel!r}")
        else:
            per_kernel[kernel] = _parse_launch_spec(spec, f"{where} ({kernel})")
    if len(default) != 1:
        raise KbfuseError(
            f"kernel source {where}: needs exactly one '// kbfuse-launch: <mode> threads=N ...' "
            f"line (modes: {', '.join(LAUNCH_MODES)}), found {len(default) or 'none'}"
        )
    return LaunchPlan(default=default[0], per_kernel=per_kernel)


def _parse_launch_spec(spec: str, where: str) -> Launch:
    words = spec.split()
    if not words or words[0] not in LAUNCH_MODES:
        raise KbfuseError(
            f"kernel source {where}: kbfuse-launch mode {words[0] if words else ''!r} is not "
            f"one of {', '.join(LAUNCH_MODES)}"
        )
    mode = words[0]
    fields = {}
    for word in words[1:]:
        key, _, value = word.partition("=")
        if not _FIELD_VALUE.fullmatch(value) or int(value) <= 0:
            raise KbfuseError(
                f"kernel source {where}: kbfuse-launch field {word!r} is not "
                "name=positive-integer (ASCII digits, at most 9)"
            )
        if key in fields:
            raise KbfuseError(f"kernel source {where}: kbfuse-launch field {key!r} is given twice")
        fields[key] = int(value)
    needed = {"threads"}
    if mode == "grid-stride":
        needed |= {"blocks-per-sm", "items-per-thread"}
    missing = sorted(needed - set(fields))
    unknown = sorted(set(fields) - needed)
    if missing or unknown:
        raise KbfuseError(
            f"kernel source {where}: kbfuse-launch {mode} needs fields {sorted(needed)}"
            + (f"; missing {missing}" if missing else "")
            + (f"; unknown {unknown}" if unknown else "")
        )
    if fields["threads"] > MAX_THREADS_PER_BLOCK:
        raise KbfuseError(
            f"kernel source {where}: kbfuse-launch threads={fields['threads']} is over "
            f"{MAX_THREADS_PER_BLOCK} threads per block"
        )
    return Launch(
        mode=mode,
        threads=fields["threads"],
        blocks_per_sm=fields.get("blocks-per-sm"),
        items_per_thread=fields.get("items-per-thread"),
    )


def load(path: str | Path) -> KernelSource:
    """The translation unit of kernel source `path` and its launch contract."""
    path = Path(path)
    text, files = _expand(path)
    _untracked_reads(path, text)  # what the compiler gets, whatever the inlining did
    return KernelSource(path=path, text=text, files=files, launch=parse_launch(text, str(path)))


def grid_blocks(launch: Launch, n: int, sm_count: int) -> int:
    """Blocks to launch for n elements under `launch` on a device with sm_count SMs."""
    if n <= 0:
        raise KbfuseError(f"element count {n} must be positive")
    if launch.mode == "per-element":
        return -(-n // launch.threads)
    if launch.mode == "per-block":
        return n
    if sm_count <= 0:
        raise KbfuseError(f"SM count {sm_count} must be positive")
    per_block = launch.threads * launch.items_per_thread
    return max(1, min(sm_count * launch.blocks_per_sm, -(-n // per_block)))
