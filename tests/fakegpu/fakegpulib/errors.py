"""The one error type the commands report to the user (exit 2, nothing changed)."""


class UsageError(Exception):
    """Bad input: the message names the bad value."""
