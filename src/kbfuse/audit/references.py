"""The reference an entry's claims were made against, beside the pinned KernelBench task file.

A corpus may carry the task code its claims were measured with (CUDA-L1's `ref_code`). The
check judges against the pinned task file (or, with `audit.references: corpus`, against the
entry's own); either way the summary says how the two compare, one of REFERENCE_STATUSES, so a
claim made against other shapes or inputs is visible beside it. The comparison is of bytes,
then of the text with whitespace runs made one space (kbfuse.audit.materialise.sha256_words).
"""

from __future__ import annotations

from pathlib import Path

from kbfuse import io
from kbfuse.audit.materialise import sha256_words
from kbfuse.errors import KbfuseError

SAME, SAME_WORDS, DIFFERS = "same", "same except whitespace", "differs"
NONE_GIVEN, NO_PINNED = "none given", "not compared"
REFERENCE_STATUSES = (SAME, SAME_WORDS, DIFFERS, NONE_GIVEN, NO_PINNED)
TASK_BYTES = 16 << 20


def pinned_digests(checkout: str | Path | None, level: int, task: int) -> dict | None:
    """{sha256, sha256_words} of the pinned task file, None without a checkout or the file."""
    from kbfuse.candidates.check import find_task_file

    if checkout is None:
        return None
    try:
        path = find_task_file(checkout, level, task)
    except KbfuseError:
        return None
    text = path.read_bytes()[:TASK_BYTES].decode("utf-8", errors="replace")
    return {"sha256": io.sha256_file(path), "sha256_words": sha256_words(text)}


def reference_status(reference: dict | None, pinned: dict | None) -> str:
    """How an entry's reference digests compare with the pinned file's (REFERENCE_STATUSES)."""
    if reference is None:
        return NONE_GIVEN
    if pinned is None:
        return NO_PINNED
    if reference["sha256"] == pinned["sha256"]:
        return SAME
    if reference["sha256_words"] == pinned["sha256_words"]:
        return SAME_WORDS
    return DIFFERS
