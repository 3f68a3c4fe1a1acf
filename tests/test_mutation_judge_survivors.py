"""The judge's parent (kbfuse.candidates.check) and its bounded reads (kbfuse.untrusted,
kbfuse.candidates.readback) in the details mutation testing found open (docs/mutation.md,
"Survivors"): what a child is asked, the contract it is judged by, that every read of a
child's file is confined to that child's folder, what the bounded reads ask of the operating
system, and the text of each refusal. The children are played in this process as in
tests/test_mutation_check.py."""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
from pathlib import Path

import pytest
from test_mutation_check import (
    BUILDS,
    CONTRACT,
    GOOD_REPORT,
    JUDGED,
    SETTINGS,
    TASK53,
    Children,
    RecordingLock,
    _scratch,
    judge,
    same,
)

from kbfuse import untrusted
from kbfuse.candidates import check, diskbudget, evidence, readback, witness
from kbfuse.errors import KbfuseError


@pytest.fixture
def children(monkeypatch):
    """test_mutation_check's children (its `judge` runs them), installed as check.run_child."""

    def install(**kwargs) -> Children:
        fake = Children(**kwargs)
        monkeypatch.setattr(check, "run_child", fake)
        return fake

    return install


# --------------------------------------------------------------------------- the contract


def test_the_checks_seed_replaces_the_pinned_contracts_seed(tmp_path, children):
    fake = children(change=same)
    record = judge(tmp_path, {"seed": 7})
    for call in fake.calls:
        assert call["request"]["contract"] == {**JUDGED, "seed": 7}
    assert record["official"]["seed"] == 7 and record["official"]["trials"] == 2


def test_without_a_seed_or_trials_setting_the_pinned_contract_is_used_unchanged():
    settings = check.check_settings({"seed": None, "official_trials": None})
    assert check.judged_contract(CONTRACT, settings) == dict(CONTRACT)
    settings = check.check_settings({"seed": 0, "official_trials": 3})
    judged = check.judged_contract(CONTRACT, settings)
    assert (judged["seed"], judged["trials"]) == (0, 3)
    assert "SEED" not in judged and len(judged) == len(CONTRACT)


def test_a_bad_pinned_contract_is_named_as_the_checks_contract():
    settings = check.check_settings(None)
    with pytest.raises(KbfuseError, match=r"^the check's kernelbench contract: seed is -1$"):
        check.judged_contract({**CONTRACT, "seed": -1}, settings)


# --------------------------------------------------------------------------- the requests


@pytest.mark.parametrize("numerics", ["strict", "kernelbench-defaults", None])
def test_both_children_are_asked_for_the_checks_numerics_mode(tmp_path, children, numerics):
    fake = children(change=same)
    judge(tmp_path, {"numerics": numerics})
    assert [c["role"] for c in fake.calls] == ["reference", "candidate"]
    for call in fake.calls:
        assert "numerics" in call["request"] and call["request"]["numerics"] == numerics


def test_the_candidate_is_asked_for_the_planned_cases_with_the_settings_it_runs_under(
    tmp_path, children
):
    fake = children(change=same)
    judge(tmp_path, {"gpu_memory_fraction": 0.25, "baselines": ["eager"]})
    ref, cand = fake.calls
    request = cand["request"]
    assert request["gpu_memory_fraction"] == 0.25 and request["baselines"] == ["eager"]
    assert request["timing"] == check.check_settings(None)["timing"]
    assert request["cases"][0] == {**check.plan(check.check_settings(SETTINGS), JUDGED)[0]}
    assert ref["request"]["device"] == cand["request"]["device"] == "cpu"


# --------------------------------------------------------------------------- confined reads


def _reads(monkeypatch) -> list[tuple[str, Path | None]]:
    """Every read_json of a child's file: (its name, the folder it must lie in)."""
    reads = []
    original = readback.read_json

    def spy(path, folder, limit=readback.JSON_BYTES):
        reads.append((Path(path).name, folder))
        return original(path, folder, limit)

    monkeypatch.setattr(readback, "read_json", spy)
    return reads


def test_every_record_a_child_leaves_is_read_within_that_childs_folder(
    tmp_path, children, monkeypatch
):
    reads = _reads(monkeypatch)
    fake = children(change=same)
    judge(tmp_path)
    root = fake.calls[0]["view"].folder.parent
    assert reads == [
        ("cases.json", root / "reference"),
        ("reference.json", root / "reference"),
        ("runner.json", root / "candidate"),
    ]


def test_a_failed_references_error_record_is_read_within_its_folder(
    tmp_path, children, monkeypatch
):
    def error(out: Path) -> None:
        (out / "error.json").write_text(json.dumps({"error": "E", "message": "m"}))

    reads = _reads(monkeypatch)
    fake = children(change=same, outcome={"reference": ("exited", 1)}, after={"reference": error})
    with pytest.raises(KbfuseError, match=r"failed \(exited, exit 1\): E: m; log: "):
        judge(tmp_path)
    assert reads == [("error.json", fake.calls[0]["view"].folder)]


def test_an_error_record_behind_a_linked_output_folder_is_not_read(tmp_path, children):
    def link_out(out: Path) -> None:
        (out / "error.json").write_text(json.dumps({"error": "Planted", "message": "lie"}))
        real = out.parent / "real-out"
        out.rename(real)
        out.symlink_to(real)

    children(change=same, outcome={"reference": ("exited", 1)}, after={"reference": link_out})
    with pytest.raises(KbfuseError, match=r"failed \(exited, exit 1\): None: None; log: "):
        judge(tmp_path)


def test_the_reference_cases_behind_a_linked_output_folder_are_refused_first(tmp_path, children):
    def link_out(out: Path) -> None:
        real = out.parent / "real-out"
        out.rename(real)
        out.symlink_to(real)

    children(change=same, after={"reference": link_out})
    with pytest.raises(
        KbfuseError, match=r"failed \(\S+/out/cases\.json: \S+/out is a symbolic link, not a folder"
    ):
        judge(tmp_path)


def test_the_witness_record_is_read_within_the_witness_folder(tmp_path, monkeypatch):
    reads = _reads(monkeypatch)
    kept = [{"route": "load_inline", "flags": ["-O3"], "effective_ftz": False}]
    monkeypatch.setattr(check, "run_child", Children(witness=kept))
    found, _ = check.run_witness(
        {"witness_cache": None}, BUILDS, _scratch(tmp_path), tmp_path / "w", None
    )
    assert found == kept
    assert reads == [("witness.json", tmp_path / "witness")]


def test_the_witness_builds_and_measures_in_its_own_folder_with_its_log(tmp_path, monkeypatch):
    fake = Children(witness=[])
    monkeypatch.setattr(check, "run_child", fake)
    check.run_witness({"witness_cache": None}, BUILDS, _scratch(tmp_path), tmp_path / "w", None)
    assert [(c["role"], c["request"].get("build_only"), c["log"]) for c in fake.calls] == [
        ("witness", True, tmp_path / "w"),
        ("witness", None, tmp_path / "w"),
    ]
    assert {c["view"].folder for c in fake.calls} == {tmp_path / "witness"}


def test_the_measuring_witness_is_given_the_builds_and_the_cache_folders_it_may_write(
    tmp_path, monkeypatch
):
    fake = Children(witness=[])
    monkeypatch.setattr(check, "run_child", fake)
    cache = tmp_path / "cache"
    folder = cache.resolve() / witness.extension_name(["-O3"])
    check.run_witness(
        {"witness_cache": str(cache)}, BUILDS, _scratch(tmp_path), tmp_path / "w", None
    )
    (folder / f"{folder.name}.so").write_bytes(b"")  # built: measured only, next time
    check.run_witness(
        {"witness_cache": str(cache)}, BUILDS, _scratch(tmp_path), tmp_path / "w", None
    )
    builds = [{"route": "load_inline", "flags": ["-O3"]}]
    assert [(c["request"].get("build_only"), c["view"].writable) for c in fake.calls] == [
        (True, (folder,)),
        (None, (folder,)),
        (None, (folder,)),
    ]
    assert all(c["request"]["builds"] == builds for c in fake.calls)


def test_the_phases_of_a_check_are_timed_to_the_millisecond(tmp_path, children, monkeypatch):
    # each phase: its end, then the start of the next
    ticks = iter([10.0, 11.23456, 11.3, 13.0, 13.0, 13.0004, 14.0, 21.5, 22.0])
    monkeypatch.setattr(check, "time", type("Clock", (), {"monotonic": lambda: next(ticks)}))
    children(change=same)
    record = judge(tmp_path)
    assert record["phases_s"] == {
        "scratch_wait": 0.0,
        "reference": 1.235,
        "candidate": 1.7,
        "witness": 0.0,
        "compare": 7.5,
    }


def test_a_reference_record_that_is_not_an_object_is_taken_as_empty(tmp_path, children):
    def listed(out: Path) -> None:
        (out / "reference.json").write_text("[]")

    fake = children(change=same, after={"reference": listed})
    planned = check.plan(check.check_settings(SETTINGS), JUDGED)
    scratch = _scratch(tmp_path, "cpu")
    cases, info, folder = check.run_reference(
        TASK53, check.check_settings(SETTINGS), JUDGED, scratch, planned, tmp_path / "r.log"
    )
    assert info == {} and folder == tmp_path / "reference"
    assert [c["name"] for c in cases] == [c["name"] for c in planned]
    assert fake.calls[0]["role"] == "reference"


# --------------------------------------------------------------------------- small helpers


def test_the_checkout_commit_asks_git_with_a_timeout_and_no_raise(tmp_path, monkeypatch):
    calls = []

    def run(argv, **kwargs):
        calls.append((argv, kwargs))
        return subprocess.CompletedProcess(argv, 0, stdout="abc\n", stderr="")

    monkeypatch.setattr(check.subprocess, "run", run)
    assert check.checkout_commit(tmp_path) == "abc"
    ((argv, kwargs),) = calls
    assert argv == ["git", "-C", str(tmp_path), "rev-parse", "HEAD"]
    assert kwargs == {"capture_output": True, "text": True, "timeout": 30, "check": False}
    assert kwargs["check"] is False

    def slow(argv, **kwargs):
        raise subprocess.TimeoutExpired(argv, kwargs["timeout"])

    monkeypatch.setattr(check.subprocess, "run", slow)
    assert check.checkout_commit(tmp_path) is None


def test_the_shared_witness_cache_folder_is_named_by_the_flags_and_made_once(tmp_path):
    cache = tmp_path / "cache"
    settings = {"witness_cache": str(cache)}
    builds = [{"route": "load_inline", "flags": ["-O3"]}, {"route": "cupy", "options": []}]
    env, writable = check.witness_env(settings, builds)
    assert writable == [cache.resolve() / witness.extension_name(["-O3"])]
    assert writable[0].is_dir() and env == {"TORCH_EXTENSIONS_DIR": str(cache.resolve())}
    assert check.witness_env(settings, builds) == (env, writable)  # already there: no error


# --------------------------------------------------------------------------- the scratch disk


def _cpu_need(settings: dict, contract: dict) -> int:
    """The scratch a check of the CPU fixture task reserves: its 16 x 64 float32 output per
    planned case, twice, and once after timing (diskbudget.scratch_need)."""
    cases = len(check.plan(check.check_settings(settings), contract))
    return diskbudget.scratch_need(diskbudget.TaskBytes(16 * 32 * 4, 16 * 64 * 4), cases)


SIZES = {
    "task53_small.py": diskbudget.TaskBytes(16 * 32 * 4, 16 * 64 * 4),
    "53_Gemm.py": diskbudget.TaskBytes(16 * 32 * 4, 16 * 64 * 4),
    "60_Big.py": diskbudget.TaskBytes(4 << 20, 4 << 20),  # 4 MiB of output per case
}


@pytest.fixture
def sizes(monkeypatch) -> list[str]:
    """diskbudget.task_bytes played from SIZES (its own tests build the fake forward): the
    names of the files it was asked about; None for any other file (unknown sizes)."""
    asked = []

    def task_bytes(task_file):
        asked.append(Path(task_file).name)
        return SIZES.get(Path(task_file).name)

    monkeypatch.setattr(diskbudget, "task_bytes", task_bytes)
    return asked


def test_the_scratch_estimate_counts_the_planned_cases_of_the_task(tmp_path, sizes):
    settings = check.check_settings(SETTINGS)
    need = check.scratch_estimate(TASK53, settings, JUDGED)
    assert need == _cpu_need(SETTINGS, JUDGED) == 9 * 16 * 64 * 4 + diskbudget.SLACK_BYTES
    more = check.check_settings({**SETTINGS, "seeds": [0, 1, 2]})
    assert check.scratch_estimate(TASK53, more, JUDGED) == need + 4 * 16 * 64 * 4
    assert check.scratch_estimate(tmp_path / "54_Data.py", settings, JUDGED) is None
    assert sizes == ["task53_small.py", "task53_small.py", "54_Data.py"]


def _checkout(tmp_path: Path) -> tuple[Path, Path]:
    level2 = tmp_path / "checkout" / "KernelBench" / "level2"
    level2.mkdir(parents=True)
    for name in ("53_Gemm.py", "54_Data.py", "60_Big.py"):
        (level2 / name).write_text(f"# {tmp_path}\n")  # a new file each test: not cached
    contract = tmp_path / "contract.json"
    contract.write_text(json.dumps(CONTRACT))
    return tmp_path / "checkout", contract


def test_a_check_jobs_scratch_resource_is_its_reservation_in_mib_within_the_budget(tmp_path, sizes):
    checkout, contract = _checkout(tmp_path)
    need = _cpu_need(SETTINGS, JUDGED)
    mb = -(-need // (1 << 20))
    assert mb == 513 and need > 512 << 20  # rounded up, not down
    assert check.scratch_mb(checkout, 2, 53, contract, SETTINGS) == mb
    assert check.scratch_mb(checkout, 2, 53, contract, SETTINGS, budget_mb=100) == 100
    assert check.scratch_mb(checkout, 2, 53, contract, SETTINGS, budget_mb=mb) == mb
    assert check.scratch_mb(checkout, 2, 53, contract, SETTINGS, budget_mb=10_000) == mb
    assert check.scratch_mb(checkout, 2, 54, contract, SETTINGS) == 0
    assert check.scratch_mb(checkout, 2, 54, contract, SETTINGS, budget_mb=100) == 0
    assert sizes == ["53_Gemm.py", "54_Data.py"]  # once per version of a file


def test_a_task_file_changed_since_is_sized_again(tmp_path, sizes):
    checkout, contract = _checkout(tmp_path)
    task = checkout / "KernelBench" / "level2" / "53_Gemm.py"
    check.scratch_mb(checkout, 2, 53, contract, SETTINGS)
    check.scratch_mb(checkout, 2, 53, contract, SETTINGS)
    os.utime(task, ns=(task.stat().st_atime_ns, task.stat().st_mtime_ns + 10**9))
    check.scratch_mb(checkout, 2, 53, contract, SETTINGS)
    assert sizes == ["53_Gemm.py", "53_Gemm.py"]


def test_a_check_jobs_scratch_resource_follows_the_settings_and_the_pinned_contract(
    tmp_path, sizes
):
    """A task of 4 MiB of output per case: each planned case counts (2 x 4 MiB)."""
    checkout, contract = _checkout(tmp_path)
    assert check.scratch_mb(checkout, 2, 60, contract, SETTINGS) == 512 + 4 * 9  # 4 cases
    more = {**SETTINGS, "official_trials": None, "seeds": [0, 1]}  # the pin's 5 trials, 2 seeds
    assert len(check.plan(check.check_settings(more), CONTRACT)) == 8
    assert check.scratch_mb(checkout, 2, 60, contract, more) == 512 + 4 * 17
    seeded = {**SETTINGS, "seed": 3}
    assert check.scratch_mb(checkout, 2, 60, contract, seeded) == 512 + 4 * 9
    with pytest.raises(KbfuseError, match=r"task 2/55: 0 files match"):
        check.scratch_mb(checkout, 2, 55, contract, SETTINGS)
    with pytest.raises(KbfuseError, match=r"check\.numerics is 'fast'"):
        check.scratch_mb(checkout, 2, 53, contract, {**SETTINGS, "numerics": "fast"})


class Reservations:
    """Stands in for diskbudget.reserve: records what the check asks for and holds a scratch
    folder, or refuses with `refuse` (a ScratchTooSmall)."""

    def __init__(self, tmp_path: Path, refuse=None):
        self.tmp_path, self.refuse, self.asked = tmp_path, refuse, []

    def __call__(self, need, roots, ledger_root, timeout_s, keep=False):
        self.asked.append(
            {"need": need, "roots": roots, "ledger": ledger_root, "wait_s": timeout_s, "keep": keep}
        )
        return self._held()

    @contextlib.contextmanager
    def _held(self):
        if self.refuse is not None:
            raise self.refuse
        folder = self.tmp_path / f"scratch{len(self.asked)}"
        folder.mkdir()
        info = {"estimated_bytes": self.asked[-1]["need"], "waited_s": 1.5, "filesystem": "ext4"}
        yield diskbudget.Held(folder, info)


def test_a_pinned_check_reserves_its_estimate_and_waits_four_time_limits(
    tmp_path, children, monkeypatch, sizes
):
    monkeypatch.setenv("KBFUSE_GPU_LOCK_DIR", str(tmp_path / "locks"))
    monkeypatch.setenv(diskbudget.ENV_ROOTS, f"{tmp_path / 'a'}:{tmp_path / 'b'}")
    for folder in ("a", "b", "locks"):
        (tmp_path / folder).mkdir()
    reservations = Reservations(tmp_path)
    monkeypatch.setattr(diskbudget, "reserve", reservations)
    fake = children(change=same)
    record = judge(tmp_path, {"time_limit_s": 12}, commit="c" * 40)
    (asked,) = reservations.asked
    assert asked == {
        "need": _cpu_need(SETTINGS, JUDGED),
        "roots": [tmp_path / "a", tmp_path / "b"],
        "ledger": tmp_path / "locks",
        "wait_s": 4 * 12,
        "keep": False,
    }
    assert fake.calls[0]["view"].folder == tmp_path / "scratch1" / "reference"
    assert (tmp_path / "scratch1").resolve() in fake.calls[1]["view"].hidden
    assert record["scratch"] == {
        "estimated_bytes": _cpu_need(SETTINGS, JUDGED), "waited_s": 1.5, "filesystem": "ext4",
    }  # fmt: skip
    assert record["phases_s"]["scratch_wait"] == 1.5
    assert list(record["phases_s"]) == ["scratch_wait", "reference", "candidate", "witness",
                                        "compare"]  # fmt: skip


def test_a_task_file_not_of_the_pin_reserves_nothing_and_kept_scratch_is_asked_for(
    tmp_path, children, monkeypatch
):
    reservations = Reservations(tmp_path)
    monkeypatch.setattr(diskbudget, "reserve", reservations)
    children(change=same)
    judge(tmp_path, keep_scratch=True)
    assert reservations.asked[0]["need"] is None and reservations.asked[0]["keep"] is True


def _too_small(free: int) -> diskbudget.ScratchTooSmall:
    return diskbudget.ScratchTooSmall("needs about 2.5 GB", 2_500_000_000, free)


def test_a_check_that_cannot_fit_raises_and_writes_nothing(tmp_path, children, monkeypatch, sizes):
    monkeypatch.setattr(diskbudget, "reserve", Reservations(tmp_path, _too_small(10**8)))
    fake = children(change=same)
    with pytest.raises(diskbudget.ScratchTooSmall, match=r"^needs about 2\.5 GB$"):
        judge(tmp_path, commit="c" * 40)
    assert fake.calls == [] and not (tmp_path / "out" / "mine.json").exists()


def test_an_audit_records_a_check_that_cannot_fit(tmp_path, children, monkeypatch, capsys, sizes):
    monkeypatch.setattr(diskbudget, "reserve", Reservations(tmp_path, _too_small(-5)))
    fake = children(change=same)
    record = judge(
        tmp_path, {"numerics": "strict"}, commit="c" * 40, record_refusal=True, keep_scratch=True
    )
    assert fake.calls == []
    assert record == {
        "kind": "check_refused",
        "schema_version": 1,
        "candidate": {"file": "mine.py", "sha256": check.sha256_file(tmp_path / "mine.py")},
        "task": {"level": 2, "task": 53, "file": "task53_small.py", "commit": "c" * 40},
        "numerics": "strict",
        "verdict": "not checked",
        "why": "needs 2.5 GB of scratch disk, 0.0 GB free here",
        "scratch": {"need_bytes": 2_500_000_000, "free_bytes": -5},
    }
    assert json.loads((tmp_path / "out" / "mine.json").read_text()) == record
    assert "scratch kept" not in capsys.readouterr().out


def test_a_refusal_record_names_the_sizes_and_is_validated(tmp_path):
    candidate = tmp_path / "c.py"
    candidate.write_text("x")
    settings = check.check_settings(None)
    record = check.refusal_record(
        candidate, 1, 9, TASK53, None, settings, _too_small(1_260_000_000)
    )
    assert record["why"] == "needs 2.5 GB of scratch disk, 1.3 GB free here"
    edge = diskbudget.ScratchTooSmall("", 1_050_000_000, 1_050_000_000)  # GB, not GiB or more
    record = check.refusal_record(candidate, 1, 9, TASK53, None, settings, edge)
    assert record["why"] == "needs 1.1 GB of scratch disk, 1.1 GB free here"
    assert record["numerics"] is None and record["task"]["commit"] is None
    with pytest.raises(KbfuseError, match=rf"^refusal record of {candidate}: "):
        check.refusal_record(candidate, 0, 9, TASK53, None, settings, _too_small(0))


# --------------------------------------------------------------------------- the bounded reads

NO_FOLLOW = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOFOLLOW


def _opens(monkeypatch) -> list[int]:
    """The flags of every os.open of the bounded reads."""
    flags, original = [], os.open

    def spy(path, how, *args, **kwargs):
        flags.append(how)
        return original(path, how, *args, **kwargs)

    monkeypatch.setattr(untrusted.os, "open", spy)
    return flags


def test_every_bounded_read_opens_without_blocking_following_or_leaking(tmp_path, monkeypatch):
    path = tmp_path / "f"
    path.write_bytes(b"0123")
    flags = _opens(monkeypatch)
    assert untrusted.read_bytes(path, 4) == b"0123"
    assert untrusted.read_head(path, 2) == b"01"
    assert untrusted.read_tail(path, 2) == b"23"
    assert untrusted.read_bytes(path, 4, follow=True) == b"0123"
    assert untrusted.read_head(path, 2, follow=True) == b"01"
    assert flags == [NO_FOLLOW] * 3 + [NO_FOLLOW & ~os.O_NOFOLLOW] * 2


def _unchecked(monkeypatch) -> None:
    """What is there changes after the check: regular_file saw an empty regular file."""
    empty = os.stat_result((0o100644,) + (0,) * 9)
    monkeypatch.setattr(untrusted, "regular_file", lambda path, follow=False: empty)


def test_a_link_swapped_in_after_the_check_is_not_opened(tmp_path, monkeypatch):
    target = tmp_path / "t"
    target.write_text("secret")
    link = tmp_path / "l"
    link.symlink_to(target)
    _unchecked(monkeypatch)
    for read in (untrusted.read_bytes, untrusted.read_head):
        with pytest.raises(
            KbfuseError, match=rf"^{link} cannot be read: Too many levels of symbolic links$"
        ):
            read(link, 100)


def test_a_fifo_swapped_in_after_the_check_is_refused_after_opening(tmp_path, monkeypatch):
    """Held open for writing here, so that even a blocking open would return (that the open
    never blocks is test_every_bounded_read_opens_without_blocking_following_or_leaking's)."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    _unchecked(monkeypatch)
    writer = os.open(fifo, os.O_RDWR | os.O_NONBLOCK)
    try:
        for read in (untrusted.read_bytes, untrusted.read_head):
            with pytest.raises(
                KbfuseError,
                match=rf"^{fifo} changed into a special file while it was read; not read$",
            ):
                read(fifo, 100)
    finally:
        os.close(writer)


def test_a_file_that_grows_while_it_is_read_is_refused_after_limit_plus_one_bytes(
    tmp_path, monkeypatch
):
    """Checked empty, 7 bytes by the time it is read, in reads of 2 bytes: 2 + 2 + 1 bytes are
    asked for, never more, and the fifth says it grew."""
    path = tmp_path / "f"
    path.write_bytes(b"1234567")
    monkeypatch.setattr(untrusted, "_CHUNK", 2)
    _unchecked(monkeypatch)  # it was empty when checked
    asked, original = [], os.read

    def read(fd, size):
        asked.append(size)
        return original(fd, size)

    monkeypatch.setattr(untrusted.os, "read", read)
    with pytest.raises(
        KbfuseError, match=rf"^{path} grew over the 4-byte limit while it was read; not read$"
    ):
        untrusted.read_bytes(path, 4)
    assert asked == [2, 2, 1]
    asked.clear()
    path.write_bytes(b"1234")
    assert untrusted.read_bytes(path, 4) == b"1234" and asked == [2, 2, 1]


def test_read_tail_opens_only_a_regular_file_and_never_follows(tmp_path, monkeypatch):
    target = tmp_path / "t"
    target.write_text("log")
    link = tmp_path / "l"
    link.symlink_to(target)
    _unchecked(monkeypatch)
    assert untrusted.read_tail(link, 10) == b""


def test_a_key_given_twice_is_named_by_its_first_80_characters():
    key = "k" * 100
    raw = json.dumps({"a": 1}).replace('"a"', f'"{key}": 1, "{key}"').encode()
    expected = f"j is not valid JSON: key {'k' * 80!r} is given twice in one object"
    with pytest.raises(KbfuseError, match=f"^{re.escape(expected)}$"):
        untrusted.parse_json(raw, "j", 1000)


def test_nesting_counts_every_branch_not_only_the_last():
    assert untrusted.too_deep([[[[]]], []], 3) is True
    assert untrusted.too_deep({"deep": [[[]]], "flat": 1, "last": []}, 3) is True
    assert untrusted.too_deep([[[]], []], 3) is False


# --------------------------------------------------------------------------- check_candidate


def test_a_verdict_name_too_long_is_quoted_to_300_characters(tmp_path, children):
    fake = children(change=same)
    long = tmp_path / ("v" * 250) / ("w" * 201 + ".json")
    assert len(str(long)) > 301
    expected = (
        f"verdict {str(long)[:300]!r}: its name is over 200 bytes, too long for its log and "
        "temporary files"
    )
    with pytest.raises(KbfuseError, match=f"^{re.escape(expected)}$"):
        check.check_candidate(
            TASK53, 2, 53, TASK53, long, CONTRACT, {**SETTINGS, "unsandboxed": True}
        )
    assert fake.calls == []


def test_a_verdict_that_breaks_its_schema_is_named_and_not_written(tmp_path, children, monkeypatch):
    original = evidence.assemble

    def broken(*args):
        return {**original(*args), "verdict": "maybe"}

    monkeypatch.setattr(evidence, "assemble", broken)
    children(change=same)
    with pytest.raises(KbfuseError, match=rf"^verdict of {tmp_path}/mine\.py: .*'maybe'"):
        judge(tmp_path)
    assert not (tmp_path / "out" / "mine.json").exists()


def test_on_a_gpu_with_a_lock_the_witness_measures_under_it(tmp_path, monkeypatch):
    """And the parent compares every case on the GPU (played on the CPU here)."""
    monkeypatch.setattr(evidence, "_environment", lambda device: {"torch": "x", "device": device})
    original, devices = evidence.compare.compare_case, []

    def compare_case(ref, cand, contract, device):
        devices.append(device)
        return original(ref, cand, contract)

    monkeypatch.setattr(evidence.compare, "compare_case", compare_case)
    lock = RecordingLock()
    held = []
    measured = [{"route": "load_inline", "flags": ["-O3"], "output": 0.0, "effective_ftz": False}]
    report = {**GOOD_REPORT, **BUILDS, "side_stream": None, "unfinished_on_caller_stream": None}
    fake = Children(change=same, report=report, witness=measured)

    def child(role, request_path, *args, **kwargs):
        request = json.loads(Path(request_path).read_text())
        handoff = args[-1] if len(args) == 6 else kwargs.get("handoff")
        held.append((role, bool(request.get("build_only")), lock.held, type(handoff).__name__))
        return fake(role, request_path, *args, **kwargs)

    monkeypatch.setattr(check, "run_child", child)
    candidate = tmp_path / "mine.py"
    candidate.write_text("# kbfuse-task: 2/53\n")
    settings = {**SETTINGS, "unsandboxed": True}
    record = check.check_candidate(
        candidate, 2, 53, TASK53, tmp_path / "v.json", CONTRACT, settings, device="cuda",
        lock=lock, commit="4e6d5c3b" * 5,
    )  # fmt: skip
    assert held == [
        ("reference", False, False, "Turns"),  # its holds are its turns'
        ("candidate", False, False, "Handoff"),  # its hold is its Handoff's
        ("witness", True, False, "NoneType"),  # kbfuse's own build: outside the lock
        ("witness", False, True, "NoneType"),
    ]
    assert record["contract"]["witness"] == measured
    assert len(devices) == 5 and set(devices) == {"cuda"}


# --------------------------------------------------------------------------- readback


class NotATensor:
    """A class torch.load(weights_only=True) must refuse to build from a pickle."""


def test_only_tensors_are_loaded_even_where_torch_is_told_to_load_anything(tmp_path, monkeypatch):
    """TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD turns off torch's default, not an explicit
    weights_only=True."""
    import torch

    monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")
    folder = tmp_path / "child"
    folder.mkdir()
    torch.save(NotATensor(), folder / "evil.pt")
    with pytest.raises(KbfuseError, match=r"evil\.pt cannot be loaded: UnpicklingError: Weights"):
        readback.load_tensors(folder / "evil.pt", folder, 10_000)


def test_tensors_are_loaded_onto_the_cpu_with_weights_only(tmp_path, monkeypatch):
    import torch

    folder = tmp_path / "child"
    folder.mkdir()
    torch.save(torch.ones(2), folder / "t.pt")
    asked, original = [], torch.load

    def load(file, **kwargs):
        asked.append((os.stat(file).st_ino, kwargs))
        return original(file, **kwargs)

    monkeypatch.setattr(torch, "load", load)
    assert torch.equal(readback.load_tensors(folder / "t.pt", folder, 10_000), torch.ones(2))
    # the checked file itself (through its descriptor), mapped
    inode = (folder / "t.pt").stat().st_ino
    assert asked == [(inode, {"mmap": True, "weights_only": True, "map_location": "cpu"})]


@pytest.mark.parametrize(
    "message, named",
    [("", ""), ("   \n", ""), ("x" * 300 + "\nsecond", "x" * 200), ("first\nsecond", "first")],
)
def test_a_tensor_file_torch_cannot_load_is_named_by_the_first_line_of_why(
    tmp_path, monkeypatch, message, named
):
    import torch

    folder = tmp_path / "child"
    folder.mkdir()
    torch.save(torch.ones(2), folder / "t.pt")

    def load(file, **kwargs):
        raise RuntimeError(message)

    monkeypatch.setattr(torch, "load", load)
    expected = f"{folder / 't.pt'} cannot be loaded: RuntimeError: {named}"
    with pytest.raises(KbfuseError, match=f"^{re.escape(expected)}$"):
        readback.load_tensors(folder / "t.pt", folder, 10_000)


def _method_deflate(raw: bytes) -> bytes:
    """A stored archive whose headers say its members are deflated (method 8): the sizes
    still agree, the method alone is wrong."""
    out = bytearray(raw)
    for signature, offset in ((b"PK\x03\x04", 8), (b"PK\x01\x02", 10)):
        at = out.find(signature)
        while at != -1:
            out[at + offset : at + offset + 2] = (8).to_bytes(2, "little")
            at = out.find(signature, at + 4)
    return bytes(out)


def test_a_member_declared_deflated_is_refused_even_at_its_stored_size():
    import io
    import zipfile

    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED) as archive:
        archive.writestr("a/data/0", b"\1" * 100)
    raw = _method_deflate(buffer.getvalue())
    (member,) = zipfile.ZipFile(io.BytesIO(raw)).infolist()
    assert member.compress_type == zipfile.ZIP_DEFLATED and member.compress_size == 100
    with pytest.raises(KbfuseError, match=r"^t: member 'a/data/0' is compressed \(100 bytes"):
        readback.check_archive(raw, "t", 10_000)
