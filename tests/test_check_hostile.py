"""Hostile candidates against `kbfuse check` (docs/check.md, "Isolation"), each as an attacker
tried it against kbfuse before the sandbox: a wrong kernel that reaches the reference's
outputs or forges its report, and files left for the checker that would exhaust it. Each test
asserts the verdict, the exit status of `kbfuse check` and the checker's own peak memory."""

from __future__ import annotations

import re

from hostile import CHECKER_MB, run_checker


def test_a_wrong_kernel_cannot_copy_the_reference_outputs_over_its_own(tmp_path):
    checked = run_checker(tmp_path, "copy_reference")
    record = checked.verdict
    assert checked.rc == 1 and record["verdict"] == "fail"
    assert record["failed_checks"][0] == "official"
    assert not any(c["bit_identical"] for c in record["correctness"]["cases"].values())
    assert "attack: reference outputs visible: False" in checked.log().read_text()
    assert record["sandbox"]["used"] == "bwrap" and "unsandboxed" not in record["findings"]
    assert checked.max_rss_mb < CHECKER_MB


def test_without_the_sandbox_that_copy_passes_and_the_verdict_says_unsandboxed(tmp_path):
    """The control: the attack is real, and only the sandbox stops it."""
    checked = run_checker(tmp_path, "copy_reference", "--unsandboxed")
    record = checked.verdict
    assert "attack: reference outputs visible: True" in checked.log().read_text()
    assert checked.rc == 0 and record["verdict"] == "pass"
    assert record["sandbox"] == {"used": "none", "version": None}
    assert record["settings"]["unsandboxed"] is True
    assert record["processes"]["candidate"]["sandbox"] == "none"
    assert "unsandboxed" in record["findings"]


def test_outputs_linked_to_the_reference_are_not_followed(tmp_path):
    checked = run_checker(tmp_path, "link_reference")
    record = checked.verdict
    assert checked.rc == 1 and record["verdict"] == "fail"
    problem = record["correctness"]["cases"]["official_0"]["problem"]
    assert problem.startswith("output not read: ") and "is a symbolic link" in problem
    assert record["checks"]["official"]["status"] == "fail"
    assert checked.max_rss_mb < CHECKER_MB


def test_a_forged_report_does_not_choose_the_cases_compared(tmp_path):
    checked = run_checker(tmp_path, "forged_report")
    record = checked.verdict
    assert checked.rc == 1 and record["verdict"] == "fail"
    cases = record["correctness"]["cases"]
    assert sorted(cases) == [
        "after_timing", "official_0", "official_1", "uniform_s0", "weights",
    ]  # fmt: skip
    assert cases["official_0"]["official_pass"] and cases["official_1"]["official_pass"]
    for name in ("weights", "uniform_s0", "after_timing"):
        assert cases[name] == {"numel": 16 * 64, "problem": "no output", "official_pass": False}
    assert record["failed_checks"] == ["changed_weights", "distributions", "output_after_timing"]
    # its timing is in the record as it reported it, and named self-reported
    assert {"timing", "speedup"} <= set(record["self_reported"]["fields"])
    assert record["speedup"]["wall"]["over_eager"]["median"] > 100
    assert checked.max_rss_mb < CHECKER_MB


def test_a_report_and_an_output_linked_to_dev_zero_are_refused_unread(tmp_path):
    checked = run_checker(tmp_path, "dev_zero")
    record = checked.verdict
    assert checked.rc == 1 and record["verdict"] == "fail"
    assert record["report_problem"].endswith(
        "runner.json is a symbolic link, not a regular file; not read"
    )
    assert record["checks"]["build"]["detail"].startswith("no usable report from its process: ")
    assert "is a symbolic link" in record["correctness"]["cases"]["official_0"]["problem"]
    assert record["failed_checks"][:2] == ["build", "official"]
    assert checked.max_rss_mb < CHECKER_MB


def test_a_deflated_tensor_archive_is_refused_before_torch_load(tmp_path):
    checked = run_checker(tmp_path, "deflate_bomb")
    record = checked.verdict
    assert checked.rc == 1 and record["verdict"] == "fail"
    problem = record["correctness"]["cases"]["official_0"]["problem"]
    assert re.search(r": member '\S+' is compressed \(\d+ bytes declared\); torch\.save", problem)
    assert record["failed_checks"] == ["official"]
    assert checked.max_rss_mb < CHECKER_MB  # 256 MiB more had it been loaded


def test_a_2_gib_log_is_quoted_from_its_end_only(tmp_path):
    checked = run_checker(tmp_path, "huge_log")
    record = checked.verdict
    assert checked.log().stat().st_size > 2 << 30
    assert checked.rc == 0 and record["verdict"] == "pass"  # a long log is no failure
    tail = record["processes"]["candidate"]["log_tail"]
    assert len(tail) <= 4000 and "kbfuse check: stage timing" in tail
    assert checked.max_rss_mb < CHECKER_MB


def test_a_fifo_output_is_refused_and_the_reference_is_out_of_reach(tmp_path):
    checked = run_checker(tmp_path, "fifo_output", timeout=120)
    record = checked.verdict
    assert checked.rc == 1 and record["verdict"] == "fail"
    assert (
        "is a FIFO, not a regular file" in record["correctness"]["cases"]["official_0"]["problem"]
    )
    assert "attack: the reference's output is out of reach" in checked.log().read_text()
    assert checked.max_rss_mb < CHECKER_MB
