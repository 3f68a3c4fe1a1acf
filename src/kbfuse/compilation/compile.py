"""The compile stage: one variant (route + options) of a kernel source -> artifact + meta.json.

Routes (see kbfuse.compilation.routes): nvrtc-cubin and nvrtc-ptx use NVRTC through
kbfuse.compilation.nvrtc and need no GPU
for an explicit `arch: sm_XY`; nvcc-cubin runs `nvcc -cubin`; cupy-default compiles through
`cupy.RawModule(code=..., options=...)` exactly as a CuPy user would, on a GPU, and records the
options CuPy really passed to NVRTC by wrapping `cupy.cuda.compiler._NVRTCProgram.compile` (CuPy 14:
the last Python frame before `nvrtc.compileProgram`, after CuPy has appended -ftz=true, -arch and
its other options).
"""

from __future__ import annotations

import atexit
import functools
import os
import re
import shlex
import shutil
import subprocess
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from kbfuse.compilation import cudacache, disasm, kernelsrc, nvrtc, routes
from kbfuse.errors import KbfuseError, matching
from kbfuse.faults import checkpoint
from kbfuse.io import sha256_bytes, sha256_file, write_bytes, write_json, write_text

# The real GPU architectures NVRTC 12 and 13 know (NVRTC 13.0.88's nvrtcGetSupportedArchs:
# 75 80 86 87 88 89 90 100 103 110 120 121; NVRTC 12 adds 50-72 and 101), with their
# arch-specific (a) and family (f) variants. workflow/schemas/config.schema.yaml's `arch` pattern
# is "^(auto|" + ARCH_REGEX + ")$", so the config admits exactly what resolve_arch does.
ARCH_REGEX = r"sm_(50|52|53|60|61|62|70|72|75|80|86|87|88|89|90a?|(100|101|103|110|120|121)[af]?)"
ARCH_PATTERN = re.compile(ARCH_REGEX)
NVRTC_VERSION_PATTERN = re.compile(r"^\d+(\.\d+)?$")
NVRTC_ROUTES = (
    "nvrtc-cubin",
    "nvrtc-ptx",
)  # the routes that compile through kbfuse.compilation.nvrtc
PTX_ROUTE_NOTE = "PTX: SASS produced by the driver at load"


@dataclass
class Compiled:
    """What one route produced, before anything is written."""

    artifact: bytes
    artifact_kind: str
    actual_options: list[str]
    compiler: dict
    log: str
    ptx: str | None
    ptx_note: str
    predicted_options: list[str]
    notes: list[str] = field(default_factory=list)
    extra: dict = field(default_factory=dict)  # route-specific meta fields


# --- inputs ---------------------------------------------------------------------------------


def nvrtc_version(variant: str, spec: Mapping) -> str | None:
    """The NVRTC version a variant asks for (`nvrtc: "12.9"`), None for the default one;
    KbfuseError when it is malformed or names NVRTC on a route that does not use ours."""
    wanted = spec.get("nvrtc")
    if wanted is None:
        return None
    if not isinstance(wanted, str) or not NVRTC_VERSION_PATTERN.match(wanted):
        raise KbfuseError(
            f'variant {variant!r}: nvrtc must be a version such as "12.9" or "13", got {wanted!r}'
        )
    if spec.get("route") not in NVRTC_ROUTES:
        raise KbfuseError(
            f"variant {variant!r}: nvrtc {wanted!r} applies only to the routes "
            f"{list(NVRTC_ROUTES)}, not {spec.get('route')!r}"
        )
    return wanted


def check_spec(variant: str, spec) -> tuple[str, str, list[str]]:
    """(route, kernel, options) of a variant spec, or KbfuseError naming the bad key."""
    if not isinstance(spec, Mapping):
        raise KbfuseError(f"variant {variant!r}: spec must be a mapping, got {spec!r}")
    missing = [key for key in ("route", "kernel", "options") if key not in spec]
    if missing:
        raise KbfuseError(f"variant {variant!r}: spec lacks key(s) {missing}")
    route, kernel, options = spec["route"], spec["kernel"], spec["options"]
    if not isinstance(kernel, str) or not kernel:
        raise KbfuseError(f"variant {variant!r}: kernel must be a non-empty string, got {kernel!r}")
    problems = routes.option_problems(route, options)
    if problems:
        raise KbfuseError(f"variant {variant!r}: " + "; ".join(problems))
    nvrtc_version(variant, spec)
    return route, kernel, list(options)


def gpu_arch() -> str:
    """sm_XY of GPU 0, read from the CUDA driver through cuda-bindings
    (kbfuse.compilation.cudadriver: no torch
    import); call only after cudacache.isolate (cuInit initialises the driver)."""
    from kbfuse.compilation import cudadriver

    advice = "set arch: sm_XY in the config (e.g. sm_90 for H100/H200) to compile without one"
    try:
        major, minor = cudadriver.compute_capability(0)
    except cudadriver.NoCudaDriver as exc:
        raise KbfuseError(f"arch: auto needs a GPU and its driver, but {exc}; {advice}") from exc
    except cudadriver.NoCudaDevice as exc:
        raise KbfuseError(f"arch: auto needs a GPU, but {exc}; {advice}") from exc
    except cudadriver.CudaDriverError as exc:
        raise KbfuseError(
            f"arch: auto needs a GPU's compute capability, but {exc}; {advice}"
        ) from exc
    return f"sm_{major}{minor}"


def resolve_arch(arch: str) -> str:
    if arch == "auto":
        return gpu_arch()
    return matching(
        arch,
        ARCH_PATTERN,
        f"arch {arch!r} is neither 'auto' nor of the form sm_XY of a known architecture "
        "(e.g. sm_90)",
    )


def virtual_arch(arch: str) -> str:
    return "compute_" + arch[len("sm_") :]


def _ensure_isolated(scratch_dir) -> None:
    if cudacache.current_setting()["isolated"]:
        return
    if scratch_dir is None:
        scratch_dir = tempfile.mkdtemp(prefix="kbfuse-cudacache-")
        atexit.register(shutil.rmtree, scratch_dir, ignore_errors=True)
    cudacache.isolate(scratch_dir)


# --- NVRTC routes ---------------------------------------------------------------------------


def _nvrtc_compiler(result: nvrtc.NvrtcResult, requested: str | None) -> dict:
    return {
        "name": "nvrtc",
        "requested_version": requested,
        "version": result.version,
        "full_version": result.full_version,
        "library": result.library,
        "library_sha256": sha256_file(result.library) if Path(result.library).is_file() else None,
    }


def compile_nvrtc_cubin(
    source: str, options: list[str], arch: str, name: str, version: str | None = None
) -> Compiled:
    passed = [*routes.effective_options("nvrtc-cubin", options), f"-arch={arch}"]
    result = nvrtc.compile_program(source, passed, name, version)
    ptx, ptx_note = result.ptx, "PTX from the same NVRTC compile (nvrtcGetPTX)"
    if ptx is None:
        ptx_options = [
            *routes.effective_options("nvrtc-cubin", options),
            f"-arch={virtual_arch(arch)}",
        ]
        ptx = nvrtc.compile_program(source, ptx_options, name, version).ptx
        ptx_note = (
            f"PTX from a second NVRTC compile with the same options and -arch={virtual_arch(arch)} "
            "(this NVRTC returns no PTX for sm_ targets)"
        )
    return Compiled(
        artifact=result.cubin,
        artifact_kind="cubin",
        actual_options=list(result.options),
        compiler=_nvrtc_compiler(result, version),
        log=result.log,
        ptx=ptx,
        ptx_note=ptx_note,
        predicted_options=passed,
    )


def compile_nvrtc_ptx(
    source: str, options: list[str], arch: str, name: str, version: str | None = None
) -> Compiled:
    passed = [*routes.effective_options("nvrtc-ptx", options), f"-arch={virtual_arch(arch)}"]
    result = nvrtc.compile_program(source, passed, name, version)
    return Compiled(
        artifact=result.ptx.encode(),
        artifact_kind="ptx",
        actual_options=list(result.options),
        compiler=_nvrtc_compiler(result, version),
        log=result.log,
        ptx=result.ptx,
        ptx_note="the artifact itself",
        predicted_options=passed,
    )


# --- nvcc route -----------------------------------------------------------------------------


def find_nvcc() -> str:
    """Path of a working nvcc: on PATH, else $CUDA_HOME/bin, else $CUDA_PATH/bin."""
    candidates = [shutil.which("nvcc")]
    candidates += [
        str(Path(os.environ[var]) / "bin" / "nvcc")
        for var in ("CUDA_HOME", "CUDA_PATH")
        if os.environ.get(var)
    ]
    tried = []
    for path in candidates:
        if not path or not os.path.isfile(path):
            continue
        try:
            out = subprocess.run(
                [path, "--version"], capture_output=True, text=True, timeout=120, env=_nvcc_env()[0]
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            tried.append(f"{path}: {exc}")
            continue
        if out.returncode == 0:
            return path
        tried.append(f"{path}: exit {out.returncode}: {(out.stderr or out.stdout).strip()[:300]}")
    detail = f" (tried: {'; '.join(tried)})" if tried else ""
    raise KbfuseError(
        "route nvcc-cubin needs nvcc, but no working nvcc was found on PATH, in $CUDA_HOME/bin or "
        f"in $CUDA_PATH/bin{detail}; install the CUDA toolkit or drop the nvcc-cubin variant"
    )


# nvcc adds the options in these variables to every command line: an input the variant does
# not name, so they are kept from the compile (and the meta.json notes that they were set).
NVCC_FLAG_VARIABLES = ("NVCC_PREPEND_FLAGS", "NVCC_APPEND_FLAGS")


def _nvcc_env() -> tuple[dict[str, str], list[str]]:
    """(the environment nvcc runs in, notes on the variables kept from it)."""
    env = {k: v for k, v in os.environ.items() if k not in NVCC_FLAG_VARIABLES}
    notes = [
        f"{name} was set ({os.environ[name]!r}) and was not passed to nvcc"
        for name in NVCC_FLAG_VARIABLES
        if name in os.environ
    ]
    return env, notes


def nvcc_version(path: str) -> str | None:
    out = subprocess.run(
        [path, "--version"], capture_output=True, text=True, timeout=120, env=_nvcc_env()[0]
    )
    match = re.search(r"\bV(\d+\.\d+\.\d+)", out.stdout)
    return match.group(1) if match else None


def compile_nvcc_cubin(source: str, options: list[str], arch: str, name: str) -> Compiled:
    """nvcc -cubin from an argv list (never a shell string), in a scratch directory, without
    the NVCC_*_FLAGS variables: the options nvcc sees are exactly the ones recorded."""
    path = find_nvcc()
    env, env_notes = _nvcc_env()
    with tempfile.TemporaryDirectory(prefix="kbfuse-nvcc-") as tmp:
        src = Path(tmp) / name
        src.write_text(source)
        keep = Path(tmp) / "keep"
        keep.mkdir()
        out = Path(tmp) / "module.cubin"
        # The NVRTC spellings in routes.OPTIONS marked nvcc=True mean the same to nvcc.
        flags = ["-cubin", f"-arch={arch}", *routes.effective_options("nvcc-cubin", options)]
        cmd = [path, *flags, "--keep", f"--keep-dir={keep}", "-o", str(out), str(src)]
        run = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp, timeout=600, env=env)
        log = (run.stdout + run.stderr).replace(tmp, "<tmp>")
        if run.returncode != 0:
            raise KbfuseError(
                f"nvcc ({path}) failed to compile {name} with options {flags} "
                f"(exit {run.returncode})\n--- nvcc log ---\n{log}"
            )
        ptx_files = sorted(keep.glob("*.ptx"))
        ptx = ptx_files[0].read_text() if ptx_files else None
        cubin = out.read_bytes()
    return Compiled(
        artifact=cubin,
        artifact_kind="cubin",
        actual_options=flags,
        compiler={
            "name": "nvcc",
            "version": nvcc_version(path),
            "full_version": None,
            "library": path,
        },
        log=log,
        ptx=ptx,
        ptx_note="PTX kept from the same nvcc compile (--keep)" if ptx else "nvcc kept no PTX",
        predicted_options=flags,
        notes=env_notes,
    )


# --- cupy-default route ---------------------------------------------------------------------


def _cupy_nvrtc_library() -> str | None:
    try:  # CuPy 14 loads NVRTC through cuda.pathfinder, which caches the handle it returns
        from cuda.pathfinder import load_nvidia_dynamic_lib

        path = load_nvidia_dynamic_lib("nvrtc").abs_path
        if path:
            return path
    except Exception:  # any failure: fall back to the process's mappings
        pass
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if "libnvrtc.so" in line}
    except OSError:
        return None
    return sorted(paths)[0] if len(paths) == 1 else None


def _is_elf(blob: bytes) -> bool:
    return blob[:4] == b"\x7fELF"


def compile_cupy_default(source: str, options: list[str], arch: str, name: str) -> Compiled:
    try:
        import cupy
        import cupy.cuda.compiler as cupy_compiler
        from cupy_backends.cuda.libs import nvrtc as cupy_nvrtc
    except ImportError as exc:
        raise KbfuseError(
            "route cupy-default needs CuPy (pip install cupy-cuda13x) and a GPU"
        ) from exc
    try:
        devices = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # CUDARuntimeError without a driver or device
        raise KbfuseError(f"route cupy-default needs a GPU; CuPy sees none: {exc}") from exc
    if devices == 0:
        raise KbfuseError("route cupy-default needs a GPU; CuPy sees none")
    captured = []
    original = cupy_compiler._NVRTCProgram.compile

    def recording_compile(self, options=(), log_stream=None):
        binary, mapping = original(self, options, log_stream)
        if self.src == source:
            captured.append(
                {
                    "options": [str(o) for o in options],
                    "binary": bytes(binary),
                    "complete_cubin": _complete_cubin(self) if self.method == "cubin" else None,
                    "ptx": _optional(lambda: cupy_nvrtc.getPTX(self.ptr)),
                    "log": cupy_nvrtc.getProgramLog(self.ptr),
                }
            )
        return binary, mapping

    cupy_compiler._NVRTCProgram.compile = recording_compile
    try:
        cupy._util.clear_memo()  # RawModule memoises modules per process: force a real compile
        cupy.RawModule(code=source, options=tuple(options)).compile()
    except cupy_compiler.CompileException as exc:
        raise KbfuseError(
            f"CuPy RawModule failed to compile {name} with options {options}\n"
            f"--- NVRTC log ---\n{exc.get_message()}"
        ) from exc
    finally:
        cupy_compiler._NVRTCProgram.compile = original
    if len(captured) != 1:
        raise KbfuseError(
            f"expected CuPy to compile {name} with NVRTC once, saw {len(captured)} compiles "
            f"(CuPy {cupy.__version__}: has its compile path changed?)"
        )
    call = captured[0]
    passed_arch = routes.last_option_value(call["options"], "gpu-architecture")
    if passed_arch not in (arch, virtual_arch(arch)):
        raise KbfuseError(
            f"CuPy compiled for -arch={passed_arch} but arch is {arch}: CuPy takes the "
            "architecture from the current GPU; set arch: auto or the GPU's sm_XY"
        )
    artifact, kind, notes = _cupy_artifact(call["binary"], call["complete_cubin"])
    ptx = call["ptx"]
    if kind == "ptx":
        ptx = artifact.decode()
    elif isinstance(ptx, bytes):
        ptx = ptx.rstrip(b"\0").decode()
    major, minor = cupy_nvrtc.getVersion()
    library = _cupy_nvrtc_library()
    return Compiled(
        artifact=artifact,
        artifact_kind=kind,
        actual_options=call["options"],
        compiler={
            "name": "nvrtc",
            "version": f"{major}.{minor}",
            "full_version": nvrtc.full_version_of(Path(library)) if library else None,
            "library": library,
            "via": f"cupy {cupy.__version__} RawModule",
        },
        log=call["log"] or "",
        ptx=ptx,
        ptx_note="PTX from the same NVRTC program CuPy compiled (nvrtcGetPTX)",
        predicted_options=[*routes.effective_options("cupy-default", options), f"-arch={arch}"],
        notes=notes,
        extra={
            "cupy_binary": {"bytes": len(call["binary"]), "sha256": sha256_bytes(call["binary"])}
        },
    )


def _optional(read):
    try:
        return read()
    except Exception:  # an optional extra (e.g. the PTX of an sm_ target)
        return None


def _complete_cubin(program) -> bytes | None:
    library = _cupy_nvrtc_library()
    if library is None:
        return None
    return _optional(lambda: nvrtc.cubin_of_program(library, program.ptr))


def _cupy_artifact(binary: bytes, complete: bytes | None) -> tuple[bytes, str, list[str]]:
    """(artifact, kind, notes) from what CuPy compiled.

    CuPy 14's getCUBIN returns the cubin without its last byte (cupy_backends/cuda/libs/
    nvrtc.pyx, getCUBIN: `return cubin_ptr[:cubinSizeRet-1]`, "Strip the trailing NULL" as for
    PTX). The driver accepts that in memory, but nvdisasm/cuobjdump reject the ELF; so the artifact
    is NVRTC's complete cubin of the very program CuPy compiled, once CuPy's bytes are checked to
    be its prefix.
    """
    if not _is_elf(binary):
        return binary, "ptx", [f"CuPy produced PTX, not a cubin ({len(binary)} bytes)"]
    if complete is None:
        return binary, "cubin", ["CuPy's cubin kept as CuPy returned it (NVRTC's not readable)"]
    if complete == binary:
        return binary, "cubin", []
    if len(complete) == len(binary) + 1 and complete.startswith(binary):
        return (
            complete,
            "cubin",
            [
                "artifact = NVRTC's complete cubin of the program CuPy compiled; CuPy's own copy "
                "(cupy_binary) lacks its last byte (CuPy's getCUBIN strips a 'trailing NULL')"
            ],
        )
    raise KbfuseError(
        f"CuPy's binary ({len(binary)} bytes) is not NVRTC's cubin of the same program "
        f"({len(complete)} bytes): refusing to guess which one CuPy loads"
    )


COMPILERS = {
    "nvrtc-cubin": compile_nvrtc_cubin,
    "nvrtc-ptx": compile_nvrtc_ptx,
    "nvcc-cubin": compile_nvcc_cubin,
    "cupy-default": compile_cupy_default,
}


# --- comparing, counting, writing -----------------------------------------------------------


def options_mismatch(predicted: list[str], actual: list[str]) -> dict:
    """How the options actually passed differ from those routes.effective_options predicts.

    CuPy's bookkeeping options (include paths, default execution space, ...) are expected extras.
    """
    unexplained = [
        o for o in actual if o not in predicted and not routes.is_cupy_bookkeeping_option(o)
    ]
    missing = [o for o in predicted if o not in actual]
    ftz_differs = routes.ftz_from_options(predicted) != routes.ftz_from_options(actual)
    return {
        "mismatch": bool(unexplained or missing or ftz_differs),
        "unexplained": unexplained,
        "missing": missing,
        "ftz_differs": ftz_differs,
    }


def _sass_counts(compiled: Compiled) -> dict:
    if compiled.artifact_kind != "cubin":
        return {"sass_ftz_count": None, "sass_ftz_note": PTX_ROUTE_NOTE, "disassembler": None}
    tool = disasm.find_disassembler()
    listing, tool_note = disasm.disassemble(compiled.artifact, tool)
    if listing is None:
        return {"sass_ftz_count": None, "sass_ftz_note": tool_note, "disassembler": None}
    total, internal = disasm.sass_ftz_in_listing(listing)
    note = f"SASS .FTZ instructions counted with {tool_note}"
    if internal is not None:
        note += (
            f"; {internal} of them in NVIDIA's internal helper routines ($__internal_*, e.g. the "
            "IEEE division slow path), which use .FTZ on purpose even under --ftz=false"
        )
    return {
        "sass_ftz_count": total,
        "sass_ftz_in_internal_helpers": internal,
        "sass_ftz_note": note,
        "disassembler": tool.record(),
    }


def _log_text(variant, route, compiled: Compiled | None, options, arch, error=None) -> str:
    lines = [f"variant: {variant}", f"route: {route}", f"arch: {arch}"]
    if isinstance(options, list | tuple):
        lines.append(f"requested options: {shlex.join(str(o) for o in options)}")
    if compiled is not None:
        lines.append(f"options passed: {shlex.join(compiled.actual_options)}")
        lines.append(f"compiler: {compiled.compiler}")
        lines.extend(f"note: {n}" for n in compiled.notes)
        lines.append("--- compiler log ---")
        lines.append(compiled.log.rstrip() or "(empty)")
    if error is not None:
        lines.append("--- error ---")
        lines.append(str(error))
    lines.append(f"cuda cache: {cudacache.current_setting()}")
    return "\n".join(lines) + "\n"


def _write_log(log, text: str) -> None:
    """Write the compile log to `log`, or to stdout (a workflow job's log) when `log` is None."""
    if log is None:
        print(text, end="", flush=True)
    else:
        write_text(log, text)


def _remove_outputs(*paths) -> None:
    for path in paths:
        Path(path).unlink(missing_ok=True)


def compile_variant(
    source, variant: str, spec: dict, arch: str, artifact, meta, log, scratch_dir=None
) -> dict:
    """Compile kernel `source` for `variant` ({route, kernel, options}); write artifact, log and,
    last, meta.json (docs/contracts.md "compile meta.json"). Returns the meta record. `log` may be
    None: the log text then goes to stdout (kbfuse.workflow.jobs.job sends that to the job's log).

    The CUDA caches are isolated first (cudacache.isolate under `scratch_dir`, or a temporary
    directory) unless this process already is. Errors raise KbfuseError and leave no artifact/meta.
    """
    _remove_outputs(artifact, meta)
    compiled = None
    route = spec.get("route") if isinstance(spec, Mapping) else None
    options = spec.get("options") if isinstance(spec, Mapping) else None
    try:
        route, kernel, options = check_spec(variant, spec)
        source_path = Path(source)
        if not source_path.is_file():
            raise KbfuseError(f"variant {variant!r}: kernel source {source} does not exist")
        unit = kernelsrc.load(source_path)  # headers inlined; launch line checked
        if routes.ROUTES[route].needs_nvcc:
            find_nvcc()  # fail before any other work
        _ensure_isolated(scratch_dir)
        arch = resolve_arch(arch)
        compile_with = COMPILERS[route]
        version = nvrtc_version(variant, spec)
        if version is not None:
            nvrtc.load_library(version)  # a missing toolchain: one line, before any work
            compile_with = functools.partial(compile_with, version=version)
        compiled = compile_with(unit.text, options, arch, source_path.name)
        if compiled.artifact_kind != routes.ROUTES[route].artifact_kind:
            compiled.notes.append(
                f"route {route} should give a {routes.ROUTES[route].artifact_kind}, "
                f"got a {compiled.artifact_kind}"
            )
        record = {
            "kind": "compile",
            "schema_version": 1,
            "variant": variant,
            "route": route,
            "kernel": kernel,
            "source": str(source),
            "source_sha256": unit.sha256,
            "source_files": unit.files,
            "launch": unit.launch.record(),
            "requested_options": options,
            "implicit_options": list(routes.ROUTES[route].implicit_options),
            "actual_options": compiled.actual_options,
            "predicted_options": compiled.predicted_options,
            "options_check": options_mismatch(compiled.predicted_options, compiled.actual_options),
            "arch": arch,
            "artifact_kind": compiled.artifact_kind,
            "artifact_sha256": sha256_bytes(compiled.artifact),
            "artifact_bytes": len(compiled.artifact),
            "compiler": compiled.compiler,
            "ptx_ftz_count": disasm.count_ptx_ftz(compiled.ptx) if compiled.ptx else None,
            "ptx_ftz_opcodes": disasm.ptx_ftz_opcodes(compiled.ptx) if compiled.ptx else None,
            "ptx_note": compiled.ptx_note,
            **_sass_counts(compiled),
            "requested_ftz": routes.requested_ftz(options),
            "expected_ftz": routes.ftz_from_options(compiled.actual_options),
            "notes": compiled.notes,
            **compiled.extra,
            "cuda_cache": cudacache.current_setting(),
        }
        write_bytes(artifact, compiled.artifact)
        checkpoint("compile", variant)  # artifact written, metadata not yet
        _write_log(log, _log_text(variant, route, compiled, options, arch))
        write_json(meta, record)
        return record
    except BaseException as exc:
        _remove_outputs(artifact, meta)
        _write_log(log, _log_text(variant, route, compiled, options, arch, error=exc))
        raise
