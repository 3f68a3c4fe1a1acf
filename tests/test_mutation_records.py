"""Tests written for mutants of records.py that survived the run of docs/mutation.md: the
lines of a schema refusal word for word (top level, several missing fields, a long value and
a long message cut, an unexpected key), the file named by read_record, the path named by
`inside`.
"""

from __future__ import annotations

import re

import pytest
from test_summary import make_config, write_study

from kbfuse.errors import KbfuseError
from kbfuse.results import records
from kbfuse.results.manifest import build_manifest


@pytest.fixture
def manifest(tmp_path):
    config = make_config(variants=("nvrtc-cubin-noftz",))
    write_study(tmp_path / "results", config)
    return build_manifest(tmp_path / "results", [], config, tmp_path / "m.json")


def _refused(data, line: str) -> None:
    message = f"m does not follow the manifest record schema:\n  {line}"
    with pytest.raises(KbfuseError, match=f"^{re.escape(message)}$"):
        records.validate_record(data, "manifest", "m")


def test_a_refusal_at_the_top_level_says_so():
    _refused([], "field <top level> is []: [] is not of type 'object'")


def test_every_missing_field_is_named_on_one_line(manifest):
    partial = {k: v for k, v in manifest.items() if k not in ("files", "config")}
    _refused(partial, "field config is missing; field files is missing")


def test_an_unexpected_key_is_named_with_its_object(manifest):
    rel, record = next(iter(manifest["files"].items()))
    entry = {**record, "zz": 1}
    data = {**manifest, "files": {**manifest["files"], rel: entry}}
    _refused(
        data,
        f"field files.{rel} is {repr(entry)[:77]}...: Additional properties are not allowed "
        "('zz' was unexpected)",
    )


def test_a_long_value_and_a_long_message_are_cut(manifest):
    long = "a" * 300
    message = f"{long!r} is too long"
    _refused(
        {**manifest, "generator": {"kbfuse": long}},
        f"field generator.kbfuse is {repr(long)[:77]}...: {message[:200]}",
    )
    fits = "a" * 78  # its repr is 80 characters: shown whole
    _refused(
        {**manifest, "generator": {"kbfuse": fits}},
        f"field generator.kbfuse is {fits!r}: {fits!r} is too long",
    )


def test_read_record_names_the_file(tmp_path, manifest):
    path = tmp_path / "bad.json"
    path.write_text("{not json")
    with pytest.raises(KbfuseError, match=rf"^{re.escape(str(path))} is not valid JSON: "):
        records.read_record(path, "manifest")
    path.write_text("[]\n")
    message = f"{path} does not follow the manifest record schema:\n  field <top level> is []"
    with pytest.raises(KbfuseError, match=f"^{re.escape(message)}"):
        records.read_record(path, "manifest")


def test_inside_names_the_path_that_leaves(tmp_path):
    message = f"path '../x.json' leaves the directory {tmp_path}; refusing to read it"
    with pytest.raises(KbfuseError, match=f"^{re.escape(message)}$"):
        records.inside(tmp_path, "../x.json")
    assert records.inside(tmp_path, "a/x.json") == tmp_path / "a/x.json"


def test_a_value_of_81_characters_is_cut(manifest):
    value = "a" * 79  # its repr is 81 characters
    _refused(
        {**manifest, "generator": {"kbfuse": value}},
        f"field generator.kbfuse is {repr(value)[:77]}...: {value!r} is too long",
    )
