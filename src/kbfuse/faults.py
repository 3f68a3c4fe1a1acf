"""Named pause points for interruption tests.

Set KBFUSE_PAUSE_AT to a glob over "<point>:<detail>" (e.g. "write:*meta.json",
"clone:*") and KBFUSE_PAUSE_MARKER to a file path: the process that reaches a matching
point creates the marker and sleeps until it is killed. Tests use this to SIGKILL a run at
an exact place (mid-clone, mid-compile, mid-write, between jobs, mid-summary) and check
that the rerun completes with the same results. Without the variable a checkpoint is a no-op.
"""

from __future__ import annotations

import fnmatch
import os
import time
from pathlib import Path


def checkpoint(point: str, detail: str = "") -> None:
    pattern = os.environ.get("KBFUSE_PAUSE_AT")
    if not pattern or not fnmatch.fnmatchcase(f"{point}:{detail}", pattern):
        return
    marker = os.environ.get("KBFUSE_PAUSE_MARKER")
    if marker:
        Path(marker).write_text(f"{point}:{detail} pid {os.getpid()}\n")
    while True:  # until the test kills us
        time.sleep(1)
