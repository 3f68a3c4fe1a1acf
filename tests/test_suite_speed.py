"""What keeps the CPU suite within its time (docs/newcomer.md, "CPU test suite"): every
Snakemake start computes the rules' module closures (kbfuse.workflow.deps), and each source
file is parsed once per version, however many closures share it."""

from __future__ import annotations

import os

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
