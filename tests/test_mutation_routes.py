"""Tests written for mutants of routes.py that survived the run of docs/mutation.md: the
refusals of option_problems word for word (a non-ASCII option, a value with a shell
character), every option after a refused one still checked, and integer options accepted.
"""

from __future__ import annotations

from kbfuse import routes


def test_a_printable_non_ascii_option_is_refused_as_such():
    assert routes.option_problems("nvrtc-cubin", ["-DX=caf\u00e9"]) == [
        "route nvrtc-cubin: option '-DX=café' is refused: it contains a non-ASCII or control "
        "character"
    ]


def test_a_shell_character_in_a_value_is_refused_naming_the_pattern():
    assert routes.option_problems("nvcc-cubin", ["-DX=$(id)"]) == [
        "route nvcc-cubin: option '-DX=$(id)' is refused: --define-macro values must match "
        f"{routes.MACRO_DEFINITION} (no shell characters, paths or commas)"
    ]


def test_the_options_after_a_refused_one_are_still_checked():
    assert routes.option_problems("nvrtc-ptx", ["-I/usr/include", "--ftz=maybe", "-pch"]) == [
        f"route nvrtc-ptx: option '-I/usr/include' is refused: it {routes._READS_HEADERS}",
        "route nvrtc-ptx: option '--ftz=maybe': --ftz expects true or false, not 'maybe'",
        f"route nvrtc-ptx: option '-pch' is refused: it {routes._PCH}",
    ]


def test_integer_options_take_digits():
    parsed, reason = routes.parse_option("--maxrregcount=32")
    assert reason is None
    assert (parsed.spec.name, parsed.value) == ("maxrregcount", "32")
    assert routes.option_problems("nvcc-cubin", ["--maxrregcount=32", "-split-compile=0"]) == []
