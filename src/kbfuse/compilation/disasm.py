"""Counting flush-to-zero instructions in PTX text and in a cubin's SASS.

The PTX count shows what the front end emitted (see `ptx_ftz_opcodes` for the math library's
`.approx.ftz` instructions, present whatever --ftz says). The SASS count needs a disassembler
(nvdisasm or cuobjdump: on PATH, in $CUDA_HOME/bin or $CUDA_PATH/bin, or from the pip wheels
nvidia-cuda-nvdisasm / nvidia-cuda-cuobjdump in nvidia/cu13/bin). Note that SASS of code built with
--ftz=false still carries some .FTZ instructions inside NVIDIA's internal helper routines (e.g.
`$__internal_0_$__cuda_sm3x_div_rn_noftz_f32_slowpath`, the IEEE division slow path, which works on
operands it has already scaled into the normal range), so the SASS count is reported together with
how many of those sit in `$__internal_*` helpers (nvdisasm shows their labels; cuobjdump does not).
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

DISASSEMBLERS = ("nvdisasm", "cuobjdump")  # nvdisasm first: it labels internal helper routines
WHEEL_BIN_DIRS = ("cu13/bin", "cuda_nvdisasm/bin", "cuda_cuobjdump/bin")


@dataclass(frozen=True)
class Disassembler:
    name: str  # "nvdisasm" | "cuobjdump"
    path: str
    version: str | None  # e.g. "13.5.37"

    def command(self, cubin_path: str) -> list[str]:
        if self.name == "nvdisasm":
            return [self.path, cubin_path]
        return [self.path, "-sass", cubin_path]

    def record(self) -> dict:
        return {"name": self.name, "path": self.path, "version": self.version}


@dataclass(frozen=True)
class SassFtzCount:
    total: int
    in_internal_helpers: int | None  # None when the listing has no routine labels (cuobjdump)
    tool: Disassembler


# --- PTX ------------------------------------------------------------------------------------

_PTX_BLOCK_COMMENT = re.compile(r"/\*.*?\*/", re.S)
_PTX_LINE_COMMENT = re.compile(r"//[^\n]*")
_PTX_PREDICATE = re.compile(r"^@!?%?\w+\s+")


def ptx_instructions(ptx: str) -> list[str]:
    """Instruction statements of a PTX text, without comments, directives, labels or braces."""
    text = _PTX_LINE_COMMENT.sub("", _PTX_BLOCK_COMMENT.sub("", ptx))
    statements = []
    for raw in text.replace("{", ";").replace("}", ";").split(";"):
        stmt = raw.strip()
        while True:  # drop leading labels such as "$L__BB0_2:"
            match = re.match(r"^[$%\w.]+:\s*", stmt)
            if not match:
                break
            stmt = stmt[match.end() :]
        if not stmt or stmt.startswith("."):
            continue
        statements.append(_PTX_PREDICATE.sub("", stmt))
    return statements


def ptx_ftz_opcodes(ptx: str) -> dict[str, int]:
    """How many PTX instructions carry .ftz, by full opcode (e.g. {"mul.ftz.f32": 3}).

    The breakdown matters: CUDA's math library emits `ex2.approx.ftz.f32` and `rcp.approx.ftz.f32`
    inside expf/tanhf/erff whatever --ftz says (on operands it has range-reduced), so code built
    with --ftz=false can still count a few .ftz instructions, all of them `.approx`.
    """
    counts: dict[str, int] = {}
    for stmt in ptx_instructions(ptx):
        opcode = stmt.split(None, 1)[0]
        if "ftz" in opcode.split(".")[1:]:
            counts[opcode] = counts.get(opcode, 0) + 1
    return dict(sorted(counts.items()))


def count_ptx_ftz(ptx: str) -> int:
    """Number of PTX instructions whose opcode carries the .ftz modifier (e.g. mul.ftz.f32)."""
    return sum(ptx_ftz_opcodes(ptx).values())


def count_ptx_ftz_non_approx(ptx: str) -> int:
    """Like count_ptx_ftz, leaving out `.approx` instructions (the math library's own)."""
    return sum(n for op, n in ptx_ftz_opcodes(ptx).items() if "approx" not in op.split("."))


# --- finding a disassembler -----------------------------------------------------------------


def _candidate_dirs() -> list[Path]:
    dirs = [Path(p) for p in os.environ.get("PATH", "").split(os.pathsep) if p]
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            dirs.append(Path(os.environ[var]) / "bin")
    spec = importlib.util.find_spec("nvidia")
    if spec is not None and spec.submodule_search_locations:
        for root in spec.submodule_search_locations:
            dirs.extend(Path(root) / sub for sub in WHEEL_BIN_DIRS)
    return dirs


def _tool_version(path: str) -> str | None:
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    match = re.search(r"\bV(\d+\.\d+\.\d+)", out.stdout)
    return match.group(1) if match else None


def find_disassembler() -> Disassembler | None:
    """First nvdisasm/cuobjdump found on PATH, in $CUDA_HOME/bin, $CUDA_PATH/bin, or pip wheels."""
    for directory in _candidate_dirs():
        for name in DISASSEMBLERS:
            path = directory / name
            if path.is_file() and os.access(path, os.X_OK):
                return Disassembler(name, str(path), _tool_version(str(path)))
    return None


# --- SASS -----------------------------------------------------------------------------------

_SASS_INSTRUCTION = re.compile(r"^\s*/\*[0-9a-fA-F]+\*/\s+([^;]*);")
_SASS_PREDICATE = re.compile(r"^@!?U?P[T0-9]+\s+")
_LABEL = re.compile(r"^\s*([^\s/]+):\s*$")


def disassemble(cubin: bytes, tool: Disassembler | None = None) -> tuple[str | None, str]:
    """(SASS listing or None, note saying which tool ran or why there is none)."""
    tool = tool or find_disassembler()
    if tool is None:
        return None, "no disassembler (nvdisasm/cuobjdump) found"
    with tempfile.TemporaryDirectory(prefix="kbfuse-sass-") as tmp:
        path = Path(tmp) / "module.cubin"
        path.write_bytes(cubin)
        try:
            out = subprocess.run(
                tool.command(str(path)), capture_output=True, text=True, timeout=300, cwd=tmp
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            return None, f"{tool.name} {tool.version} failed: {exc}"
    if out.returncode != 0:
        return None, f"{tool.name} {tool.version} failed: {out.stderr.strip()[:500]}"
    return out.stdout, f"{tool.name} {tool.version} ({tool.path})"


def sass_text(cubin: bytes) -> str | None:
    """SASS listing of a cubin, or None when no disassembler is available or it fails."""
    return disassemble(cubin)[0]


def sass_ftz_in_listing(listing: str) -> tuple[int, int | None]:
    """(.FTZ instructions, how many of them lie in `$__internal_*` helper routines or None when
    the listing carries no routine labels)."""
    total = internal = 0
    labelled = False
    in_helper = False
    for line in listing.splitlines():
        label = _LABEL.match(line)
        if label:
            name = label.group(1)
            if not name.startswith(".L"):  # .L_x_N are branch targets inside a routine
                labelled = True
                in_helper = "__internal" in name
            continue
        match = _SASS_INSTRUCTION.match(line)
        if not match:
            continue
        instruction = _SASS_PREDICATE.sub("", match.group(1).strip())
        if not instruction or instruction.startswith("."):
            continue
        opcode = instruction.split(None, 1)[0]
        if "FTZ" in opcode.split(".")[1:]:
            total += 1
            internal += in_helper
    return total, (internal if labelled else None)


def sass_ftz(cubin: bytes) -> SassFtzCount | None:
    tool = find_disassembler()
    listing, _ = disassemble(cubin, tool)
    if listing is None:
        return None
    total, internal = sass_ftz_in_listing(listing)
    return SassFtzCount(total, internal, tool)


def count_sass_ftz(cubin: bytes) -> int | None:
    """Number of SASS instructions with the .FTZ modifier; None without a working disassembler."""
    counted = sass_ftz(cubin)
    return None if counted is None else counted.total
