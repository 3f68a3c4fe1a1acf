"""What keeps the CPU suite within its time (docs/newcomer.md, "CPU test suite"): every
Snakemake start computes the rules' module closures (kbfuse.workflow.deps), and each source
file's imports are read once per version, however many closures share it; `-n auto` starts half as
many workers again as there are cores (tests/conftest.py), each running whole files, longest
first."""

from __future__ import annotations

import os

import conftest
import pytest

from kbfuse.workflow import deps


def _write_package(src, **modules):
    for name, text in modules.items():
        (src / f"{name}.py").write_text(text)


def test_each_file_is_parsed_once_for_every_closure_that_shares_it(tmp_path):
    _write_package(
        tmp_path,
        top="from kbfuse import shared\n",
        other="import kbfuse.shared\n",
        shared="from kbfuse import leaf\n",
        leaf="x = 1\n",
    )
    deps._imports_of.cache_clear()
    assert deps.module_closure("top", tmp_path) == ("leaf", "shared", "top")
    assert deps.module_closure("other", tmp_path) == ("leaf", "other", "shared")
    info = deps._imports_of.cache_info()
    assert (info.misses, info.hits) == (4, 2)  # top, shared, leaf, other; then shared, leaf


def test_an_edited_file_is_parsed_again(tmp_path):
    _write_package(tmp_path, first="from kbfuse import b\n", b="x = 1\n", c="y = 2\n")
    assert deps.module_closure("first", tmp_path) == ("b", "first")
    path = tmp_path / "b.py"
    stat = path.stat()
    path.write_text("from kbfuse import c\n")
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    # a second closure over the same file (module_closure itself is cached per name)
    _write_package(tmp_path, second="from kbfuse import b\n")
    assert deps.module_closure("second", tmp_path) == ("b", "c", "second")


@pytest.mark.parametrize(("cores", "workers"), [(1, 2), (2, 3), (4, 6), (5, 7), (6, 8), (64, 8)])
def test_auto_starts_half_as_many_workers_again_as_cores_up_to_the_cap(cores, workers):
    assert conftest.auto_workers(cores) == workers


def test_the_environment_variable_decides_the_workers_where_set(monkeypatch):
    monkeypatch.setenv("PYTEST_XDIST_AUTO_NUM_WORKERS", "5")
    assert conftest.pytest_xdist_auto_num_workers(None) is None  # pytest-xdist reads it
    monkeypatch.delenv("PYTEST_XDIST_AUTO_NUM_WORKERS")
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    assert conftest.pytest_xdist_auto_num_workers(None) == 3


def test_the_longest_files_come_first_then_the_slow_ones(request):
    order = [item.module.__name__ for item in request.session.items]
    firsts = list(dict.fromkeys(order))
    collected = [name for name in conftest.LONGEST_FIRST if name in firsts]
    assert firsts[: len(collected)] == collected
    slow = {i.module.__name__ for i in request.session.items if i.get_closest_marker("slow")}
    ranks = [name in slow or name in conftest.LONGEST_FIRST for name in firsts]
    assert ranks == sorted(ranks, reverse=True)  # no slow file after a quick one
