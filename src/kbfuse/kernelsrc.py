"""Kernel sources: one translation unit per kernels/<name>.cu, and its launch contract.

`#include "file.cuh"` lines (quoted, next to the .cu) are inlined here before compiling, so
every compile route (NVRTC, CuPy, nvcc) sees the same single text and the compile record can
hash exactly what was compiled. Headers are inlined once each (a second include of the same
file is dropped, as `#pragma once` would); angle-bracket includes are left to the compiler.
`#line` directives around each inlined header keep compiler messages naming the right file
and line.

Each .cu declares how its kernels must be launched, in one comment line for all its kernels,
and optionally one line per kernel that launches differently:

    // kbfuse-launch: per-element threads=256
    // kbfuse-launch: grid-stride threads=256 blocks-per-sm=16 items-per-thread=8
    // kbfuse-launch tail53: grid-stride threads=256 blocks-per-sm=64 items-per-thread=8

`per-element`: one thread per element, grid = ceil(n / threads). `grid-stride`: every thread
loops over the tensor, so any grid is correct; the grid is `blocks-per-sm` blocks per SM,
capped at ceil(n / (threads * items-per-thread)) so small tensors get no idle blocks.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import asdict, dataclass
from pathlib import Path

from kbfuse.errors import KbfuseError

HEADER_SUFFIXES = (".cuh", ".h")
_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*"([^"]+)"[ \t]*(?://.*)?$', re.M)
_PRAGMA_ONCE = re.compile(r"^[ \t]*#[ \t]*pragma[ \t]+once[ \t]*$", re.M)
_LAUNCH_LINE = re.compile(r"^[ \t]*//[ \t]*kbfuse-launch(?:[ \t]+(\w+))?[ \t]*:(.*)$", re.M)

LAUNCH_MODES = ("per-element", "grid-stride")
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


def _inline(path: Path, files: dict[str, str], chain: tuple[str, ...]) -> str:
    if not path.is_file():
        via = f" (included from {chain[-1]})" if chain else ""
        raise KbfuseError(f"kernel source {path} does not exist{via}")
    data = path.read_bytes()
    try:
        text = data.decode()
    except UnicodeDecodeError as exc:
        raise KbfuseError(f"kernel source {path} is not UTF-8 text: {exc}") from None
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
        body = _PRAGMA_ONCE.sub("", _inline(path.parent / name, files, chain))
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
        if not value.isdigit() or int(value) <= 0:
            raise KbfuseError(
                f"kernel source {where}: kbfuse-launch field {word!r} is not name=positive-integer"
            )
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
    return KernelSource(path=path, text=text, files=files, launch=parse_launch(text, str(path)))


def grid_blocks(launch: Launch, n: int, sm_count: int) -> int:
    """Blocks to launch for n elements under `launch` on a device with sm_count SMs."""
    if n <= 0:
        raise KbfuseError(f"element count {n} must be positive")
    if launch.mode == "per-element":
        return -(-n // launch.threads)
    if sm_count <= 0:
        raise KbfuseError(f"SM count {sm_count} must be positive")
    per_block = launch.threads * launch.items_per_thread
    return max(1, min(sm_count * launch.blocks_per_sm, -(-n // per_block)))
