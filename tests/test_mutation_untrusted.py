"""The bounded reads (kbfuse.untrusted, kbfuse.candidates.readback) and the judge's small
helpers, in the details mutation testing found open (docs/mutation.md): each refusal's
message, each limit at its edge, each kind of file named."""

from __future__ import annotations

import io
import json
import os
import re
import socket
import subprocess
import zipfile
from pathlib import Path

import pytest
import torch
from contracts import contract

from kbfuse import untrusted
from kbfuse.candidates import check, evidence, readback
from kbfuse.checks import cases as checks_cases
from kbfuse.errors import KbfuseError

# --------------------------------------------------------------------------- untrusted


def test_every_kind_of_file_is_named(tmp_path):
    regular = tmp_path / "r"
    regular.write_text("x")
    fifo = tmp_path / "f"
    os.mkfifo(fifo)
    link = tmp_path / "l"
    link.symlink_to(regular)
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(tmp_path / "s"))
    try:
        kinds = {
            p.name: untrusted.kind_of(os.lstat(p).st_mode)
            for p in (regular, fifo, link, tmp_path / "s", tmp_path)
        }
    finally:
        server.close()
    assert kinds == {
        "r": "a regular file",
        "f": "a FIFO",
        "l": "a symbolic link",
        "s": "a socket",
        tmp_path.name: "a folder",
    }
    assert untrusted.kind_of(os.stat("/dev/null").st_mode) == "a character device"
    assert untrusted.kind_of(0o060000) == "a block device"
    assert untrusted.kind_of(0) == "a special file"


def test_regular_file_refuses_links_unless_asked_to_follow(tmp_path):
    target = tmp_path / "t"
    target.write_text("abc")
    link = tmp_path / "l"
    link.symlink_to(target)
    with pytest.raises(
        KbfuseError, match=r"^\S+/l is a symbolic link, not a regular file; not read$"
    ):
        untrusted.regular_file(link)
    assert untrusted.regular_file(link, follow=True).st_size == 3
    with pytest.raises(KbfuseError, match=r"^\S+/none cannot be read: No such file or directory$"):
        untrusted.regular_file(tmp_path / "none")


def test_read_bytes_at_and_over_its_limit(tmp_path):
    path = tmp_path / "f"
    path.write_bytes(b"1234")
    assert untrusted.read_bytes(path, 4) == b"1234"
    with pytest.raises(KbfuseError, match=rf"^{path} is 4 bytes, over the 3-byte limit$"):
        untrusted.read_bytes(path, 3)
    link = tmp_path / "l"
    link.symlink_to(path)
    assert untrusted.read_bytes(link, 4, follow=True) == b"1234"
    with pytest.raises(KbfuseError, match="is a symbolic link"):
        untrusted.read_bytes(link, 4)
    big = tmp_path / "big"
    big.write_bytes(b"x" * (3 << 20))  # more than one read of 1 MiB
    assert untrusted.read_bytes(big, 3 << 20) == b"x" * (3 << 20)


def test_a_file_is_read_within_a_folder_only_with_no_link_on_the_way(tmp_path):
    root = tmp_path / "root"
    (root / "a").mkdir(parents=True)
    (root / "a" / "f").write_text("in")
    assert untrusted.read_bytes(root / "a" / "f", 10, within=root) == b"in"
    (root / "b").symlink_to(root / "a")
    with pytest.raises(KbfuseError, match=r"/root/b is a symbolic link, not a folder; not read$"):
        untrusted.read_bytes(root / "b" / "f", 10, within=root)
    with pytest.raises(KbfuseError, match=r"/elsewhere/f is not inside \S+/root; not read$"):
        untrusted.read_bytes(tmp_path / "elsewhere" / "f", 10, within=root)
    with pytest.raises(KbfuseError, match=r"climbs out of \S+/root; not read$"):
        untrusted.read_bytes(root / "a" / ".." / ".." / "x", 10, within=root)
    with pytest.raises(KbfuseError, match=r"/root/c/f cannot be read: \S+/root/c: No such file"):
        untrusted.read_bytes(root / "c" / "f", 10, within=root)
    (root / "plain").write_text("")
    with pytest.raises(KbfuseError, match=r"/root/plain is a regular file, not a folder"):
        untrusted.read_bytes(root / "plain" / "f", 10, within=root)
    (root / "a" / "j.json").write_text('{"k": [1]}')
    assert untrusted.read_json(root / "a" / "j.json", 10, within=root) == {"k": [1]}


def test_read_head_reads_the_start_only_and_what_it_may(tmp_path):
    path = tmp_path / "f"
    path.write_bytes(b"0123456789")
    assert untrusted.read_head(path, 4) == b"0123"
    assert untrusted.read_head(path, 100) == b"0123456789"
    link = tmp_path / "l"
    link.symlink_to(path)
    assert untrusted.read_head(link, 2, follow=True) == b"01"
    with pytest.raises(KbfuseError, match="is a symbolic link"):
        untrusted.read_head(link, 2)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(KbfuseError, match="is a FIFO"):
        untrusted.read_head(fifo, 2, follow=True)


def test_read_tail_reads_the_end_only_and_nothing_of_a_special_file(tmp_path):
    path = tmp_path / "log"
    path.write_bytes(b"0123456789")
    assert untrusted.read_tail(path, 3) == b"789"
    assert untrusted.read_tail(path, 10) == b"0123456789"
    assert untrusted.read_tail(path, 100) == b"0123456789"
    os.truncate(path, 1 << 30)  # sparse: the end read, not the rest
    with open(path, "ab") as handle:
        handle.write(b"end")
    assert untrusted.read_tail(path, 5) == b"\0\0end"
    fifo, link = tmp_path / "fifo", tmp_path / "link"
    os.mkfifo(fifo)
    link.symlink_to(path)
    assert untrusted.read_tail(fifo, 10) == b""
    assert untrusted.read_tail(link, 10) == b""
    assert untrusted.read_tail(tmp_path / "none", 10) == b""


def test_json_is_parsed_strictly_within_its_limit():
    assert untrusted.parse_json(b'{"a": [1, {"b": null}]}', "j", 100) == {"a": [1, {"b": None}]}
    with pytest.raises(KbfuseError, match=r"^j is 5 bytes, over the 4-byte limit$"):
        untrusted.parse_json(b"12345", "j", 4)
    with pytest.raises(KbfuseError, match=r"^j is not valid JSON: 'utf-8' codec"):
        untrusted.parse_json(b'"\xff"', "j", 10)
    with pytest.raises(KbfuseError, match=r"^j is not valid JSON: Infinity is not JSON"):
        untrusted.parse_json(b"Infinity", "j", 10)
    with pytest.raises(KbfuseError, match=r"^j is not valid JSON: key 'a' is given twice"):
        untrusted.parse_json(b'{"a": 1, "b": {"a": 2}, "a": 3}', "j", 100)
    assert untrusted.parse_json(b'{"a": 1, "b": {"a": 2}}', "j", 100) == {"a": 1, "b": {"a": 2}}


def test_nesting_is_counted_in_arrays_and_objects_alike():
    assert untrusted.too_deep(1) is False and untrusted.too_deep("[[[") is False
    assert untrusted.too_deep([[[]]], 3) is False
    assert untrusted.too_deep([[[]]], 2) is True
    assert untrusted.too_deep({"a": {"b": {}}}, 3) is False
    assert untrusted.too_deep({"a": {"b": {}}}, 2) is True
    assert untrusted.too_deep({"a": 1, "b": [1, [2]]}, 3) is False
    assert untrusted.too_deep({"a": 1, "b": [1, [2]]}, 2) is True
    assert untrusted.too_deep([1, 2, {"x": [3]}], 2) is True


# --------------------------------------------------------------------------- readback


def _archive(members: dict[str, bytes], compression=zipfile.ZIP_STORED) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression) as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return buffer.getvalue()


def test_a_torch_save_archive_passes_the_check():
    buffer = io.BytesIO()
    torch.save(torch.ones(8), buffer)
    readback.check_archive(buffer.getvalue(), "t", 10_000)


def test_archives_are_refused_by_what_they_declare(monkeypatch):
    with pytest.raises(KbfuseError, match=r"^t is not a torch.save archive: File is not a zip"):
        readback.check_archive(b"not a zip", "t", 100)
    deflated = _archive({"a/data/0": b"\0" * 1000}, zipfile.ZIP_DEFLATED)
    with pytest.raises(KbfuseError, match=r"^t: member 'a/data/0' is compressed \(1000 bytes"):
        readback.check_archive(deflated, "t", 10_000)
    stored = _archive({"a/data/0": b"\0" * 1000, "a/data/1": b"\0" * 1000})
    readback.check_archive(stored, "t", 2000)
    with pytest.raises(KbfuseError, match=r"^t: its members declare 2000 bytes, over 1999$"):
        readback.check_archive(stored, "t", 1999)
    pickle = _archive({"a/data.pkl": b"(" * (readback.PICKLE_BYTES + 1)})
    with pytest.raises(KbfuseError, match=r"^t: its pickle declares 1048577 bytes, over 1048576$"):
        readback.check_archive(pickle, "t", 10 << 20)
    readback.check_archive(_archive({"a/data.pkl": b"(" * readback.PICKLE_BYTES}), "t", 2 << 20)
    monkeypatch.setattr(readback, "MAX_MEMBERS", 2)
    with pytest.raises(KbfuseError, match=r"^t has 3 members, over 2$"):
        readback.check_archive(_archive({"a": b"", "b": b"", "c": b""}), "t", 100)
    readback.check_archive(_archive({"a": b"", "b": b""}), "t", 100)


def test_tensors_are_loaded_only_from_the_childs_folder_within_the_limit(tmp_path):
    folder = tmp_path / "child"
    (folder / "out").mkdir(parents=True)
    path = folder / "out" / "x.pt"
    torch.save([torch.ones(3), 2], path)
    value = readback.load_tensors(path, folder, 10_000)
    assert torch.equal(value[0], torch.ones(3)) and value[1] == 2
    with pytest.raises(KbfuseError, match=r"x\.pt is \d+ bytes, over the 100-byte limit$"):
        readback.load_tensors(path, folder, 100)
    with pytest.raises(KbfuseError, match="is not inside"):
        readback.load_tensors(path, tmp_path / "other", 10_000)
    broken = folder / "out" / "broken.pt"
    broken.write_bytes(_archive({"archive/data.pkl": b"not a pickle"}))
    with pytest.raises(KbfuseError, match=r"broken\.pt cannot be loaded: \w+: "):
        readback.load_tensors(broken, folder, 10_000)


def _mapped_spans(inode: int) -> list[tuple[int, int]]:
    """The address ranges of this process mapped from the file with this inode."""
    spans = []
    for line in Path("/proc/self/maps").read_text().splitlines():
        fields = line.split()
        if len(fields) >= 5 and fields[4] == str(inode):
            low, high = fields[0].split("-")
            spans.append((int(low, 16), int(high, 16)))
    return spans


def test_a_tensor_file_is_mapped_not_copied(tmp_path):
    folder = tmp_path / "child"
    folder.mkdir()
    path = folder / "x.pt"
    torch.save(torch.arange(4096, dtype=torch.float32), path)
    value = readback.load_tensors(path, folder, 1 << 20)
    assert torch.equal(value, torch.arange(4096, dtype=torch.float32))
    spans = _mapped_spans(path.stat().st_ino)
    assert any(low <= value.data_ptr() < high for low, high in spans)


def test_a_storage_reaching_past_the_files_end_is_refused(tmp_path):
    folder = tmp_path / "child"
    folder.mkdir()
    buffer = io.BytesIO()
    torch.save(torch.arange(1000, dtype=torch.float32), buffer)
    source = zipfile.ZipFile(io.BytesIO(buffer.getvalue()))
    members = {m.filename: source.read(m.filename) for m in source.infolist()}
    # the data record last and cut short: its pickle still declares 4000 bytes
    data = next(name for name in members if name.endswith("/data/0"))
    short = {name: value for name, value in members.items() if name != data}
    short[data] = members[data][:40]
    (folder / "short.pt").write_bytes(_archive(short))
    with pytest.raises(KbfuseError, match=r"short\.pt cannot be loaded: RuntimeError: "):
        readback.load_tensors(folder / "short.pt", folder, 1 << 20)


def test_a_childs_json_or_why_not(tmp_path):
    folder = tmp_path / "child"
    folder.mkdir()
    assert readback.read_json_or_none(folder / "r.json", folder) == (None, "r.json was not written")
    (folder / "r.json").write_text('{"a": 1}')
    assert readback.read_json_or_none(folder / "r.json", folder) == ({"a": 1}, None)
    assert readback.read_json(folder / "r.json", folder, 8) == {"a": 1}
    data, why = readback.read_json_or_none(folder / "r.json", folder, 7)
    assert data is None and why.endswith("r.json is 8 bytes, over the 7-byte limit")
    (folder / "l.json").symlink_to(folder / "r.json")
    data, why = readback.read_json_or_none(folder / "l.json", folder)
    assert data is None and why.endswith("l.json is a symbolic link, not a regular file; not read")


# --------------------------------------------------------------------------- evidence


def test_a_report_is_usable_or_says_why(tmp_path):
    folder = tmp_path / "candidate"
    (folder / "out").mkdir(parents=True)
    path = folder / "out" / "runner.json"
    assert evidence.read_report(path, folder) == ({}, "runner.json was not written")
    path.write_text(json.dumps({"stages_done": ["build"], "failure": None}))
    assert evidence.read_report(path, folder) == ({"stages_done": ["build"], "failure": None}, None)
    path.write_text(json.dumps({"stages_done": ["flying"]}))
    report, why = evidence.read_report(path, folder)
    assert report == {} and why.startswith("field stages_done.0: 'flying' is not one of")


def test_at_most_so_many_flag_sets_are_measured():
    builds = [
        {"route": "torch.utils.cpp_extension.load_inline", "extra_cuda_cflags": [f"-D{i}"]}
        for i in range(evidence.MAX_WITNESS_BUILDS + 3)
    ]
    measured = evidence.witness_builds({"builds": builds})
    assert len(measured) == evidence.MAX_WITNESS_BUILDS
    assert measured[0] == {"route": "load_inline", "flags": ["-D0"]}


def test_an_output_may_be_twice_its_reference_and_a_mib(tmp_path):
    (tmp_path / "reference").mkdir()
    (tmp_path / "reference" / "a.pt").write_bytes(b"x" * 100)
    (tmp_path / "reference" / "b.pt").write_bytes(b"x" * 300)
    cases = [{"name": "a"}, {"name": "b"}]
    assert evidence.output_limit(tmp_path, cases) == 600 + evidence.OUTPUT_SLACK_BYTES


def test_an_unreadable_survey_record_falls_back_to_the_reference(tmp_path):
    info = {"trivial": {"blind_spot": False}}
    survey = tmp_path / "23.json"
    survey.write_text('{"blind_spots": {"zeros": 1}, "blind_spots": {}}')  # a key twice
    assert evidence.trivial_status(info, survey) == (
        {"blind_spot": False},
        "computed by the reference process",
    )
    survey.write_text(json.dumps({"blind_spots": [1]}))
    assert evidence.trivial_status(info, survey)[1] == "computed by the reference process"
    survey.write_text(json.dumps({"blind_spots": {"zeros": {"passes": True}}, "blind_spot": 1}))
    spots, source = evidence.trivial_status(info, survey)
    assert spots == {"zeros": {"passes": True}, "blind_spot": True}
    assert source == "survey record 23.json"
    assert evidence.trivial_status(info, tmp_path / "none.json")[0] == {"blind_spot": False}
    assert evidence.trivial_status(info, None)[0] == {"blind_spot": False}


# --------------------------------------------------------------------------- check helpers


def test_the_device_follows_torch(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert check.default_device() == "cuda"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert check.default_device() == "cpu"


def test_the_checkout_commit_is_read_from_git(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    names = ("GIT_AUTHOR_NAME", "GIT_AUTHOR_EMAIL", "GIT_COMMITTER_NAME", "GIT_COMMITTER_EMAIL")
    env = {**os.environ, **dict.fromkeys(names, "k")}
    for command in (["init", "-q"], ["commit", "-q", "--allow-empty", "-m", "x"]):
        subprocess.run(["git", "-C", str(repo), *command], check=True, env=env)
    head = subprocess.run(
        ["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert check.checkout_commit(repo) == head
    lone = tmp_path / "not-a-repo"
    lone.mkdir()
    assert check.checkout_commit(lone) is None
    assert check.checkout_commit(tmp_path / "missing") is None


def test_the_plan_is_the_reference_plan_of_the_settings():
    settings = {"seeds": [3], "distributions": ["normal"], "x": 1}
    names = [c["name"] for c in check.plan(settings, contract(seed=42, trials=2))]
    assert names == ["official_0", "official_1", "weights", "normal_s3"]


# --------------------------------------------------------------------------- cases


def test_a_case_keeps_its_name_and_group_and_its_gate():
    ref = torch.tensor([1.0, 2.0])
    record = checks_cases.check_case(ref, ref, {"atol": 0, "rtol": 0}, "seed0/uniform", "full")
    assert (record["name"], record["group"]) == ("seed0/uniform", "full")
    assert record["gate"] == "official" and record["gate_pass"] is True
    assert checks_cases.gated_ratio(record) == record["max_ratio_official"]


def test_a_reference_with_nan_is_gated_with_equal_nan_and_the_tolerance():
    ref = torch.tensor([float("nan"), 1.0, 2.0])
    close = torch.tensor([float("nan"), 1.5, 2.0])
    half = {"atol": 0.5, "rtol": 0.0}
    record = checks_cases.check_case(ref, close, half, "c", "g")
    assert record["gate"] == "official_equal_nan" and record["gate_pass"] is True
    assert record["official_pass"] is False  # NaN against NaN fails allclose
    inner = record["official_on_non_nan_reference"]
    assert inner["name"] == "c[non-NaN reference]" and inner["group"] == "g"
    assert checks_cases.gated_ratio(record) == pytest.approx(inner["max_ratio_official"])
    assert checks_cases.gated_ratio(record) == pytest.approx(1.0)
    tight = checks_cases.check_case(ref, close, {"atol": 0.4, "rtol": 0.0}, "c", "g")
    assert tight["gate_pass"] is False  # the tolerance still holds where the NaN is


def test_a_summary_keeps_its_cases_and_capture_and_the_largest_gated_ratio():
    ref = torch.tensor([1.0, 2.0])
    cases = [
        checks_cases.check_case(ref, ref + 0.1, {"atol": 0.2, "rtol": 0}, "a", "g"),
        checks_cases.check_case(ref, ref + 0.15, {"atol": 0.2, "rtol": 0}, "b", "g"),
    ]
    capture = {"capturable": True, "why": None}
    result = checks_cases.assemble(cases, capture)
    assert result["cases"] == cases and result["graph_capture"] == capture
    assert result["summary"]["cases"] == 2
    assert result["gated_max_ratio_official"] == pytest.approx(0.75, rel=1e-3)
    assert result["passed"] is True and result["failing_checks"] == []


# --------------------------------------------------------------------------- compare


def f32(*values):
    return torch.tensor(values, dtype=torch.float32)


def test_a_case_record_names_every_problem_before_comparing():
    from kbfuse.candidates import compare

    ref = f32(1.0, 2.0, 3.0)
    assert compare.compare_case(ref, [1.0], contract(0.1, 0.1)) == {
        "numel": 3,
        "problem": "output is list",
        "official_pass": False,
    }
    assert compare.compare_case("x", [1.0], contract(0.1, 0.1))["numel"] == 0
    wide = compare.compare_case(ref, ref.double(), contract(0.1, 0.1))
    assert wide == {
        "numel": 3,
        "problem": "dtype torch.float64, expected torch.float32",
        "official_pass": False,
    }
    assert compare.compare_case(ref.double(), ref, contract(0.1, 0.1))["problem"] == (
        "dtype torch.float32, expected torch.float64"
    )
    assert compare.compare_case(ref, f32(1.0, 2.0), contract(0.1, 0.1))["problem"] == (
        "shape [2], expected [3]"
    )


def test_a_case_record_counts_non_finite_outputs_and_the_largest_finite_error():
    from kbfuse.candidates import compare

    ref = f32(1.0, 2.0, 3.0, 4.0)
    cand = f32(1.0, float("inf"), float("nan"), 4.25)
    record = compare.compare_case(ref, cand, contract(0.5, 0.0))
    assert record["problem"] is None and record["numel"] == 4
    assert record["nonfinite_candidate"] == 2
    assert record["max_abs"] == 0.25  # inf and nan are left out of the largest error
    assert record["bit_equal"] == 1 and record["bit_identical"] is False
    assert record["official_pass"] is False  # allclose fails on inf and nan
    only_inf = compare.compare_case(f32(1.0), f32(float("inf")), contract(0.5, 0.0))
    assert only_inf["max_abs"] == 0.0 and only_inf["nonfinite_candidate"] == 1
    empty = compare.compare_case(f32(), f32(), contract(0.0, 0.0))
    assert empty["bit_identical"] is True and empty["max_ulps"] == 0 and empty["max_abs"] == 0.0


def test_ulps_order_negative_floats_below_positive_ones():
    from kbfuse.candidates import compare

    bits = compare.ordered_bits(f32(-2.0, -1.0, -0.0, 0.0, 1.0, 2.0))
    assert bits.tolist() == sorted(bits.tolist())
    assert bits[2] == bits[3] == 0
    assert bits[1] == -bits[4]
    assert compare.max_ulps(f32(-1.0), f32(1.0)) == 2 * int(bits[4])
    assert compare.max_ulps(f32(1.0, float("nan")), f32(1.0, 5.0)) == compare.NAN_ULPS
    assert compare.max_ulps(f32(float("nan")), f32(float("nan"))) == 0


# --------------------------------------------------------------------------- evidence


def test_the_contract_reads_ninja_over_the_asked_flags_and_adds_cupy_and_triton():
    runner = {
        "builds": [
            {
                "route": "torch.utils.cpp_extension.load_inline",
                "extra_cuda_cflags": ["--use_fast_math"],
                "extra_cflags": ["-ffast-math"],
            },
            {"route": "cupy.RawKernel", "options": ["-O3"], "implicit_options": ["-ftz=true"]},
        ],
        "ninja": [{"extension": "x", "cuda_flags": ["--fmad=false"], "host_flags": ["-Ofast"]}],
        "triton": True,
    }
    found = evidence.contract(runner, None)
    assert found["routes"] == ["cupy.RawKernel", "torch.utils.cpp_extension.load_inline", "triton"]
    implies = found["implies"]
    assert implies["use_fast_math"] is False  # build.ninja holds what nvcc got, not the ask
    assert implies["ftz"] is True and implies["fmad"] is False  # CuPy's -ftz=true; ninja's
    assert implies["host_fast_math"] == ["-Ofast"]
    assert found["builds"] == runner["builds"] and found["ninja"] == runner["ninja"]
    assert found["witness"] is None and found["effective_ftz"] is None
    asked = evidence.contract({"builds": runner["builds"][:1]}, [])
    assert asked["implies"]["use_fast_math"] is True
    assert asked["implies"]["host_fast_math"] == ["-ffast-math"]
    assert asked["routes"] == ["torch.utils.cpp_extension.load_inline"]


def test_witness_builds_keep_each_flag_set_once_in_order():
    load = "torch.utils.cpp_extension.load"
    builds = [
        {"route": "cupy.RawModule", "options": ["-O3"], "implicit_options": []},
        {"route": load, "extra_cuda_cflags": ["-O2"], "extra_cflags": []},
        {"route": "cupy.RawKernel", "options": ["-O3"], "implicit_options": ["-ftz=true"]},
        {"route": load, "extra_cuda_cflags": ["-O2"], "extra_cflags": ["-g"]},
        {"route": "cupy.RawKernel", "implicit_options": []},
    ]
    assert evidence.witness_builds({"builds": builds}) == [
        {"route": "cupy", "options": ["-O3"]},
        {"route": "load_inline", "flags": ["-O2"]},
        {"route": "cupy", "options": []},
    ]


def test_an_output_the_parent_refuses_is_a_failing_case_naming_why(tmp_path):
    folder = tmp_path / "candidate"
    (folder / "out").mkdir(parents=True)
    fifo = folder / "out" / "a.pt"
    os.mkfifo(fifo)
    record, printed = evidence._compare_one(f32(1.0, 2.0), fifo, folder, contract(0.1, 0.1), 100)
    assert printed is None
    assert record == {
        "numel": 2,
        "problem": f"output not read: {fifo} is a FIFO, not a regular file; not read",
        "official_pass": False,
    }
    missing, _ = evidence._compare_one(
        f32(1.0), folder / "out" / "b.pt", folder, contract(0, 0), 100
    )
    assert missing == {"numel": 1, "problem": evidence.NO_OUTPUT, "official_pass": False}
    good = folder / "out" / "c.pt"
    torch.save(f32(1.0, 2.0), good)
    record, printed = evidence._compare_one(f32(1.0, 2.0), good, folder, contract(0, 0), 10_000)
    assert record["official_pass"] is True and record["bit_identical"] is True
    from kbfuse.candidates import compare

    assert printed == compare.fingerprint(f32(1.0, 2.0))


def test_the_environment_names_the_gpu_and_cuda(monkeypatch):
    from kbfuse.workflow import devices

    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index: f"GPU{index}")
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    gpu = {"index": 3, "uuid": "GPU-0123", "name": "GPU0"}  # the GPU the check was placed on
    monkeypatch.setattr(devices, "current", lambda device: gpu if device == "cuda" else None)
    assert evidence._environment("cuda") == {
        "torch": torch.__version__,
        "device": "cuda",
        "device_name": "GPU0",
        "cuda": "13.0",
        "gpu": gpu,
    }
    assert evidence._environment("cpu") == {"torch": torch.__version__, "device": "cpu"}


# --------------------------------------------------------------------------- found open by mutation


class NotATensor:
    """A class torch.load(weights_only=True) must refuse to build from a pickle."""


def test_only_tensors_and_plain_values_are_loaded(tmp_path):
    folder = tmp_path / "child"
    folder.mkdir()
    path = folder / "evil.pt"
    torch.save(NotATensor(), path)
    with pytest.raises(
        KbfuseError, match=r"evil\.pt cannot be loaded: UnpicklingError: Weights only"
    ):
        readback.load_tensors(path, folder, 10_000)


def test_the_archive_check_names_the_file_and_cuts_long_member_names(tmp_path):
    folder = tmp_path / "child"
    folder.mkdir()
    path = folder / "bomb.pt"
    name = "m" * 100
    path.write_bytes(_archive({name: b"\0" * 64}, zipfile.ZIP_DEFLATED))
    message = (
        f"{path}: member '{'m' * 80}' is compressed (64 bytes declared); torch.save stores "
        "members uncompressed"
    )
    with pytest.raises(KbfuseError, match=f"^{re.escape(message)}$"):
        readback.load_tensors(path, folder, 10_000)
    stored_but_mismatched = _archive({"a": b"\0" * 10})
    readback.check_archive(stored_but_mismatched, "t", 100)


def test_a_linked_folder_inside_a_childs_folder_is_not_followed(tmp_path):
    folder = tmp_path / "child"
    real = tmp_path / "elsewhere"
    real.mkdir()
    (real / "r.json").write_text('{"a": 1}')
    torch.save(torch.ones(1), real / "t.pt")
    folder.mkdir()
    (folder / "out").symlink_to(real)
    for read in (
        lambda: readback.read_json(folder / "out" / "r.json", folder),
        lambda: readback.load_tensors(folder / "out" / "t.pt", folder, 10_000),
    ):
        with pytest.raises(KbfuseError, match=r"/child/out is a symbolic link, not a folder"):
            read()
    data, why = readback.read_json_or_none(folder / "out" / "r.json", folder)
    assert data is None and why.endswith("/child/out is a symbolic link, not a folder; not read")
    report, why = evidence.read_report(folder / "out" / "r.json", folder)
    assert report == {} and why.endswith("is a symbolic link, not a folder; not read")


def test_read_json_follows_links_only_when_asked_and_names_the_file(tmp_path):
    (tmp_path / "r.json").write_text('{"a": 1}')
    (tmp_path / "l.json").symlink_to(tmp_path / "r.json")
    assert untrusted.read_json(tmp_path / "l.json", 100, follow=True) == {"a": 1}
    with pytest.raises(KbfuseError, match="l.json is a symbolic link"):
        untrusted.read_json(tmp_path / "l.json", 100)
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(KbfuseError, match=rf"^{tmp_path}/bad\.json is not valid JSON: "):
        untrusted.read_json(tmp_path / "bad.json", 100)
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "x.json").write_text("1")
    (tmp_path / "ld").symlink_to(tmp_path / "d")
    with pytest.raises(KbfuseError, match="/ld is a symbolic link, not a folder"):
        untrusted.read_json(tmp_path / "ld" / "x.json", 100, within=tmp_path)


def test_a_survey_record_reached_through_a_link_is_read(tmp_path):
    record = tmp_path / "record.json"
    spots = {"zeros": {"passes": False}, "mean_constant": {"passes": False}}
    record.write_text(json.dumps({"blind_spots": spots, "blind_spot": False}))
    (tmp_path / "23.json").symlink_to(record)
    spots_read, source = evidence.trivial_status({}, tmp_path / "23.json")
    assert source == "survey record 23.json" and spots_read["blind_spot"] is False


def test_the_contract_adds_the_flags_of_every_build():
    ninja = [
        {"extension": "a", "cuda_flags": ["--use_fast_math"], "host_flags": ["-ffast-math"]},
        {"extension": "b", "cuda_flags": ["-O3"], "host_flags": ["-O2"]},
    ]
    implies = evidence.contract({"ninja": ninja}, None)["implies"]
    assert implies["use_fast_math"] is True and implies["host_fast_math"] == ["-ffast-math"]
    load = "torch.utils.cpp_extension.load_inline"
    builds = [
        {"route": load, "extra_cuda_cflags": ["--use_fast_math"], "extra_cflags": ["-Ofast"]},
        {"route": load, "extra_cuda_cflags": ["-O3"], "extra_cflags": ["-O2"]},
    ]
    implies = evidence.contract({"builds": builds}, None)["implies"]
    assert implies["use_fast_math"] is True and implies["host_fast_math"] == ["-Ofast"]


def test_a_build_that_names_no_flags_is_measured_with_none():
    load = {"route": "torch.utils.cpp_extension.load"}
    assert evidence.witness_builds({"builds": [load]}) == [{"route": "load_inline", "flags": []}]


def test_no_reference_output_gives_the_slack_alone(tmp_path):
    assert evidence.output_limit(tmp_path, []) == evidence.OUTPUT_SLACK_BYTES


def test_after_a_failure_the_cases_after_a_missing_one_are_still_compared(tmp_path):
    reference, candidate = tmp_path / "reference", tmp_path / "candidate"
    (reference / "out" / "reference").mkdir(parents=True)
    (candidate / "out" / "outputs").mkdir(parents=True)
    plan = [
        {"name": "official_0", "group": "official", "instance": "official"},
        {"name": "official_1", "group": "official", "instance": "official"},
    ]
    for case in plan:
        torch.save(f32(1.0), reference / "out" / "reference" / f"{case['name']}.pt")
    torch.save(f32(1.0), candidate / "out" / "outputs" / "official_1.pt")
    found = evidence.compare_all(
        plan, reference, candidate, contract(0.0, 0.0), 1 << 20, expected=False
    )
    assert sorted(found["cases"]) == ["official_1"]
    (reference / "out" / "reference" / "official_0.pt").unlink()
    torch.save([1], reference / "out" / "reference" / "official_0.pt")
    with pytest.raises(KbfuseError, match=r"^reference output \S+official_0\.pt is not a tensor$"):
        evidence.compare_all(
            plan, reference, candidate, contract(0.0, 0.0), 1 << 20, expected=False
        )


def test_a_reference_folder_linked_elsewhere_is_refused(tmp_path):
    reference, candidate = tmp_path / "reference", tmp_path / "candidate"
    (tmp_path / "real").mkdir()
    (reference / "out").mkdir(parents=True)
    (reference / "out" / "reference").symlink_to(tmp_path / "real")
    torch.save(f32(1.0), tmp_path / "real" / "official_0.pt")
    (candidate / "out").mkdir(parents=True)
    plan = [{"name": "official_0", "group": "official", "instance": "official"}]
    with pytest.raises(KbfuseError, match="/out/reference is a symbolic link, not a folder"):
        evidence.compare_all(plan, reference, candidate, contract(0.0, 0.0), 1 << 20, expected=True)
    (reference / "out" / "reference").unlink()
    (reference / "out" / "reference").mkdir()
    torch.save(f32(1.0), reference / "out" / "reference" / "official_0.pt")
    (candidate / "out" / "outputs").symlink_to(tmp_path / "real")
    found = evidence.compare_all(
        plan, reference, candidate, contract(0.0, 0.0), 1 << 20, expected=True
    )
    assert "is a symbolic link, not a folder" in found["cases"]["official_0"]["problem"]


def test_a_shape_problem_fails_the_case():
    from kbfuse.candidates import compare

    assert compare.compare_case(f32(1.0, 2.0), f32(1.0), contract(0.1, 0.1)) == {
        "numel": 2,
        "problem": "shape [1], expected [2]",
        "official_pass": False,
    }
