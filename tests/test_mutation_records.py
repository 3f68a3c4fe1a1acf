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


# ---------------------------------------------------------------- counts that must add up
# count_problems runs on records that passed their schema; these records hold only the fields
# it reads, so each relation is tested at its exact boundary and its message word for word.


def _case(elements=8, bit_equal=8, **nonfinite) -> dict:
    keys = ("nonfinite_reference", "nonfinite_candidate", "nonfinite_mismatch")
    return {"elements": elements, "bit_equal": bit_equal, **{k: nonfinite.get(k, 0) for k in keys}}


def _correctness(cases, /, **summary) -> dict:
    return {"kind": "correctness", "cases": cases, "summary": summary}


@pytest.mark.parametrize(
    "key", ["bit_equal", "nonfinite_reference", "nonfinite_candidate", "nonfinite_mismatch"]
)
def test_each_count_of_a_case_may_reach_its_elements_but_not_pass_them(key):
    assert records.count_problems(_correctness([_case(**{key: 8})])) == []
    assert records.count_problems(_correctness([_case(), _case(**{key: 9})])) == [
        f"cases[1].{key} is 9, more than its 8 elements"
    ]


def test_a_summary_is_checked_against_the_sums_over_its_cases():
    cases = [_case(8, 8), _case(4, 3), _case(2, 2)]
    right = {"cases": 3, "elements": 14, "elements_bit_equal": 13, "bit_identical_cases": 2}
    assert records.count_problems(_correctness(cases, **right)) == []
    wrong = {"cases": 4, "elements": 15, "elements_bit_equal": 14, "bit_identical_cases": 3}
    assert records.count_problems(_correctness(cases, **wrong)) == [
        "summary.cases is 4, its cases add up to 3",
        "summary.elements is 15, its cases add up to 14",
        "summary.elements_bit_equal is 14, its cases add up to 13",
        "summary.bit_identical_cases is 3, its cases add up to 2",
    ]


def test_a_summary_key_left_out_or_no_summary_checks_only_the_cases():
    cases = [_case(8, 9)]
    only_cases = {"kind": "correctness", "cases": cases}
    assert records.count_problems(only_cases) == [
        "cases[0].bit_equal is 9, more than its 8 elements"
    ]
    assert records.count_problems({**only_cases, "summary": None}) == [
        "cases[0].bit_equal is 9, more than its 8 elements"
    ]
    assert records.count_problems(_correctness(cases, elements=8)) == [
        "cases[0].bit_equal is 9, more than its 8 elements"
    ]


def test_each_implementation_of_the_baselines_is_checked_under_its_name():
    data = {
        "kind": "correctness_baselines",
        "implementations": {
            "torchscript": {"cases": [_case(1, 2)], "summary": {"cases": 1}},
            "inductor": {"cases": [_case(4, 5)], "summary": {"cases": 2}},
        },
    }
    assert records.count_problems(data) == [
        "implementations.torchscript.cases[0].bit_equal is 2, more than its 1 elements",
        "implementations.inductor.cases[0].bit_equal is 5, more than its 4 elements",
        "implementations.inductor.summary.cases is 2, its cases add up to 1",
    ]


def _measurement(q1, median, q3) -> dict:
    return {"samples_ms": [median], "median_ms": median, "q1_ms": q1, "q3_ms": q3}


def test_quartiles_may_be_equal_but_not_out_of_order():
    timing = {"kind": "timing", "measurements": {"full/events": {"eager": _measurement(1, 1, 1)}}}
    assert records.count_problems(timing) == []
    timing["measurements"]["full/events"]["eager"] = _measurement(1.5, 1.0, 2.0)
    timing["measurements"]["tail/graph"] = {"inductor": _measurement(1.0, 3.0, 2.0)}
    assert records.count_problems(timing) == [
        "measurements.full/events.eager: q1_ms 1.5 <= median_ms 1.0 <= q3_ms 2.0 fails",
        "measurements.tail/graph.inductor: q1_ms 1.0 <= median_ms 3.0 <= q3_ms 2.0 fails",
    ]


def test_a_measurement_at_the_top_level_and_partial_ones_are_handled():
    assert records._measurement_problems(_measurement(2, 1, 3), "") == [
        ": q1_ms 2 <= median_ms 1 <= q3_ms 3 fails"
    ]
    partial = {"median_ms": 1, "q1_ms": 2, "q3_ms": 3}  # no samples: not a measurement
    assert records._measurement_problems({"m": partial}, "") == []
    assert records._measurement_problems([_measurement(2, 1, 3)], "x") == []


def _controls(exhaustive=None, cases=()) -> dict:
    data = {"kind": "controls", "tiny_values": {"v": {"cases": list(cases)}}}
    if exhaustive is not None:
        data["exhaustive"] = exhaustive
    return data


def test_tiny_value_cases_of_the_controls_are_checked_by_variant():
    data = _controls(cases=[_case(1, 2), _case(), _case(2, 0, nonfinite_mismatch=3)])
    assert records.count_problems(data) == [
        "tiny_values.v.cases[0].bit_equal is 2, more than its 1 elements",
        "tiny_values.v.cases[2].nonfinite_mismatch is 3, more than its 2 elements",
    ]


def test_exhaustive_counts_nest_payload_in_differ_in_inputs():
    ok = {"a": {"nan_payload_only": 2, "differ": 2, "inputs": 2}}
    assert records.count_problems(_controls(ok)) == []
    assert records.count_problems(_controls()) == []  # no exhaustive block
    bad = {
        "a": {"nan_payload_only": 3, "differ": 2, "inputs": 9},
        "b": {"nan_payload_only": 0, "differ": 10, "inputs": 9},
    }
    assert records.count_problems(_controls(bad)) == [
        "exhaustive.a: nan_payload_only 3 <= differ 2 <= inputs 9 fails",
        "exhaustive.b: nan_payload_only 0 <= differ 10 <= inputs 9 fails",
    ]


def test_the_controls_quartiles_are_checked_and_other_kinds_have_no_counts():
    data = {**_controls(), "tail": {"eager": _measurement(3, 2, 4)}}
    assert records.count_problems(data) == ["tail.eager: q1_ms 3 <= median_ms 2 <= q3_ms 4 fails"]
    # the schemas allow extra keys at the top: a measurement there is named by its fields alone
    top = {"kind": "timing", **_measurement(2, 1, 3)}
    assert records.count_problems(top) == [": q1_ms 2 <= median_ms 1 <= q3_ms 3 fails"]
    other = {"kind": "verify", "cases": [_case(1, 5)], "m": _measurement(3, 2, 4)}
    assert records.count_problems(other) == []


def test_counts_that_do_not_add_up_are_refused_naming_the_label(monkeypatch):
    monkeypatch.setattr(records, "_validator", lambda kind: _NoErrors())
    data = _correctness([_case(8, 9), _case(2, 3)])
    message = (
        "r.json: counts do not add up:\n"
        "  cases[0].bit_equal is 9, more than its 8 elements\n"
        "  cases[1].bit_equal is 3, more than its 2 elements"
    )
    with pytest.raises(KbfuseError, match=f"^{re.escape(message)}$"):
        records.validate_record(data, "correctness", "r.json")
    records.validate_record(_correctness([_case()]), "correctness", "r.json")


class _NoErrors:
    def iter_errors(self, data):
        return iter(())


# ---------------------------------------------------------------- schema refusals, parsing


def test_at_most_five_errors_are_shown_in_path_order_then_a_count(manifest):
    record = next(iter(manifest["files"].values()))
    files = {f"extra/{i}.json": {**record, "bytes": "x"} for i in (3, 1, 6, 2, 7, 5, 4)}
    data = {**manifest, "files": {**manifest["files"], **files}}
    with pytest.raises(
        KbfuseError, match=r"^m does not follow the manifest record schema:\n"
    ) as err:
        records.validate_record(data, "manifest", "m")
    lines = str(err.value).split("\n  ")
    assert lines[0] == "m does not follow the manifest record schema:"
    shown = [
        f"field files.{rel}.bytes is 'x': 'x' is not of type 'integer'" for rel in sorted(files)
    ]
    assert lines[1:] == [*shown[:5], f"... and {len(files) - 5} more"]


def _bad_sizes(manifest: dict, count: int) -> str:
    """The message for a manifest with `count` more files whose size is not an integer."""
    record = next(iter(manifest["files"].values()))
    files = {f"extra/{i}.json": {**record, "bytes": "x"} for i in range(count)}
    with pytest.raises(
        KbfuseError, match=r"^m does not follow the manifest record schema:\n"
    ) as err:
        records.validate_record(
            {**manifest, "files": {**manifest["files"], **files}}, "manifest", "m"
        )
    return str(err.value)


def test_a_sixth_error_is_counted(manifest):
    assert _bad_sizes(manifest, 6).split("\n  ")[-1] == "... and 1 more"


def test_exactly_five_errors_get_no_count(manifest):
    message = _bad_sizes(manifest, 5)
    assert len(message.split("\n  ")) == 6
    assert "more" not in message


def test_an_unknown_kind_is_named_with_the_known_ones():
    message = f"no record schema for kind 'x'; known: {list(records.SCHEMA_KINDS)}"
    with pytest.raises(KbfuseError, match=f"^{re.escape(message)}$"):
        records.validate_record({}, "x", "m")


def test_parse_json_refuses_over_the_limit_and_names_what_is_wrong(monkeypatch):
    with pytest.raises(KbfuseError, match=r"^r is not valid JSON: maximum recursion depth"):
        records.parse_json(b"[" * 100_000 + b"]" * 100_000, "r")
    monkeypatch.setattr(records, "MAX_RECORD_BYTES", 8)
    assert records.parse_json(b'"123456"', "r") == "123456"  # exactly at the limit
    with pytest.raises(KbfuseError, match=r"^r is 9 bytes, over the 8-byte limit$"):
        records.parse_json(b'"1234567"', "r")
    message = "r is not valid JSON: NaN is not JSON (kbfuse writes non-finite floats as strings)"
    with pytest.raises(KbfuseError, match=f"^{re.escape(message)}$"):
        records.parse_json(b"NaN", "r")
    with pytest.raises(KbfuseError, match=r"^r is not valid JSON: 'utf-8' codec can't decode"):
        records.parse_json(b'"\xff"', "r")


def test_read_limited_reads_up_to_the_limit_and_names_the_file(tmp_path, monkeypatch):
    monkeypatch.setattr(records, "MAX_RECORD_BYTES", 4)
    path = tmp_path / "r.json"
    path.write_bytes(b"1234")
    assert records.read_limited(str(path)) == b"1234"
    path.write_bytes(b"12345")
    with pytest.raises(
        KbfuseError, match=f"^{re.escape(f'{path} is 5 bytes, over the 4-byte limit')}$"
    ):
        records.read_limited(str(path))
    missing = tmp_path / "none.json"
    message = f"{missing} cannot be read: No such file or directory"
    with pytest.raises(KbfuseError, match=f"^{re.escape(message)}$"):
        records.read_limited(str(missing))


def test_inside_refuses_an_absolute_name_and_a_climb_through_a_link(tmp_path):
    root = tmp_path / "root"
    (root / "a").mkdir(parents=True)
    assert records.inside(str(root), "a/../b.json") == root / "a/../b.json"
    outside = tmp_path / "outside.json"
    message = f"path {str(outside)!r} leaves the directory {root}; refusing to read it"
    with pytest.raises(KbfuseError, match=f"^{re.escape(message)}$"):
        records.inside(root, outside)
    (root / "link").symlink_to(tmp_path)
    with pytest.raises(KbfuseError, match=r"^path 'link/x' leaves the directory "):
        records.inside(root, "link/x")
