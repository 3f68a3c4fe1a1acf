"""The one exception type for bad input (config, pin, kernel source, bundle)."""

import re


class KbfuseError(ValueError):
    """Bad input, named in the message. Raised before expensive work starts."""


def matching(value: object, pattern: re.Pattern, problem: str) -> str:
    """`value` when it is a string that `pattern` matches whole, else KbfuseError(problem)."""
    if not isinstance(value, str) or not pattern.fullmatch(value):
        raise KbfuseError(problem)
    return value
