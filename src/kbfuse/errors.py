"""The one exception type for bad input (config, pin, kernel source, bundle)."""


class KbfuseError(ValueError):
    """Bad input, named in the message. Raised before expensive work starts."""
