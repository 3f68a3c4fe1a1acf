"""The audit's corpus readers (a folder, JSON, JSONL through a mapping), the mapping's checks
(each problem named), the content-named candidate files (written only when changed) and the
entries index, on CPU without any check."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
import yaml

from kbfuse.audit.corpus import Entry, read_corpus, read_records
from kbfuse.audit.mapping import load_mapping, packaged, parse_mapping
from kbfuse.audit.materialise import (
    candidate_text,
    entry_name,
    materialise,
    prepare,
    read_index,
    write_if_changed,
)
from kbfuse.audit.settings import audit_settings, default_name
from kbfuse.errors import KbfuseError

DATA = Path(__file__).parent / "data" / "audit"
CPU = Path(__file__).parent / "candidates" / "cpu"
TINY = DATA / "cuda_l1_tiny.json"
CUDA_L1 = yaml.safe_load(
    (Path(__file__).parents[1] / "src/kbfuse/audit/mappings/cuda_l1.yaml").read_text()
)
SETTINGS = audit_settings({"corpus": str(TINY), "mapping": "cuda_l1"})


def _records() -> list[dict]:
    return [json.loads(line) for line in TINY.read_text().splitlines()]


def _jsonl(path: Path, records: list) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


# --------------------------------------------------------------------------- mappings


def test_the_cuda_l1_mapping_is_packaged_and_reads_its_keys():
    assert "cuda_l1" in packaged()
    mapping = load_mapping("cuda_l1")
    assert mapping.format == "jsonl" and mapping.numerics == "kernelbench-defaults"
    assert mapping.fields == {
        "level": "level_id",
        "task": "task_id",
        "candidate": "custom_code",
        "reference": "ref_code",
    }
    against = {c.name: (c.key, c.against) for c in mapping.claims}
    assert against["over_eager"] == ("score_default", "eager")
    assert against["over_torch_compile"] == ("score_torch_compile_default", "inductor")
    assert against["over_cuda_graph"] == ("score_cuda_graph", None)
    assert mapping.filters == {"level": (2,)}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"format": "csv"}, "m: format is 'csv'; known: ['json', 'jsonl', 'folder']"),
        ({"name": "a b"}, "m: name is 'a b': letters, digits"),
        ({"fields": {"level": "l", "task": "t"}}, "m: fields.candidate is missing"),
        ({"fields": {**CUDA_L1["fields"], "shape": "s"}}, "m: fields.shape is not a field"),
        ({"claims": {"Over": {"key": "k"}}}, "m: claims.Over: a claim name is lowercase"),
        ({"claims": {"x": {"key": "k", "against": "cudnn"}}}, "m: claims.x.against is 'cudnn'"),
        ({"claims": {"x": {"against": "eager"}}}, "m: claims.x.key is None"),
        ({"filters": {"level": 2}}, "m: filters.level is 2: a list of integers"),
        ({"filters": {"gpu": [1]}}, "m: filters.gpu is not a filter"),
        ({"numerics": "fast"}, "m: numerics is 'fast'; known: ['strict', 'kernelbench-defaults']"),
        ({"extra": 1}, "m: extra is not a mapping key"),
        ({"name_pattern": "x"}, "m: name_pattern is for format folder, not jsonl"),
    ],
)
def test_a_bad_mapping_is_named_by_key(change, message):
    with pytest.raises(KbfuseError, match=rf"^{re.escape(message)}"):
        parse_mapping({**CUDA_L1, **change}, "m")


def test_a_folder_mapping_needs_a_pattern_with_level_and_task():
    folder = {"name": "f", "format": "folder"}
    with pytest.raises(KbfuseError, match=r"f: name_pattern is None"):
        parse_mapping(folder, "f")
    with pytest.raises(KbfuseError, match=r"needs the groups \(\?P<level>\) and \(\?P<task>\)"):
        parse_mapping({**folder, "name_pattern": "(?P<task>[0-9]+)"}, "f")
    with pytest.raises(KbfuseError, match=r"f: claims is for a JSON corpus"):
        parse_mapping({**folder, "name_pattern": "x", "claims": {}}, "f")


def test_an_unknown_mapping_names_the_packaged_ones(tmp_path):
    with pytest.raises(KbfuseError, match=r"'nope' is neither a packaged mapping \(cuda_l1\)"):
        load_mapping("nope")
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [unclosed\n")
    with pytest.raises(KbfuseError, match=rf"mapping {re.escape(str(bad))} is not YAML"):
        load_mapping(str(bad))


# --------------------------------------------------------------------------- readers


def test_jsonl_entries_keep_code_reference_and_claims():
    corpus = read_records(TINY, load_mapping("cuda_l1"))
    assert [e.source for e in corpus.entries] == [f"cuda_l1_tiny.json line {n}" for n in (1, 2, 3)]
    first = corpus.entries[0]
    assert (first.level, first.task) == (2, 53)
    assert first.reference == (CPU / "task53_small.py").read_text()
    assert "class ModelNew" in first.code
    assert first.claims == {
        "over_eager": 1.05,
        "over_torch_compile": 0.9,
        "over_torch_compile_reduce_overhead": 1.1,
        "over_cuda_graph": 1.2,
        "over_cudnn": 1.3,
    }
    assert corpus.entries[1].claims["over_cuda_graph"] is None
    # the record without code is kept as skipped, the level-1 record filtered out
    assert [(s.source, s.why) for s in corpus.skipped] == [
        ("cuda_l1_tiny.json line 4", "the corpus holds no candidate code for it")
    ]
    assert corpus.filtered_out == 1


def test_a_json_list_reads_as_the_jsonl_lines(tmp_path):
    mapping = parse_mapping({**CUDA_L1, "format": "json"}, "m")
    path = tmp_path / "c.json"
    path.write_text(json.dumps(_records()))
    entries = read_records(path, mapping).entries
    assert [e.code for e in entries] == [
        e.code for e in read_records(TINY, load_mapping("cuda_l1")).entries
    ]
    assert entries[0].source == "c.json record 0"
    path.write_text(json.dumps({"1": _records()}))
    with pytest.raises(KbfuseError, match=r"a JSON corpus is a list of records"):
        read_records(path, mapping)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"task_id": "53"}, "c.json line 1: task_id is '53': it must be an integer >= 1"),
        ({"level_id": True}, "c.json line 1: level_id is True: it must be an integer >= 1"),
        ({"custom_code": 5}, "c.json line 1: custom_code is a int: it must be a string or null"),
        ({"score_default": 0}, "c.json line 1: score_default is 0: a claimed speedup is a number"),
        ({"score_default": "fast"}, "c.json line 1: score_default is 'fast': a claimed speedup"),
    ],
)
def test_a_bad_record_is_named_by_line_and_key(tmp_path, change, message):
    path = _jsonl(tmp_path / "c.json", [{**_records()[0], **change}])
    with pytest.raises(KbfuseError, match=rf"^{re.escape(message)}"):
        read_records(path, load_mapping("cuda_l1"))


def test_missing_keys_and_broken_lines_are_named(tmp_path):
    mapping = load_mapping("cuda_l1")
    record = {k: v for k, v in _records()[0].items() if k != "task_id"}
    path = _jsonl(tmp_path / "c.json", [record])
    with pytest.raises(KbfuseError, match=r"c.json line 1 has no key 'task_id' \(mapping cuda_l1"):
        read_records(path, mapping)
    record = {k: v for k, v in _records()[0].items() if k != "score_cudnn"}
    path = _jsonl(tmp_path / "c.json", [record])
    with pytest.raises(
        KbfuseError, match=r"no record has the key 'score_cudnn'.*claims.over_cudnn"
    ):
        read_records(path, mapping)
    path.write_text(json.dumps(_records()[0]) + "\n{not json\n")
    with pytest.raises(KbfuseError, match=r"c.json line 2 is not valid JSON"):
        read_records(path, mapping)
    path.write_text("[1]\n")
    with pytest.raises(KbfuseError, match=r"c.json line 1 is a list, not a JSON object"):
        read_records(path, mapping)


def test_code_that_names_no_model_is_skipped_with_its_text(tmp_path):
    path = _jsonl(tmp_path / "c.json", [{**_records()[0], "custom_code": "None"}])
    corpus = read_records(path, load_mapping("cuda_l1"))
    assert corpus.entries == []
    assert corpus.skipped[0].why == "its code names no ModelNew: 'None'"


def test_a_folder_names_tasks_by_line_or_by_pattern(tmp_path):
    folder = tmp_path / "f"
    folder.mkdir()
    for name in ("good", "wrong"):
        (folder / f"{name}.py").write_text((CPU / f"{name}.py").read_text())
    corpus = read_corpus(folder, None)
    assert [(e.source, e.level, e.task) for e in corpus.entries] == [
        ("good.py", 2, 53),
        ("wrong.py", 2, 53),
    ]
    assert corpus.entries[0].claims == {} and corpus.entries[0].reference is None
    named = tmp_path / "n"
    named.mkdir()
    (named / "level2_task53_a.py").write_text("class ModelNew: pass\n")
    pattern = {"name": "n", "format": "folder"}
    mapping = parse_mapping(
        {**pattern, "name_pattern": r"level(?P<level>\d+)_task(?P<task>\d+)_.*"}, "n"
    )
    assert [(e.level, e.task) for e in read_corpus(named, mapping).entries] == [(2, 53)]
    (named / "other.py").write_text("class ModelNew: pass\n")
    with pytest.raises(KbfuseError, match=r"other.py: its name does not match n's name_pattern"):
        read_corpus(named, mapping)
    with pytest.raises(KbfuseError, match=r"names no task: put a line '# kbfuse-task: 2/53'"):
        read_corpus(named, None)


def test_the_form_of_the_corpus_must_match_its_mapping(tmp_path):
    with pytest.raises(KbfuseError, match=r"is a folder, but mapping cuda_l1 is for a jsonl file"):
        read_corpus(tmp_path, load_mapping("cuda_l1"))
    with pytest.raises(KbfuseError, match=r"is a file: name the mapping that reads it"):
        read_corpus(TINY, None)
    with pytest.raises(KbfuseError, match=r"holds no \*.py file"):
        read_corpus(tmp_path, None)
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    with pytest.raises(KbfuseError, match=r"fifo.json is a FIFO"):
        read_corpus(fifo, load_mapping("cuda_l1"))


# --------------------------------------------------------------------------- settings


def test_audit_settings_fill_defaults_and_name_bad_values():
    s = audit_settings({"corpus": "data/h100.json", "mapping": "cuda_l1"})
    assert s["name"] == "h100" and s["references"] == "pinned" and s["in_manifest"] is False
    assert default_name("x/CUDA L1 (h100).jsonl") == "CUDA-L1--h100"
    assert audit_settings(None)["corpus"] is None
    for given, message in (
        ({"corpus": "a", "extra": 1}, "audit.extra is not a setting"),
        ({"references": "own"}, "audit.references is 'own'; known: ['pinned', 'corpus']"),
        ({"limit": True}, "audit.limit is True: an integer from 1"),
        ({"name": "a/b"}, "audit.name is 'a/b': letters, digits"),
        ({"corpus": "a{x}"}, "audit.corpus is 'a{x}': no braces"),
        ({"in_manifest": "yes"}, "audit.in_manifest is 'yes': it must be true or false"),
        ({"numerics": ["strict", "strict"]}, "audit.numerics is ['strict', 'strict']: a list"),
        ({"numerics": "strict"}, "audit.numerics is 'strict': a list of distinct modes"),
        ({"tasks": []}, "audit.tasks is []: a list of distinct task numbers"),
        ({"tasks": [3, 3]}, "audit.tasks is [3, 3]: a list of distinct task numbers"),
        ({"tasks": [0]}, "audit.tasks is [0]: a list of distinct task numbers"),
        ({"tasks": [True]}, "audit.tasks is [True]: a list of distinct task numbers"),
        ({"tasks": "53"}, "audit.tasks is '53': a list of distinct task numbers"),
    ):
        with pytest.raises(KbfuseError, match=rf"^{re.escape(message)}"):
            audit_settings(given)


# --------------------------------------------------------------------------- materialise


def test_names_come_from_content_and_files_are_written_once(tmp_path):
    names, modes = prepare(SETTINGS, tmp_path)
    assert modes == ["kernelbench-defaults"]
    assert list(names.values()) == [(2, 53)] * 3
    files = {n: tmp_path / "candidates" / f"{n}.py" for n in names}
    entry = read_records(TINY, load_mapping("cuda_l1")).entries[0]
    first = next(iter(names))
    assert first == entry_name(entry, "pinned") and first.startswith("l2_t53_")
    assert files[first].read_text() == candidate_text(entry)
    assert candidate_text(entry).startswith("# kbfuse-task: 2/53\n")
    index = tmp_path / "entries.json"
    os.utime(index, ns=(1, 1))  # unchanged content: not written again, its time kept
    for f in files.values():
        os.utime(f, ns=(1, 1))
    assert prepare(SETTINGS, tmp_path)[0] == names
    assert {f.stat().st_mtime_ns for f in files.values()} == {1} and index.stat().st_mtime_ns == 1
    record = read_index(index)
    assert [e["name"] for e in record["entries"]] == list(names)
    assert record["corpus"]["numerics"] == "kernelbench-defaults"
    assert record["corpus"]["filtered_out"] == 1 and len(record["skipped"]) == 1
    assert record["entries"][0]["claims"]["over_eager"] == 1.05


def test_a_changed_entry_gets_a_new_name_and_the_others_keep_theirs(tmp_path):
    corpus_path = _jsonl(tmp_path / "c.json", _records())
    settings = audit_settings({"corpus": str(corpus_path), "mapping": "cuda_l1"})
    before = prepare(settings, tmp_path / "a")[0]
    records = _records()
    records[1]["custom_code"] += "# changed\n"
    records[2]["score_default"] = 1.0  # a claim is not content: the name stays
    _jsonl(corpus_path, records)
    after = prepare(settings, tmp_path / "a")[0]
    assert list(after)[0] == list(before)[0] and list(after)[2] == list(before)[2]
    assert list(after)[1] != list(before)[1]
    assert read_index(tmp_path / "a" / "entries.json")["entries"][2]["claims"]["over_eager"] == 1.0


def test_duplicates_limit_and_corpus_references(tmp_path):
    records = _records()
    corpus_path = _jsonl(tmp_path / "c.json", [records[0], records[0], records[1], records[2]])
    settings = audit_settings({"corpus": str(corpus_path), "mapping": "cuda_l1", "limit": 2})
    names = prepare(settings, tmp_path / "a")[0]
    assert len(names) == 2
    index = read_index(tmp_path / "a" / "entries.json")
    assert index["entries"][0]["duplicates"] == ["c.json line 2"]
    own = audit_settings({**settings, "limit": None, "references": "corpus"})
    names_own = prepare(own, tmp_path / "b")[0]
    assert set(names_own).isdisjoint(names)  # the reference is part of the content
    task = tmp_path / "b" / "tasks" / f"{next(iter(names_own))}.py"
    assert task.read_text() == records[0]["ref_code"]
    no_reference = _jsonl(tmp_path / "d.json", [{**records[0], "ref_code": None}])
    own = audit_settings(
        {"corpus": str(no_reference), "mapping": "cuda_l1", "references": "corpus"}
    )
    assert prepare(own, tmp_path / "d")[0] == {}
    why = read_index(tmp_path / "d" / "entries.json")["skipped"][0]["why"]
    assert why == "the corpus holds no reference for it (audit.references: corpus)"


def test_tasks_choose_the_records_checked_and_listed(tmp_path):
    records = _records()
    other = [{**records[1], "task_id": 81}, {**records[3], "task_id": 95}]
    corpus_path = _jsonl(tmp_path / "c.json", records + other)
    settings = audit_settings({"corpus": str(corpus_path), "mapping": "cuda_l1"})
    assert audit_settings({"corpus": "c.json"})["tasks"] is None
    names = prepare({**settings, "tasks": [81, 95]}, tmp_path / "a")[0]
    assert list(names.values()) == [(2, 81)]
    index = read_index(tmp_path / "a" / "entries.json")
    assert index["corpus"]["tasks"] == [81, 95]
    # task 95's record has no code: listed as not checked; task 53's records are left out
    assert [(s["task"], s["why"]) for s in index["skipped"]] == [
        (95, "the corpus holds no candidate code for it")
    ]
    # the limit counts among the tasks' records
    names = prepare({**settings, "tasks": [53, 81], "limit": 3}, tmp_path / "b")[0]
    assert [task for _, task in names.values()] == [53, 53, 53]
    assert read_index(tmp_path / "b" / "entries.json")["skipped"][0]["task"] == 53
    assert prepare({**settings, "tasks": [7]}, tmp_path / "c")[0] == {}
    assert read_index(tmp_path / "c" / "entries.json")["corpus"]["tasks"] == [7]
    assert read_index(tmp_path / "a" / "entries.json")["corpus"]["limit"] is None


def test_the_claims_mode_is_measured_first_and_must_be_asked_for(tmp_path):
    both = audit_settings({**SETTINGS, "numerics": ["strict", "kernelbench-defaults"]})
    assert prepare(both, tmp_path / "a")[1] == ["kernelbench-defaults", "strict"]
    index = read_index(tmp_path / "a" / "entries.json")
    assert index["corpus"]["measured"] == ["kernelbench-defaults", "strict"]
    strict_only = audit_settings({**SETTINGS, "numerics": ["strict"]})
    with pytest.raises(KbfuseError, match=r"it must include 'kernelbench-defaults', the mode"):
        prepare(strict_only, tmp_path / "b")
    assert not (tmp_path / "b").exists()
    mapping = load_mapping("cuda_l1")
    strict_claims = parse_mapping({**CUDA_L1, "numerics": "strict"}, "m")
    assert strict_claims.numerics == "strict" and mapping.numerics == "kernelbench-defaults"


def test_a_candidate_naming_its_own_task_keeps_its_text():
    code = (CPU / "good.py").read_text()
    assert candidate_text(Entry("x", 2, 53, code)) == code
    assert candidate_text(Entry("x", 2, 81, code)).startswith("# kbfuse-task: 2/81\n# kbfuse")


def test_write_if_changed_writes_only_new_content(tmp_path):
    path = tmp_path / "a" / "f.py"
    assert write_if_changed(path, "x = 1\n") is True
    assert write_if_changed(path, "x = 1\n") is False
    assert write_if_changed(path, "x = 2\n") is True and path.read_text() == "x = 2\n"


def test_an_index_that_breaks_its_schema_is_named(tmp_path):
    prepare(SETTINGS, tmp_path)
    index = tmp_path / "entries.json"
    record = json.loads(index.read_text())
    record["entries"][0]["level"] = "2"
    index.write_text(json.dumps(record))
    with pytest.raises(KbfuseError, match=r"entries.json: field entries.0.level: '2' is not"):
        read_index(index)


def test_materialise_on_the_cuda_l1_shape_of_an_entry_without_claims(tmp_path):
    corpus = read_records(TINY, load_mapping("cuda_l1"))
    names = materialise(corpus, None, {**SETTINGS, "name": "x"}, tmp_path)
    assert read_index(tmp_path / "entries.json")["claims"] == [] and len(names) == 3


def test_docs_audit_shows_the_packaged_mapping_and_the_documented_keys():
    root = Path(__file__).parents[1]
    doc = (root / "docs/audit.md").read_text()
    shown = yaml.safe_load(doc.split("```yaml")[1].split("```")[0])
    assert shown == CUDA_L1
    readme = (root / "config/README.md").read_text()
    documented = re.findall(r"^\| `audit\.(\w+)`", readme, flags=re.M)
    assert documented == list(audit_settings(None))
