"""Hostile candidates that try to get out of `kbfuse check`'s sandbox (docs/check.md,
"Isolation"): kill the checker, outlive the check to rewrite the verdict or to hold the GPU
lock, fill /dev/shm, and a probe of what the sandbox lets a candidate see. Each test asserts
the verdict, the exit status of `kbfuse check` and the checker's own peak memory."""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time

from hostile import CHECKER_MB, processes_with, run_checker


def test_a_candidate_cannot_kill_its_checker_and_dies_at_its_memory_limit(tmp_path):
    checked = run_checker(tmp_path, "kill_checker", settings={"memory_limit_mb": 512})
    record = checked.verdict
    assert checked.rc == 1 and record["verdict"] == "fail"  # the checker lived to write it
    assert record["failed_checks"] == ["memory_limit"]
    assert 512 < record["processes"]["candidate"]["peak_rss_mb"] < 512 + 1024
    assert "attack: killed" not in checked.log().read_text()
    assert checked.max_rss_mb < CHECKER_MB


def test_a_setsid_survivor_cannot_rewrite_the_verdict(tmp_path):
    out = tmp_path / "verdicts" / "setsid_survivor.json"
    checked = run_checker(tmp_path, "setsid_survivor", env={"KBFUSE_ATTACK_TARGET": str(out)})
    record = checked.verdict
    assert checked.rc == 1 and record["verdict"] == "fail"
    assert processes_with("kbfuse-attack-survivor") == []
    time.sleep(2.5)  # the survivor would have rewritten it a second after the check
    assert json.loads(out.read_text()) == record
    assert "attack: verdict rewritten" not in checked.log().read_text()
    assert checked.max_rss_mb < CHECKER_MB


def test_a_leftover_process_cannot_hold_the_gpu_lock(tmp_path):
    locks = tmp_path / "locks"
    locks.mkdir()
    lock_file = locks / "kbfuse-gpu-cpu-hostile.lock"
    checked = run_checker(
        tmp_path, "lock_holder", env={"KBFUSE_ATTACK_TARGET": str(lock_file)}, lock_dir=locks
    )
    assert checked.rc == 0 and checked.verdict["verdict"] == "pass"
    assert "attack: holding the GPU lock" not in checked.log().read_text()
    assert processes_with("kbfuse-attack-holder") == []
    with open(lock_file, "a") as handle:  # free at once: nobody holds it in any way
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    assert checked.max_rss_mb < CHECKER_MB


def test_dev_shm_is_private_and_capped(tmp_path):
    before = set(os.listdir("/dev/shm"))
    checked = run_checker(tmp_path, "shm_hog", settings={"memory_limit_mb": 512})
    record = checked.verdict
    assert checked.rc == 1 and record["verdict"] == "fail"
    assert record["failed_checks"] == ["build"]
    detail = record["checks"]["build"]["detail"]
    assert detail.startswith("OSError: /dev/shm refused after ")
    assert int(detail.split("after ")[1].split()[0]) <= 256  # MiB: bwrap.TMPFS_BYTES
    assert detail.endswith("No space left on device")
    assert not [n for n in set(os.listdir("/dev/shm")) - before if n.startswith("kbfuse-attack")]
    assert checked.max_rss_mb < CHECKER_MB


def test_what_a_candidate_sees_in_the_sandbox(tmp_path):
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    try:
        checked = run_checker(
            tmp_path,
            "sandbox_probe",
            env={
                "KBFUSE_ATTACK_TARGET": str(tmp_path),
                "KBFUSE_ATTACK_PORT": str(port),
                "SECRET_TOKEN": "not for candidates",
            },
        )
    finally:
        listener.close()
    record = checked.verdict
    assert checked.rc == 1 and record["failed_checks"] == ["build"]
    message = record["failure"]["message"]
    facts = dict(part.split("=", 1) for part in message.split()[1:])
    assert int(facts["processes"]) <= 3  # its own and bwrap's init: no other process seen
    assert facts["sibling_reference"] == "False"  # the reference's folder
    assert facts["target_visible"] == "False"  # the test's folder: the verdict's
    assert facts["write_root"] == facts["write_usr"] == "False"
    assert facts["network"] == "False"  # the host's loopback is not its loopback
    assert facts["home"].endswith("/candidate/home")
    assert facts["secret"] == "-"  # the environment is cut down to what builds need
    assert checked.max_rss_mb < CHECKER_MB
