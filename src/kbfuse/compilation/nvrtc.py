"""ctypes binding to libnvrtc: compile CUDA C++ to PTX and, for sm_XY targets, a cubin.

No CUDA driver, GPU or CuPy is needed: the pip wheel `nvidia-cuda-nvrtc` is enough. The library is
searched in this order:

1. the file named by the environment variable KBFUSE_NVRTC_LIBRARY;
2. the pip wheels, found through the `nvidia` namespace package: `nvidia/cu13/lib/libnvrtc.so.13`
   (nvidia-cuda-nvrtc 13.x) and `nvidia/cuda_nvrtc/lib/libnvrtc.so.12` (nvidia-cuda-nvrtc-cu12);
3. `$CUDA_HOME/lib64` and `$CUDA_PATH/lib64`;
4. `/usr/local/cuda/lib64`;
5. the directories listed in KBFUSE_NVRTC_PATH (os.pathsep-separated): further versions carried
   outside any installation (e.g. to an offline machine), after every installed one, so that
   they never replace the default;
6. `ctypes.util.find_library("nvrtc")`.

`load_library()` takes the first hit. `load_library("12.9")` takes the first hit whose
`nvrtcVersion()` is 12.9 (a version is a prefix: "12" takes any 12.x), so a study can compile one
variant with NVRTC 13 and its twin with NVRTC 12 in the same process. That is why this binding is
written by hand: a CUDA Python binding is built against one CUDA major, while libnvrtc.so.12 and
libnvrtc.so.13 (and their builtins libraries) have distinct sonames and load side by side.

Why a hand-written binding rather than NVIDIA's `cuda-bindings` (`cuda.bindings.nvrtc`) and
`cuda.pathfinder`, which produce the same cubin from the same options: both are tied to one CUDA
major per process. `cuda.bindings.nvrtc` 13.x binds NVRTC 13 only, and
`cuda.pathfinder.load_nvidia_dynamic_lib("nvrtc")` takes a name, not a major, and caches the one
library it loads for the whole process. The toolchain comparison needs NVRTC 12 and 13 loaded
side by side in one process, each named by its file: that is what this binding buys, and the only
reason it stays.

Where a CUDA driver is installed, the first compile initialises it (cuInit runs inside NVRTC, even
for a PTX-only compile; seen with NVRTC 13.0.88 and driver 580), and NVRTC's cubins then pass
through the CUDA compute cache: call kbfuse.compilation.cudacache.isolate before the first compile.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import importlib.metadata
import importlib.util
import os
import re
from dataclasses import dataclass
from pathlib import Path

from kbfuse.errors import KbfuseError

LIBRARY_ENV = "KBFUSE_NVRTC_LIBRARY"
PATH_ENV = "KBFUSE_NVRTC_PATH"
# The pip package that brings NVRTC of a CUDA major, for the message when a version is missing.
PACKAGE_FOR_MAJOR = {"12": "nvidia-cuda-nvrtc-cu12", "13": "nvidia-cuda-nvrtc"}
EXTRA_FOR_MAJOR = {"12": "kbfuse[nvrtc12]", "13": "kbfuse[cuda13]"}

# (path inside the `nvidia` namespace package, pip distribution that ships it)
WHEEL_LIBRARIES = (
    ("cu13/lib/libnvrtc.so.13", "nvidia-cuda-nvrtc"),
    ("cuda_nvrtc/lib/libnvrtc.so.12", "nvidia-cuda-nvrtc-cu12"),
)
SYSTEM_LIBRARY_NAMES = ("libnvrtc.so", "libnvrtc.so.13", "libnvrtc.so.12")

NVRTC_SUCCESS = 0


@dataclass(frozen=True)
class NvrtcLibrary:
    """A loaded libnvrtc and where its identity came from."""

    path: str  # resolved file that was loaded
    version: str  # "major.minor" from nvrtcVersion()
    full_version: str | None  # e.g. "13.0.88", from pip metadata or the file name
    source: str  # which search step found it
    handle: ctypes.CDLL


@dataclass(frozen=True)
class NvrtcResult:
    """Output of one NVRTC compile. `cubin` is None for compute_XY (PTX-only) targets."""

    ptx: str | None
    cubin: bytes | None
    log: str
    version: str
    library: str
    full_version: str | None
    options: tuple[str, ...]


def _wheel_candidates() -> list[tuple[Path, str]]:
    spec = importlib.util.find_spec("nvidia")
    if spec is None or not spec.submodule_search_locations:
        return []
    found = []
    for root in spec.submodule_search_locations:
        for relative, dist in WHEEL_LIBRARIES:
            path = Path(root) / relative
            if path.is_file():
                found.append((path, dist))
    return found


def _toolkit_candidates() -> list[tuple[Path, str]]:
    found = []
    for var in ("CUDA_HOME", "CUDA_PATH"):
        home = os.environ.get(var)
        if home:
            for name in SYSTEM_LIBRARY_NAMES:
                path = Path(home) / "lib64" / name
                if path.is_file():
                    found.append((path, f"${var}"))
    for name in SYSTEM_LIBRARY_NAMES:
        path = Path("/usr/local/cuda/lib64") / name
        if path.is_file():
            found.append((path, "/usr/local/cuda"))
    return found


def _dist_version_owning(path: Path, dist: str) -> str | None:
    """Version of pip distribution `dist` if it really installed `path`."""
    try:
        distribution = importlib.metadata.distribution(dist)
    except importlib.metadata.PackageNotFoundError:
        return None
    target = path.resolve()
    for file in distribution.files or ():
        if Path(distribution.locate_file(file)).resolve() == target:
            return distribution.version
    return None


def full_version_of(path: Path) -> str | None:
    """Full version (e.g. "13.0.88") of a libnvrtc file: from the pip wheel that installed it, or
    from a versioned file name (libnvrtc.so.13.0.88); None when neither tells."""
    for _, dist in WHEEL_LIBRARIES:
        version = _dist_version_owning(path, dist)
        if version:
            return version
    return _version_from_file_name(path)


def _version_from_file_name(path: Path) -> str | None:
    match = re.search(r"\.so\.(\d+\.\d+(?:\.\d+)*)$", path.resolve().name)
    return match.group(1) if match else None


def _bind(lib: ctypes.CDLL) -> None:
    p = ctypes.c_void_p
    size_p = ctypes.POINTER(ctypes.c_size_t)
    signatures = {
        "nvrtcVersion": [ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_int)],
        "nvrtcCreateProgram": [
            ctypes.POINTER(p),
            ctypes.c_char_p,
            ctypes.c_char_p,
            ctypes.c_int,
            ctypes.POINTER(ctypes.c_char_p),
            ctypes.POINTER(ctypes.c_char_p),
        ],
        "nvrtcCompileProgram": [p, ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)],
        "nvrtcGetProgramLogSize": [p, size_p],
        "nvrtcGetProgramLog": [p, ctypes.c_char_p],
        "nvrtcGetPTXSize": [p, size_p],
        "nvrtcGetPTX": [p, ctypes.c_char_p],
        "nvrtcGetCUBINSize": [p, size_p],
        "nvrtcGetCUBIN": [p, ctypes.c_char_p],
        "nvrtcDestroyProgram": [ctypes.POINTER(p)],
    }
    for name, argtypes in signatures.items():
        fn = getattr(lib, name)
        fn.argtypes = argtypes
        fn.restype = ctypes.c_int
    lib.nvrtcGetErrorString.argtypes = [ctypes.c_int]
    lib.nvrtcGetErrorString.restype = ctypes.c_char_p


def _preload_builtins(path: Path) -> None:
    """Load libnvrtc-builtins from the directory of `path` first.

    libnvrtc dlopen()s its builtins library by bare name at compile time; the pip wheel's directory
    is not on the loader's search path, so without this the compile fails with "failed to open
    libnvrtc-builtins.so.13.0". A library already loaded under that soname satisfies the dlopen.
    """
    if not path.is_absolute():
        return
    for builtins in sorted(path.resolve().parent.glob("libnvrtc-builtins.so.*")):
        ctypes.CDLL(str(builtins), mode=ctypes.RTLD_GLOBAL)
        return


def _load(path: Path, source: str) -> NvrtcLibrary:
    try:
        _preload_builtins(path)
        handle = ctypes.CDLL(str(path))
        _bind(handle)
    except (OSError, AttributeError) as exc:
        raise KbfuseError(f"cannot load NVRTC library {path} (found via {source}): {exc}") from exc
    major, minor = ctypes.c_int(), ctypes.c_int()
    rc = handle.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor))
    if rc != NVRTC_SUCCESS:
        raise KbfuseError(f"nvrtcVersion failed with code {rc} in {path}")
    full = full_version_of(path) if path.is_absolute() else None
    return NvrtcLibrary(
        path=str(path.resolve())
        if path.is_absolute()
        else str(path),  # bare soname: loader found it
        version=f"{major.value}.{minor.value}",
        full_version=full,
        source=source,
        handle=handle,
    )


def _path_candidates() -> list[tuple[Path, str]]:
    found = []
    for directory in filter(None, os.environ.get(PATH_ENV, "").split(os.pathsep)):
        for name in SYSTEM_LIBRARY_NAMES:
            path = Path(directory) / name
            if path.is_file():
                found.append((path.absolute(), f"{PATH_ENV} {directory}"))
    return found


def candidates() -> list[tuple[Path, str]]:
    """Every libnvrtc file the search finds, in search order, with where it was found."""
    found: list[tuple[Path, str]] = []
    override = os.environ.get(LIBRARY_ENV)
    if override:
        path = Path(override)
        if not path.is_file():
            raise KbfuseError(f"{LIBRARY_ENV}={override} does not name a file")
        found.append((path.absolute(), LIBRARY_ENV))
    found += [(path, f"pip wheel {dist}") for path, dist in _wheel_candidates()]
    found += _toolkit_candidates()
    found += _path_candidates()
    name = ctypes.util.find_library("nvrtc")
    if name:
        found.append((Path(name), "ctypes.util.find_library"))
    seen, unique = set(), []
    for path, source in found:
        key = path.resolve() if path.is_absolute() else path
        if key not in seen:
            seen.add(key)
            unique.append((path, source))
    return unique


@functools.cache
def _load_cached(path: Path, source: str) -> NvrtcLibrary:
    return _load(path, source)


def matches(version: str, wanted: str) -> bool:
    """Does NVRTC "major.minor" `version` satisfy `wanted` ("12" or "12.9")?"""
    return version == wanted or version.startswith(wanted + ".")


def missing_message(wanted: str, tried: list[str]) -> str:
    major = wanted.split(".")[0]
    package = PACKAGE_FOR_MAJOR.get(major, f"an NVRTC {major}.x library")
    extra = EXTRA_FOR_MAJOR.get(major)
    how = f"pip install '{extra}' ({package} {wanted})" if extra else f"install {package}"
    found = f"; found only {', '.join(tried)}" if tried else ""
    return (
        f"NVRTC {wanted} is not installed{found}: {how}, or set {PATH_ENV} to a directory "
        f"holding its libnvrtc, or leave the variants that name it out of the study"
    )


@functools.cache
def load_library(version: str | None = None) -> NvrtcLibrary:
    """The first libnvrtc of the search (module docstring), or with `version` the first whose
    nvrtcVersion() matches it; KbfuseError naming what to install when there is none."""
    found = candidates()
    if version is None:
        if found:
            return _load_cached(*found[0])
        raise KbfuseError(
            "NVRTC library not found: set KBFUSE_NVRTC_LIBRARY, `pip install nvidia-cuda-nvrtc`, "
            "or set CUDA_HOME to a CUDA toolkit"
        )
    tried = []
    for path, source in found:
        try:
            lib = _load_cached(path, source)
        except KbfuseError:
            continue
        if matches(lib.version, version):
            return lib
        tried.append(f"{lib.version} ({lib.path})")
    raise KbfuseError(missing_message(version, tried))


def _error_string(lib: NvrtcLibrary, code: int) -> str:
    text = lib.handle.nvrtcGetErrorString(code)
    return text.decode() if text else f"NVRTC error {code}"


def _check(lib: NvrtcLibrary, code: int, call: str) -> None:
    if code != NVRTC_SUCCESS:
        raise KbfuseError(f"{call} failed: {_error_string(lib, code)}")


def _read_blob(lib: NvrtcLibrary, prog, size_fn: str, get_fn: str) -> bytes:
    size = ctypes.c_size_t()
    _check(lib, getattr(lib.handle, size_fn)(prog, ctypes.byref(size)), size_fn)
    buf = ctypes.create_string_buffer(size.value)
    _check(lib, getattr(lib.handle, get_fn)(prog, buf), get_fn)
    return buf.raw[: size.value]


def _program_log(lib: NvrtcLibrary, prog) -> str:
    return (
        _read_blob(lib, prog, "nvrtcGetProgramLogSize", "nvrtcGetProgramLog")
        .rstrip(b"\0")
        .decode(errors="replace")
    )


def cubin_of_program(library: str, program: int) -> bytes:
    """The complete cubin of an NVRTC program created by another binding (CuPy) in this process.

    `library` must be the libnvrtc file that binding loaded: dlopen() of a loaded file returns the
    same library instance, so `program` (an nvrtcProgram handle) is valid in it.
    """
    handle = ctypes.CDLL(library)
    _bind(handle)
    lib = NvrtcLibrary(library, "", None, "program owner", handle)
    return _read_blob(lib, ctypes.c_void_p(program), "nvrtcGetCUBINSize", "nvrtcGetCUBIN")


def targets_real_arch(options) -> bool:
    """True when the options name an sm_XY target (NVRTC then also produces a cubin)."""
    for opt in options:
        for prefix in ("-arch=", "--gpu-architecture="):
            if opt.startswith(prefix) and opt[len(prefix) :].startswith("sm_"):
                return True
    return False


def compile_program(
    source: str, options, name: str = "kernel.cu", version: str | None = None
) -> NvrtcResult:
    """Compile `source` with exactly `options`; PTX always, cubin when the target is sm_XY;
    with the NVRTC of `version` when given (`load_library`).

    A compile failure raises KbfuseError carrying the full NVRTC log.
    """
    lib = load_library(version)
    options = tuple(str(o) for o in options)
    prog = ctypes.c_void_p()
    _check(
        lib,
        lib.handle.nvrtcCreateProgram(
            ctypes.byref(prog), source.encode(), name.encode(), 0, None, None
        ),
        "nvrtcCreateProgram",
    )
    try:
        encoded = [o.encode() for o in options]
        argv = (ctypes.c_char_p * max(len(encoded), 1))(*encoded)
        rc = lib.handle.nvrtcCompileProgram(prog, len(encoded), argv)
        log = _program_log(lib, prog)
        if rc != NVRTC_SUCCESS:
            raise KbfuseError(
                f"NVRTC {lib.version} ({lib.path}) failed to compile {name} with options "
                f"{list(options)}: {_error_string(lib, rc)}\n--- NVRTC log ---\n{log}"
            )
        cubin = None
        if targets_real_arch(options):
            cubin = _read_blob(lib, prog, "nvrtcGetCUBINSize", "nvrtcGetCUBIN")
        try:
            ptx = _read_blob(lib, prog, "nvrtcGetPTXSize", "nvrtcGetPTX").rstrip(b"\0").decode()
        except KbfuseError:
            if cubin is None:
                raise
            ptx = None  # some NVRTC versions keep no PTX for an sm_ target
        return NvrtcResult(
            ptx=ptx or None,
            cubin=cubin,
            log=log,
            version=lib.version,
            library=lib.path,
            full_version=lib.full_version,
            options=options,
        )
    finally:
        lib.handle.nvrtcDestroyProgram(ctypes.byref(prog))
