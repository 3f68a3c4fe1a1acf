from pathlib import Path

import pytest
import torch
import yaml

from kbfuse.errors import KbfuseError
from kbfuse.tasks.inputs import DISTRIBUTIONS, check_distributions, make_input

SCHEMA = Path(__file__).resolve().parents[1] / "workflow" / "schemas" / "config.schema.yaml"
SHAPE = (16, 32)


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int32)


def test_names_match_config_schema():
    assert SCHEMA.is_file(), f"{SCHEMA} is missing"
    schema = yaml.safe_load(SCHEMA.read_text())
    assert tuple(schema["properties"]["distributions"]["items"]["enum"]) == DISTRIBUTIONS


@pytest.mark.parametrize("name", DISTRIBUTIONS)
def test_same_seed_same_bits_other_seed_other_values(name):
    a = make_input(name, SHAPE, seed=3)
    b = make_input(name, SHAPE, seed=3)
    c = make_input(name, SHAPE, seed=4)
    assert a.dtype == torch.float32 and a.shape == SHAPE and a.is_contiguous()
    assert torch.equal(bits(a), bits(b))
    assert not torch.equal(a, c)


def test_uniform_is_kernelbench_get_inputs_after_manual_seed():
    # KernelBench seeds the global generator, then calls torch.rand in get_inputs().
    state = torch.get_rng_state()
    try:
        torch.manual_seed(7)
        expected = torch.rand(*SHAPE)
    finally:
        torch.set_rng_state(state)
    assert torch.equal(bits(make_input("uniform", SHAPE, seed=7)), bits(expected))


def test_global_rng_neither_used_nor_advanced():
    torch.manual_seed(123)
    before = torch.get_rng_state()
    first = make_input("normal", SHAPE, seed=0)
    assert torch.equal(torch.get_rng_state(), before)
    torch.manual_seed(999)
    assert torch.equal(bits(make_input("normal", SHAPE, seed=0)), bits(first))


def test_value_ranges_and_scaling():
    u = make_input("uniform", SHAPE, seed=1)
    assert u.min() >= 0 and u.max() < 1
    x100 = make_input("uniform_x100", SHAPE, seed=1)
    neg = make_input("uniform_xneg100", SHAPE, seed=1)
    assert torch.equal(bits(x100), bits(u * 100))
    assert torch.equal(bits(neg), bits(u * -100))
    assert x100.max() > 1 and x100.max() < 100
    assert neg.max() <= 0 and neg.min() > -100
    n = make_input("normal", (256, 256), seed=1)
    assert n.min() < -2 and n.max() > 2
    assert abs(n.mean().item()) < 0.02


def test_device_argument():
    t = make_input("uniform", SHAPE, seed=0, device=torch.device("cpu"))
    assert t.device.type == "cpu"


@pytest.mark.parametrize("bad", ["gaussian", "Uniform", ""])
def test_unknown_distribution_named(bad):
    with pytest.raises(KbfuseError, match=repr(bad)):
        make_input(bad, SHAPE, seed=0)
    with pytest.raises(KbfuseError, match="uniform_xneg100"):
        check_distributions(["uniform", bad])


def test_check_distributions_returns_list():
    assert check_distributions(("normal", "uniform")) == ["normal", "uniform"]


@pytest.mark.parametrize("seed", [-1, 1.5, True, "0"])
def test_bad_seed(seed):
    with pytest.raises(KbfuseError, match="seed"):
        make_input("uniform", SHAPE, seed=seed)


@pytest.mark.parametrize("shape", [(), (0, 4), (4, -1), (2.0, 3)])
def test_bad_shape(shape):
    with pytest.raises(KbfuseError, match="shape"):
        make_input("uniform", shape, seed=0)
