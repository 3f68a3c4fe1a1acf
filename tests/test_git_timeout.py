"""Issue 12: an unreachable KernelBench remote costs a bounded wait, with the URL in the message.

The remote here is a TCP socket on 127.0.0.1 that accepts connections and never answers, as a
firewalled or hung server would; git waits on it forever unless kbfuse stops it. Over http, git
reads through a helper process (git-remote-http) that killing git alone would leave running, so
the test also proves that no process of the call is left.
"""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

import pytest

from kbfuse.errors import KbfuseError
from kbfuse.tasks.kernelbench import GIT_TIMEOUT_ENV, GIT_TIMEOUT_S, git_timeout_s, pin_kernelbench

COMMIT = "0123456789abcdef0123456789abcdef01234567"
TIMEOUT_S = 1.5
# The server hangs up after this long anyway, so that a regression fails instead of hanging.
SERVER_LIFE_S = TIMEOUT_S + 10


@pytest.fixture
def silent_server():
    """(host, port) of a server that accepts and never answers (for SERVER_LIFE_S at most)."""
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.2)
    held: list[socket.socket] = []
    stop = threading.Event()
    deadline = time.monotonic() + SERVER_LIFE_S

    def accept_forever():
        while not stop.is_set() and time.monotonic() < deadline:
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            held.append(conn)
        for conn in held:
            conn.close()

    thread = threading.Thread(target=accept_forever, daemon=True)
    thread.start()
    yield server.getsockname()
    stop.set()
    thread.join(timeout=5)
    server.close()


def processes_naming(text: str) -> list[str]:
    """Command lines of the running processes that contain `text` (Linux /proc)."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            argv = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:  # the process ended meanwhile
            continue
        if text in argv:
            found.append(argv)
    return found


@pytest.mark.parametrize("scheme", ["git", "http"])
def test_a_silent_remote_fails_after_the_timeout_naming_the_url(
    tmp_path, monkeypatch, silent_server, scheme
):
    host, port = silent_server
    url = f"{scheme}://{host}:{port}/KernelBench.git"
    monkeypatch.setenv(GIT_TIMEOUT_ENV, str(TIMEOUT_S))
    checkout, pin = tmp_path / "checkout", tmp_path / "pin.json"
    t0 = time.monotonic()
    with pytest.raises(KbfuseError, match="did not answer") as err:
        pin_kernelbench(url, COMMIT, 2, [53], checkout, pin, log=tmp_path / "pin.log")
    elapsed = time.monotonic() - t0
    assert TIMEOUT_S <= elapsed < SERVER_LIFE_S
    message = str(err.value)
    assert f"kernelbench.url {url!r}" in message
    assert f"git ls-remote timed out after {TIMEOUT_S:g} s" in message
    assert f"{GIT_TIMEOUT_ENV}=<seconds>" in message
    assert not checkout.exists() and not pin.exists()
    assert processes_naming(f"{host}:{port}") == []
    assert f"timed out after {TIMEOUT_S:g} s" in (tmp_path / "pin.log").read_text()


def test_the_timeout_defaults_to_a_minute(monkeypatch):
    monkeypatch.delenv(GIT_TIMEOUT_ENV, raising=False)
    assert git_timeout_s() == GIT_TIMEOUT_S == 60.0
    monkeypatch.setenv(GIT_TIMEOUT_ENV, " ")
    assert git_timeout_s() == 60.0
    monkeypatch.setenv(GIT_TIMEOUT_ENV, "300")
    assert git_timeout_s() == 300.0


@pytest.mark.parametrize("raw", ["soon", "0", "-5", "nan", "inf", "1e999"])
def test_a_bad_timeout_is_refused_before_any_git_call(tmp_path, monkeypatch, raw):
    monkeypatch.setenv(GIT_TIMEOUT_ENV, raw)
    checkout = tmp_path / "checkout"
    with pytest.raises(KbfuseError, match=rf"^{GIT_TIMEOUT_ENV}='{raw}' must be a positive"):
        pin_kernelbench("https://example.invalid/kb", COMMIT, 2, [53], checkout, tmp_path / "p")
    assert not checkout.exists()
