"""The checks every settings class shares: field types (what Hydra checks for composed configs,
here also for settings built in Python), lower bounds, the `threads=` value, building settings
from plain data (a checkpoint's record), and how two records differ. No torch, no Hydra."""

from __future__ import annotations

import typing
from dataclasses import fields
from typing import Any, TypeVar

from gpt.errors import TinyGPTError

NAMES = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}
T = TypeVar("T")
MISSING = "???"  # OmegaConf's mark for a value that must be given (Hydra reports it when absent)


def key_of(section: str, name: str) -> str:
    return f"{section}.{name}" if section else name


def check_types(obj, section: str) -> None:
    """Check (and, int -> float, coerce) every field of a settings dataclass against its type.
    Hydra has already done this for composed configs; this covers settings built in Python."""
    hints = typing.get_type_hints(type(obj))
    for f in fields(obj):
        value, hint = getattr(obj, f.name), hints[f.name]
        if typing.get_origin(hint) is list:  # list[str]: a list of such items
            (item,) = typing.get_args(hint)
            if not isinstance(value, (list, tuple)) or not all(isinstance(v, item) for v in value):
                raise TinyGPTError(f"{key_of(section, f.name)} must be {expected_type(type(obj), f.name)}; got {value!r}")
            continue
        allowed = typing.get_args(hint) or (hint,)  # `int | None` -> (int, NoneType)
        if hint is Any or any(t not in NAMES and t is not type(None) for t in allowed):
            continue  # free-form, or a nested settings class (checked by its own __post_init__)
        if value == MISSING:
            raise TinyGPTError(f"{key_of(section, f.name)} is required; set it, e.g. {key_of(section, f.name)}=...")
        if value is None and type(None) in allowed:
            continue
        if float in allowed and isinstance(value, int) and not isinstance(value, bool):
            try:
                setattr(obj, f.name, float(value))
            except OverflowError:  # an integer of 400 digits is no float
                raise TinyGPTError(
                    f"{key_of(section, f.name)} is too large for a number (an integer of {len(str(value))} digits)"
                ) from None
            continue
        # bool is a subclass of int; `n_layer=true` is a mistake, not 1.
        if not any(isinstance(value, t) and not (t is int and isinstance(value, bool)) for t in allowed if t is not type(None)):
            raise TinyGPTError(f"{key_of(section, f.name)} must be {expected_type(type(obj), f.name)}, got {value!r}")


def expected_type(cls, name: str) -> str | None:
    """'an integer', 'a number or null', ...: what field `name` of settings class `cls` takes."""
    hints = typing.get_type_hints(cls) if hasattr(cls, "__dataclass_fields__") else {}
    if name not in hints:
        return None
    if typing.get_origin(hints[name]) is list:
        return f"a list of {NAMES[typing.get_args(hints[name])[0]].split(' ', 1)[1]}s, e.g. [a, b]"  # "a string" -> strings
    allowed = typing.get_args(hints[name]) or (hints[name],)
    names = [NAMES.get(t, "null" if t is type(None) else None) for t in allowed]
    return " or ".join(names) if all(names) else None


def check_threads(value: Any) -> int | str | None:
    """`threads=`: a positive count, null (the rule of gpt.runtime.threads) or auto (follow the load). An
    `Any` field: Hydra's structured configs have no int-or-string type."""
    if isinstance(value, str) and value.strip().lower() == "auto":
        return "auto"
    if value is None or (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
        return value
    raise TinyGPTError(
        f"threads must be a positive integer, null (OMP_NUM_THREADS, else the cores) or auto (follow the load), got {value!r}"
    )


def at_least(obj, section: str, minimum: int, names: tuple[str, ...], hint: str = "") -> None:
    for name in names:
        value = getattr(obj, name)
        if value is not None and value < minimum:
            what = "a positive integer" if minimum == 1 else f">= {minimum}"
            raise TinyGPTError(f"{key_of(section, name)} must be {what}{hint}, got {value!r}")


def from_dict(cls: type[T], values: dict, section: str = "", ignored: list[str] | None = None) -> T:
    """A settings dataclass from plain data (a checkpoint's record, a notebook's dict): nested
    sections are built alike, the checks of each class run. Unknown keys are refused, or, given
    an `ignored` list (a record written by another tinygpt version), left out and named there."""
    hints = typing.get_type_hints(cls)
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(values) - known)
    if unknown and ignored is None:
        raise TinyGPTError(
            f"unknown setting(s) {', '.join(key_of(section, k) for k in unknown)}; known: {', '.join(sorted(known))}"
        )
    built = {}
    for name, value in values.items():
        if name not in known:
            ignored.append(key_of(section, name))
            continue
        nested = [t for t in (typing.get_args(hints[name]) or (hints[name],)) if hasattr(t, "__dataclass_fields__")]
        built[name] = from_dict(nested[0], value, key_of(section, name), ignored) if nested and isinstance(value, dict) else value
    return cls(**built)


def changed_settings(old: dict, new: dict, prefix: str = "") -> str:
    """'a.b: 1 -> 2, ...' for the leaves that differ (paths and run bookkeeping excluded)."""
    out = []
    for key in sorted(set(old) | set(new)):
        if (prefix == "" and key in ("paths", "resume")) or key not in old:
            continue  # bookkeeping, or a setting older checkpoints did not record
        a, b = old.get(key), new.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            sub = changed_settings(a, b, f"{prefix}{key}.")
            if sub:
                out.append(sub)
        elif a != b:
            out.append(f"{prefix}{key}: {a!r} -> {b!r}")
    return ", ".join(out)
