"""Records are validated where they are read: schemas, strict types, finite times, counts.

Every edit below is one a careless or hostile collaborator could make to a result file; the
summary must refuse it, naming file, field and value, before any table or plot is written.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import jsonschema
import pandas as pd
import pytest
from conftest import json_paths
from test_summary import make_config, write_study

from kbfuse.errors import KbfuseError
from kbfuse.io import read_json, write_json
from kbfuse.results import plots, records, summary

REPO = Path(__file__).resolve().parents[1]
REFERENCE = REPO / "results/reference/h200"


@pytest.fixture
def study(tmp_path):
    config = make_config(variants=("cupy-default", "nvrtc-cubin-noftz", "nvrtc-cubin-ftz"))
    root = tmp_path / "results"
    write_study(root, config)
    return root, config


def _edit(path: Path, edit) -> None:
    data = read_json(path)
    edit(data)
    write_json(path, data)


def _first_case(d: dict) -> dict:
    return d["cases"][0]


EDITS = [
    # (file, edit, words the message must hold)
    ("correctness/53/cupy-default.json", lambda d: d.update(passed="false"), "field passed"),
    (
        "correctness/53/cupy-default.json",
        lambda d: _first_case(d).update(official_pass="true"),
        "cases[0].official_pass",
    ),
    (
        "correctness/53/cupy-default.json",
        lambda d: _first_case(d).update(official_pass=1),
        "cases[0].official_pass",
    ),
    (
        "correctness/81/nvrtc-cubin-ftz.json",
        lambda d: _first_case(d).update(elements=-4096),
        "cases[0].elements",
    ),
    (
        "correctness/81/nvrtc-cubin-ftz.json",
        lambda d: _first_case(d).update(bit_equal=_first_case(d)["elements"] + 1),
        "more than its",
    ),
    (
        "correctness/81/nvrtc-cubin-ftz.json",
        lambda d: d["summary"].update(elements_bit_equal=d["summary"]["elements_bit_equal"] + 7),
        "summary.elements_bit_equal",
    ),
    (
        "correctness/53/baselines.json",
        lambda d: d["implementations"]["inductor"].update(passed="yes"),
        "implementations.inductor.passed",
    ),
    (
        "timing/53.json",
        lambda d: d["measurements"]["tail/graph"]["eager"].update(median_ms="nan"),
        "median_ms",
    ),
    (
        "timing/53.json",
        lambda d: d["measurements"]["tail/graph"]["eager"].update(median_ms=-1.0),
        "median_ms",
    ),
    (
        "timing/81.json",
        lambda d: d["measurements"]["full/events"]["eager"].update(q1_ms=1e9),
        "q1_ms",
    ),
    ("timing/81.json", lambda d: d.update(tail_bytes="4096"), "field tail_bytes"),
    (
        "controls/53.json",
        lambda d: d["exhaustive"]["cupy-default"].update(differ=2**33),
        "exhaustive.cupy-default",
    ),
    (
        "controls/81.json",
        lambda d: d["exhaustive"]["nvrtc-cubin-ftz"].update(bit_identical="false"),
        "bit_identical",
    ),
    ("verify/nvrtc-cubin-ftz.json", lambda d: d.update(effective_ftz="true"), "effective_ftz"),
    ("compile/cupy-default/meta.json", lambda d: d.update(ptx_ftz_count=-2), "ptx_ftz_count"),
    ("env/fingerprint.json", lambda d: d["copy_bandwidth"].update(gbps=0), "copy_bandwidth.gbps"),
    ("kernelbench/pin.json", lambda d: d.update(commit="HEAD"), "field commit"),
    (
        "controls/witness81.json",
        lambda d: next(iter(d["variants"].values()))[0].update(bit_equal="false"),
        "bit_equal",
    ),
    (
        "protocol/margin_audit.json",
        lambda d: d["cases"][0].update(flips="false") if d["cases"] else d.update(cases=[{}]),
        "cases[0]",
    ),
    ("protocol/direction_witness.json", lambda d: d.update(allclose_a_b=None), "allclose_a_b"),
]


@pytest.mark.parametrize(("rel", "edit", "words"), EDITS, ids=[f"{e[0]}:{e[2]}" for e in EDITS])
def test_a_bad_value_is_refused_naming_file_and_field(study, tmp_path, rel, edit, words):
    root, config = study
    _edit(root / rel, edit)
    out = tmp_path / "summary"
    with pytest.raises(KbfuseError, match=re.escape(words)) as err:
        summary.write_summary(root, config, out)
    assert rel in str(err.value) and words in str(err.value)
    assert not out.exists()  # refused before anything is written


@pytest.mark.parametrize(
    ("raw", "words"),
    [
        (b'{"kind": "timing", "schema_version": 1, "tail_bytes": NaN}', "NaN is not JSON"),
        (b'{"kind": "timing", "schema_version": 1, "x": Infinity}', "Infinity is not JSON"),
        (b'{"kind": "timing", "schema_version": 1, "x": "\xff"}', "not valid JSON"),
        (b"[" * 100_000 + b"]" * 100_000, "not valid JSON"),
        (b"", "not valid JSON"),
    ],
)
def test_json_that_is_not_strict_json_is_refused(study, raw, words):
    root, config = study
    (root / "timing/53.json").write_bytes(raw)
    with pytest.raises(KbfuseError, match=words):
        summary.build_tables(root, config)


def test_an_oversized_record_is_refused_before_parsing(study, monkeypatch):
    root, config = study
    monkeypatch.setattr(records, "MAX_RECORD_BYTES", 1000)
    with pytest.raises(KbfuseError, match="over the 1000-byte limit"):
        summary.build_tables(root, config)


# ---------------------------------------------------------------- plots and staged output


def _tail_rows(median: float) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "task": [53, 53],
            "method": ["graph", "graph"],
            "impl": ["eager", "fast"],
            "kind": ["baseline", "variant"],
            "median_ms": [0.1, median],
            "q1_ms": [0.09, 0.05],
            "q3_ms": [0.11, 0.2],
            "floor_ms": [0.05, 0.05],
            "pct_of_floor": [50.0, 50.0],
        }
    )


@pytest.mark.parametrize("median", [float("nan"), float("inf"), -0.5])
def test_a_non_finite_median_is_refused_before_drawing(tmp_path, median):
    target = tmp_path / "tail.png"
    with pytest.raises(KbfuseError, match="column median_ms .* for fast"):
        plots.plot_tail_times(_tail_rows(median), 53, target)
    assert not target.exists()
    plots.plot_tail_times(_tail_rows(0.07), 53, target)
    assert target.read_bytes()[:4] == b"\x89PNG"


def test_a_summary_that_fails_half_way_leaves_nothing_in_place(study, tmp_path, monkeypatch):
    root, config = study
    out = tmp_path / "summary"
    out.mkdir()
    (out / "keep.txt").write_text("mine")

    def fail(*_args, **_kwargs):
        raise KbfuseError("control_bit_equality: cannot plot")

    monkeypatch.setattr(plots, "plot_control_bit_equality", fail)
    with pytest.raises(KbfuseError, match="cannot plot"):
        summary.write_summary(root, config, out)
    assert [p.name for p in out.iterdir()] == ["keep.txt"]  # tables were staged, then dropped
    monkeypatch.undo()
    written = summary.write_summary(root, config, out)
    assert sorted(p.name for p in out.iterdir()) == sorted(["keep.txt", *(p.name for p in written)])
    assert all(p.is_file() for p in written)


def test_a_summary_refuses_an_output_that_is_a_file(study, tmp_path):
    root, config = study
    target = tmp_path / "taken"
    target.write_text("x")
    with pytest.raises(KbfuseError, match="exists and is not a directory"):
        summary.write_summary(root, config, target)
    assert target.read_text() == "x"


# ---------------------------------------------------------------- the schemas themselves


def test_every_schema_is_a_valid_json_schema_and_documented():
    contracts = (REPO / "docs/contracts.md").read_text()
    for kind in records.SCHEMA_KINDS:
        schema = json.loads(records.schema_text(f"{kind}.schema.json"))
        jsonschema.Draft202012Validator.check_schema(schema)
        assert f"{kind}.schema.json" in contracts, kind


def _reference_records():
    for path in sorted(REFERENCE.rglob("*.json")):
        if {"summary", "benchmarks", "logs"} & set(path.relative_to(REFERENCE).parts):
            continue
        kind = json.loads(path.read_text()).get("kind")
        if kind in records.SCHEMA_KINDS:
            yield path, kind


def test_the_committed_reference_follows_every_schema():
    seen = {}
    for path, kind in _reference_records():
        records.read_record(path, kind)
        seen[kind] = seen.get(kind, 0) + 1
    # the study's run, the survey's (survey/, with a manifest of its own) and the second
    # study's (fused2/, its own manifest; 11 variants x 2 tasks). The survey's cross-device
    # check (survey_devices) on one H200 has one device and nothing to compare.
    assert set(seen) == set(records.SCHEMA_KINDS)
    assert seen["correctness"] == 33 + 22 and seen["survey_rows"] == 1
    assert seen["manifest"] == 3 and seen["survey_task"] == 200
    assert seen["survey_floor"] == 100 and seen["survey_devices"] == 1


def _shrunk(node):
    """`node` with every list cut to its first three items (the errors still compare, at a
    fraction of the time: a margin audit holds thousands of rows)."""
    if isinstance(node, dict):
        return {key: _shrunk(value) for key, value in node.items()}
    if isinstance(node, list):
        return [_shrunk(value) for value in node[:3]]
    return node


def _edited(record, path, value):
    copy = json.loads(json.dumps(record))
    node = copy
    for key in path[:-1]:
        node = node[key]
    if value is KeyError:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return copy


def _errors(validator, record):
    return sorted(
        (list(map(str, e.absolute_path)), e.validator, e.message)
        for e in validator.iter_errors(record)
    )


def test_inlined_references_give_the_errors_the_references_give():
    """records._validator inlines every $ref; the schemas as written, with their references
    looked up in the registry, must refuse the same edits of real records with the same
    errors."""
    first = {}
    for path, kind in _reference_records():
        first.setdefault(kind, _shrunk(read_json(path)))
    compared = 0
    for kind, record in sorted(first.items()):
        written = json.loads(records.schema_text(f"{kind}.schema.json"))
        looked_up = jsonschema.Draft202012Validator(written, registry=records._registry())
        inlined = records._validator(kind)
        assert "$ref" not in json.dumps(inlined.schema)
        paths = [path for path in json_paths(record) if path]
        for index, path in enumerate(paths[:: max(1, len(paths) // 12)]):
            value = ["x", -1, None, 1.5, KeyError, [], True][index % 7]
            if value is KeyError and isinstance(path[-1], int):
                continue
            edited = _edited(record, path, value)
            assert _errors(inlined, edited) == _errors(looked_up, edited), (kind, path, value)
            compared += bool(_errors(looked_up, edited))
    assert compared >= 80  # most edits are refused, each with the same errors


def test_a_reference_back_into_the_schema_being_inlined_stays_a_reference():
    from referencing import Registry, Resource

    tree = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": "tree.json",
        "type": "object",
        "properties": {"children": {"type": "array", "items": {"$ref": "#"}}},
        "$defs": {
            "leaf": {"$ref": "#/$defs/count", "description": "a count"},
            "count": {"type": "integer", "minimum": 0},
        },
    }
    registry = Registry().with_resource("tree.json", Resource.from_contents(tree))
    inlined = records.inline_refs(tree, registry, "tree.json")
    assert inlined["properties"]["children"]["items"] == {"$ref": "tree.json"}
    # siblings of a $ref are kept beside an allOf of its target
    assert inlined["$defs"]["leaf"] == {
        "description": "a count",
        "allOf": [{"type": "integer", "minimum": 0}],
    }
    validator = jsonschema.Draft202012Validator(inlined, registry=registry)
    assert validator.is_valid({"children": [{"children": []}]})
    assert not validator.is_valid({"children": [{"children": [1]}]})
