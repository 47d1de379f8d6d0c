"""fastpath's exception root (C errors are turned into these at the Cython boundary)."""


class FastpathError(Exception):
    """fastpath cannot start or run; the message is one line that names the problem."""


class ConfigurationError(FastpathError):
    """A flag or argument is invalid (the CLI exits with status 2)."""
