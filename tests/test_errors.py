"""kbfuse.errors.matching: the one check of a string against a pattern that the arch and the
comparison labels use."""

from __future__ import annotations

import re

import pytest

from kbfuse.compilation.compile import resolve_arch
from kbfuse.errors import KbfuseError, matching
from kbfuse.results.compare import check_label


def test_matching_wants_the_whole_string():
    pattern = re.compile(r"^sm_\d+$")
    assert matching("sm_90", pattern, "no") == "sm_90"
    for bad in ("sm_90\n", "xsm_90", 90, None):  # `$` alone would let the newline through
        with pytest.raises(KbfuseError, match="^no$"):
            matching(bad, pattern, "no")


def test_arch_and_labels_are_checked_whole():
    assert resolve_arch("sm_90") == "sm_90"
    with pytest.raises(KbfuseError, match=r"arch 'sm_90\\n' is neither 'auto' nor"):
        resolve_arch("sm_90\n")
    assert check_label("H200 (driver 580)") == "H200 (driver 580)"
    with pytest.raises(KbfuseError, match=r"label 'H200\\n' is not usable"):
        check_label("H200\n")
