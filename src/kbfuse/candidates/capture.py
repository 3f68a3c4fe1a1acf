"""Record how a candidate builds its kernels, from inside its process, before its import.

`install()` wraps `torch.utils.cpp_extension.load_inline` and `load` (the module attributes, so
`from torch.utils.cpp_extension import load_inline` in the candidate gets the wrapper) and,
when CuPy is installed, `cupy.RawModule` and `cupy.RawKernel`. Each build appends what it was
asked for to `BUILDS`: the route, the extension name, the device and host flags (CuPy: its
`options`, plus the `-ftz=true` CuPy appends on its own, kbfuse.compilation.routes'
cupy-default route).
Triton kernels are listed by the route only: Triton takes no user flags.
A build asked for again with the same arguments (a candidate that calls `load_inline` in its
forward) is listed once, its `calls` counted: the report keeps at most MAX_BUILDS distinct
builds (the schema's limit), and a note says how many more there were. Listing every call made
one of CUDA-L1's kernels, which loads its extension on every forward, fail with a report
over the limit.

The wrappers record and then call the original function unchanged.
"""

from __future__ import annotations

import functools
import time
from typing import Any

BUILDS: list[dict[str, Any]] = []
NOTES: list[str] = []
MAX_BUILDS = 64  # check_candidate.json: runner.builds maxItems
_UNLISTED = {"count": 0}
_PER_CALL = ("seconds", "calls")


def record_build(build: dict[str, Any]) -> dict[str, Any] | None:
    """`build` as listed in BUILDS, or None when it is not listed (asked for before: its
    `calls` counted; or past MAX_BUILDS: counted in a note)."""
    for seen in BUILDS:
        if {k: v for k, v in seen.items() if k not in _PER_CALL} == build:
            seen["calls"] = seen.get("calls", 1) + 1
            return None
    if len(BUILDS) >= MAX_BUILDS:
        _UNLISTED["count"] += 1
        note = f"builds past the first {MAX_BUILDS} distinct ones not listed: "
        NOTES[:] = [n for n in NOTES if not n.startswith(note)]
        NOTES.append(f"{note}{_UNLISTED['count']}")
        return None
    BUILDS.append(build)
    return build


def _as_list(value: Any) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    return [str(v) for v in value]


def _wrap_torch(name: str, original):
    @functools.wraps(original)
    def wrapper(*args, **kwargs):
        build = {
            "route": f"torch.utils.cpp_extension.{name}",
            "extension": str(kwargs.get("name", args[0] if args else "")),
            "extra_cuda_cflags": _as_list(kwargs.get("extra_cuda_cflags")),
            "extra_cflags": _as_list(kwargs.get("extra_cflags")),
            "extra_ldflags": _as_list(kwargs.get("extra_ldflags")),
        }
        listed = record_build(build)
        # how long the call took: tens of seconds when nvcc ran, about one when torch found
        # the extension already built (the first call's, for a build asked for again)
        started = time.monotonic()
        try:
            return original(*args, **kwargs)
        finally:
            if listed is not None:
                listed["seconds"] = round(time.monotonic() - started, 3)

    return wrapper


def _wrap_cupy(name: str, original):
    from kbfuse.compilation.routes import get_route

    implicit = list(get_route("cupy-default").implicit_options)

    class Recorded(original):
        def __init__(self, *args, **kwargs):
            options = _as_list(kwargs.get("options"))
            record_build(
                {
                    "route": f"cupy.{name}",
                    "extension": str(kwargs.get("name", "")),
                    "options": options,
                    "implicit_options": implicit,
                    "backend": str(kwargs.get("backend", "nvrtc")),
                }
            )
            super().__init__(*args, **kwargs)

    Recorded.__name__ = Recorded.__qualname__ = name
    return Recorded


def install() -> None:
    import torch.utils.cpp_extension as ext

    for name in ("load_inline", "load"):
        setattr(ext, name, _wrap_torch(name, getattr(ext, name)))
    try:
        import cupy
    except Exception:  # noqa: BLE001 - CuPy absent or unusable: nothing to wrap
        return
    for name in ("RawModule", "RawKernel"):
        try:
            setattr(cupy, name, _wrap_cupy(name, getattr(cupy, name)))
        except Exception as exc:  # noqa: BLE001 - a CuPy whose classes cannot be wrapped
            NOTES.append(
                f"cupy.{name} not wrapped ({type(exc).__name__}: {exc}): its builds "
                "are not recorded"
            )


def triton_used(module) -> bool:
    """Does the candidate module define or import Triton JIT functions?"""
    try:
        from triton.runtime.jit import JITFunction
    except Exception:  # noqa: BLE001 - Triton absent
        return False
    return any(isinstance(v, JITFunction) for v in vars(module).values())
