"""Settings as command-line overrides: quoting a value so that Hydra's override grammar reads it
back as itself (a path with spaces, quotes or backslashes), used by the commands that launch
other commands (a scaling study's jobs) and by the train command's pinned run directory; and
which model settings a command line gives, so that a run that keeps another model's settings
(a resume, a finetune) names only those it ignores."""

from __future__ import annotations

import re


def override_value(text: str) -> str:
    """`text` quoted as a Hydra override value (single quotes; a quote, and backslashes before a
    quote or at the end, escaped), so any path reads back as itself."""
    escaped = re.sub(r"(\\*)'", lambda m: m.group(1) * 2 + "\\'", text)
    escaped = re.sub(r"(\\+)$", lambda m: m.group(1) * 2, escaped)
    return f"'{escaped}'"


def model_settings_given(overrides: list[str]) -> set[str]:
    """The names of the model settings `overrides` give: `model.n_layer=8` gives n_layer; a preset
    (`model=gpt-mini`) gives every one ("*")."""
    given = set()
    for override in overrides:
        key = override.lstrip("+~").split("=", 1)[0]
        if key == "model" or key.startswith("model/"):
            given.add("*")
        elif key.startswith("model."):
            given.add(key[len("model.") :])
    return given
