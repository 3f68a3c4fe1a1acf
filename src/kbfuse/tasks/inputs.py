"""Input distributions by name, reproducible from a seed alone.

`uniform` is KernelBench's own `get_inputs()` distribution (torch.rand). Values are drawn
on the CPU with a dedicated generator and then moved to the device, as KernelBench does
(`get_inputs()` on the CPU, then `.cuda()`): the same (distribution, shape, seed) gives
the same bits on every machine and device, and never depends on or disturbs the global
RNG state.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from kbfuse.errors import KbfuseError

DISTRIBUTIONS = ("uniform", "normal", "uniform_x100", "uniform_xneg100")

_DRAW = {
    "uniform": lambda shape, gen: torch.rand(shape, generator=gen, device="cpu"),
    "normal": lambda shape, gen: torch.randn(shape, generator=gen, device="cpu"),
    "uniform_x100": lambda shape, gen: torch.rand(shape, generator=gen, device="cpu") * 100,
    "uniform_xneg100": lambda shape, gen: torch.rand(shape, generator=gen, device="cpu") * -100,
}


def check_distributions(names: Sequence[str]) -> list[str]:
    """Return the names as a list; KbfuseError naming the first unknown one."""
    for name in names:
        if name not in _DRAW:
            raise KbfuseError(
                f"unknown input distribution {name!r}; known: {', '.join(DISTRIBUTIONS)}"
            )
    return list(names)


def _check_shape(shape: Sequence[int]) -> tuple[int, ...]:
    dims = tuple(shape)
    if not dims or any(isinstance(d, bool) or not isinstance(d, int) or d <= 0 for d in dims):
        raise KbfuseError(f"input shape must be positive integers, got {shape!r}")
    return dims


def _check_seed(seed: int) -> int:
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise KbfuseError(f"input seed must be a non-negative integer, got {seed!r}")
    return seed


def make_input(
    distribution: str,
    shape: Sequence[int],
    seed: int,
    device: str | torch.device = "cpu",
) -> torch.Tensor:
    """A float32 tensor of `shape` drawn from `distribution` with its own seeded generator."""
    check_distributions([distribution])
    dims = _check_shape(shape)
    gen = torch.Generator(device="cpu")
    gen.manual_seed(_check_seed(seed))
    values = _DRAW[distribution](dims, gen)
    return values.to(device=device, dtype=torch.float32).contiguous()
