"""Settings as command-line overrides: quoting a value so that Hydra's override grammar reads it
back as itself (a path with spaces, quotes or backslashes). Used by the commands that launch
other commands (a scaling study's jobs) and by the train command's pinned run directory."""

from __future__ import annotations

import re


def override_value(text: str) -> str:
    """`text` quoted as a Hydra override value (single quotes; a quote, and backslashes before a
    quote or at the end, escaped), so any path reads back as itself."""
    escaped = re.sub(r"(\\*)'", lambda m: m.group(1) * 2 + "\\'", text)
    escaped = re.sub(r"(\\+)$", lambda m: m.group(1) * 2, escaped)
    return f"'{escaped}'"
