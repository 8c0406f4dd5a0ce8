"""The one exception type for mistakes a user can fix.

Entry points print a `TinyGPTError` as a single line and exit with status 2; anything else is a
bug and keeps its traceback. Messages say what is wrong *and* how to fix it.
"""


class TinyGPTError(Exception):
    """A user-facing error: bad config, missing file, unreachable data, and so on."""


class RunRefused(TinyGPTError):
    """A training run refused while it was being set up, before it changed anything."""
