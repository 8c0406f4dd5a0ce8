"""What every command shares: where the configs are, composing them into settings with a
one-line error for any mistake, and running a command so that a user's mistake ends in
`error: <what is wrong and how to fix it>` (exit status 2) instead of a traceback.
"""

from __future__ import annotations

import errno
import functools
import logging
import os
import sys
from collections.abc import Callable
from dataclasses import fields
from pathlib import Path
from typing import NoReturn, TypeVar

from hydra.errors import CompactHydraException

from gpt.config import MuonSettings, expected_type, register_schemas
from gpt.config.model import other_kinds_setting
from gpt.errors import TinyGPTError, one_line
from gpt.runtime import alarm
from gpt.runtime.preemption import Preempted

T = TypeVar("T")


class JobFailed(CompactHydraException):
    """A trial of a search failed for a user-level reason (its settings, its data, a diverged
    run); its summary.json says why. Raised to sweepers that draw trials (Optuna), which count
    it as a failed trial (their max_failure_rate applies) and go on."""


def config_dir() -> Path:
    """configs/ inside the installed package (a wheel), or beside the package (a checkout)."""
    package = Path(__file__).resolve().parent.parent
    for candidate in (package / "configs", package.parent / "configs"):
        if (candidate / "config.yaml").is_file():
            return candidate
    fail(f"tinygpt's configs are missing (looked in {package / 'configs'} and {package.parent / 'configs'}); reinstall tinygpt")


def fail(message: str) -> NoReturn:
    print(f"error: {message}", file=sys.stderr)
    alarm.announce(message)  # a distributed run's other processes stop too, instead of waiting for this one
    sys.exit(2)


def guard(fn: Callable[[], T]) -> T:
    """Run fn; a TinyGPTError becomes `error: <message>` on stderr and exit status 2."""
    try:
        return fn()
    except TinyGPTError as e:
        logs = _log_to_files(f"error: {e}")
        fail(str(e) + (f" (logged in {logs[0]})" if logs else ""))
    except Preempted:  # checkpoint saved and resume command printed: a clean exit
        sys.exit(0)
    except KeyboardInterrupt:  # a second Ctrl-C: stop now, without a traceback
        print("interrupted", file=sys.stderr)
        alarm.announce("it was interrupted")
        sys.exit(130)
    except RuntimeError as e:
        if not _left_alone(e):
            alarm.announce(one_line(e))
            raise
        told = alarm.news(wait_s=alarm.GRACE_S)  # the other process's own reason (gpt.runtime.alarm)
        if told is not None:
            fail(f"process {rank()} of {world_size()} stops because {told}")
        line = (str(e).strip().splitlines() or [""])[0]
        reason = (line.split("] ", 1)[-1] if line.startswith("[") else line).split(". ")[0]  # gloo's source path, advice
        fail(
            f"process {rank()} of {world_size()} stopped because another process of this run exited ({reason}): "
            f"its error line, or its exit status in the launcher's summary, says why"
        )
    except OSError as e:
        if e.errno not in (errno.ENOSPC, errno.EDQUOT):  # not the user's disk: a bug, with its traceback
            alarm.announce(one_line(e))
            raise
        # Everything a later run reads is written atomically (gpt.runtime.io): what was written before stays whole.
        where = Path(e.filename).parent if e.filename else "the output folder"
        fail(
            f"cannot write into {where} ({e.strerror}); what was written before is intact: free space, then run the command again"
        )
    except Exception as e:  # a bug: its traceback follows, and the other processes stop too
        alarm.announce(one_line(e))
        raise


def _left_alone(error: RuntimeError) -> bool:
    """Whether a collective failed because another process of a distributed run has exited (it
    met a user's mistake first and said so in one line): this one's traceback would bury that
    line under fifty of torch's. Told by gloo's words for a gone peer (gpt.runtime.alarm.PEER_GONE)
    in a run of several processes: wherever the collective was waited on (torch's own code,
    autograd's backward, Muon's Work.wait() called from tinygpt's), the words are the same."""
    return world_size() > 1 and alarm.peer_gone(error)


def _log_to_files(message: str) -> list[str]:
    """Record the error in the run's log file (under Hydra) without printing it twice; returns
    the files it went to."""
    record = logging.makeLogRecord({"msg": message, "levelno": logging.ERROR, "levelname": "ERROR"})
    files = []
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.FileHandler):
            handler.handle(record)
            files.append(handler.baseFilename)
    return files


# --- composing configs -------------------------------------------------------------------------


def check_choices(overrides: list[str]) -> None:
    """`group=option` naming no config file: one line with the choices (Hydra's own report is a
    dozen lines). Sweep values (`model=a,b`) are checked one by one."""
    root = config_dir()
    for arg in overrides:
        key, eq, value = arg.partition("=")
        group = key.lstrip("+~")
        folder = root / group
        if (
            not eq
            or arg.startswith("-")
            or "/" in group
            or "." in group
            or not folder.is_dir()
            or "(" in value
            or value in ("", "null")
        ):
            continue
        choices = sorted(p.stem for p in folder.glob("*.yaml"))
        for option in value.split(","):
            if option not in choices:
                raise TinyGPTError(f"unknown {group} config {option!r}; choose one of: {', '.join(choices)} (files in {folder})")


def compose(config_name: str, overrides: list[str], command: str = "tinygpt train"):
    """The settings object that `configs/<config_name>.yaml` + overrides make (gpt.config's
    dataclasses, validated), or a TinyGPTError that says in one line what is wrong."""
    return settings_of(compose_raw(config_name, overrides, command))


def compose_raw(config_name: str, overrides: list[str], command: str = "tinygpt train", hydra: bool = False):
    """The composed DictConfig (Hydra's compose API: no run directory, no logging set-up); with
    `hydra`, Hydra's own settings too."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    check_choices(overrides)
    register_schemas(config_name)
    try:
        with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
            cfg = hydra_compose(config_name=config_name, overrides=overrides, return_hydra_config=hydra)
    except (HydraException, OmegaConfBaseException) as e:
        raise TinyGPTError(explain(e, command)) from None
    except AssertionError:  # OmegaConf's, e.g. a key set under a section that is null
        bad = next((o for o in overrides if "." in o.split("=", 1)[0]), overrides[-1] if overrides else "")
        raise TinyGPTError(f"cannot apply {bad!r}: its section is not set; pick it first (e.g. data=<name>)") from None
    _refuse_numbers_as_booleans(cfg, overrides)
    return cfg


def _refuse_numbers_as_booleans(cfg, overrides: list[str]) -> None:
    """OmegaConf reads `model.bias=1` (or 3) as true; a number where true/false belongs is a
    mistake, not a boolean."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from omegaconf import OmegaConf

    for override in OverridesParser.create().parse_overrides(overrides):
        if override.is_sweep_override() or override.is_delete() or override.is_hydra_override():
            continue
        given = override.value()
        if isinstance(given, (int, float)) and not isinstance(given, bool):
            if isinstance(OmegaConf.select(cfg, override.key_or_group, default=None), bool):
                raise TinyGPTError(f"{override.key_or_group} must be true or false, got {given!r}")


def settings_of(cfg):
    """The dataclasses behind a composed config, instantiated (so their checks run)."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    try:
        return OmegaConf.to_object(cfg)
    except OmegaConfBaseException as e:
        raise TinyGPTError(explain(e)) from None


def explain(error: Exception, command: str = "tinygpt train") -> str:
    """One line for a Hydra / OmegaConf error: which key, what is wrong, how to fix it."""
    from hydra.errors import OverrideParseException
    from omegaconf.errors import ConfigAttributeError, ConfigKeyError, MissingMandatoryValue, ValidationError

    parse = next((e for e in _chain(error) if isinstance(e, OverrideParseException)), None)
    if parse is not None:  # Hydra's grammar, e.g. a ~ or a space in an unquoted value
        key, _, value = str(parse.override).partition("=")
        if value.startswith("[") and value.endswith("]"):  # a list: each item quoted, not the list (a string then)
            items = ",".join('"' + item.strip().replace('"', '\\"') + '"' for item in value[1:-1].split(","))
            return (
                f"cannot read {parse.override!r}: Hydra's override grammar takes an item holding '=' (or other "
                f"punctuation) only quoted; quote each item, e.g. {_shell_quoted(f'{key}=[{items}]')}"
            )
        return (
            f"cannot read {parse.override!r}: Hydra's override grammar does not take that value unquoted; quote it "
            f"inside the shell's quotes, e.g. \"{key}='{value}'\""
        )
    cause = error
    while not getattr(cause, "full_key", None) and (cause.__cause__ or cause.__context__) is not None:
        cause = cause.__cause__ or cause.__context__  # Hydra chains the real error either way
    key = getattr(cause, "full_key", None)
    first = str(cause).strip().splitlines()[0] if str(cause).strip() else type(cause).__name__
    if isinstance(cause, (ConfigAttributeError, ConfigKeyError)) and key:
        section, _, leaf = key.rpartition(".")
        # A real optim setting the composed group lacks: one of optim=muon's, under optim=adamw.
        if section == "optim" and leaf in {f.name for f in fields(MuonSettings)}:
            return f"{key} is a Muon setting and this run uses optim=adamw (an experiment may pin it); add optim=muon"
        model = getattr(cause, "parent_node", None) if section == "model" else None  # the composed model section
        told = other_kinds_setting(key, *(model.get(k) for k in ("arch", "name"))) if model is not None else None
        if told:  # a GPT's setting under model=gru, or the reverse
            return told
        near = _nearest(leaf, getattr(cause, "parent_node", None))
        guess = f" (did you mean {f'{section}.' if section else ''}{near}?)" if near else ""
        return f"unknown setting {key!r}{guess}; list the valid keys with `{command} --cfg job`"
    if isinstance(cause, MissingMandatoryValue) and key:
        return f"{key} is required; set it on the command line, e.g. {key}=..."
    if isinstance(cause, ValidationError) and key:
        want = expected_type(getattr(cause, "object_type", None), key.rpartition(".")[2]) or _item_type(cause)
        want = want or ("a list, e.g. [a,b]" if "is not a ListConfig" in first else first)
        return f"{key} must be {want}, got {getattr(cause, 'value', None)!r}"
    if "Could not load 'hydra/launcher/submitit" in first:  # configs/hydra/launcher/slurm.yaml's plugin
        return f"{first.rstrip('.')}: hydra/launcher=slurm needs the slurm extra: pip install 'tinygpt[slurm]'"
    return first


def _shell_quoted(text: str) -> str:
    """`text` as one word for a POSIX shell, in single quotes: nothing in it ($(...), a backtick)
    is run by the shell it is typed into (shlex.quote's rule, which leaves some words bare)."""
    return "'" + text.replace("'", "'\\''") + "'"


def _nearest(name: str, node) -> str | None:
    """The key of `node` (the config section a mistyped key was looked up in) that `name` most
    likely meant: a typo's ('max_iter', 'atention', 'trian'), else the first key it is the first
    word of (`lora` for `lora_rank`, declared before lora_alpha: too short for difflib's ratio),
    else None."""
    import difflib

    keys = [str(k) for k in node.keys()] if node is not None and hasattr(node, "keys") else []
    found = difflib.get_close_matches(name, keys, n=1, cutoff=0.75)
    if found:
        return found[0]
    return next((k for k in keys if k.startswith(name + "_")), None)


def _item_type(cause) -> str | None:
    """'a number', ...: what an item of a typed list (budgets[1]) takes."""
    import typing

    from gpt.config.checks import NAMES

    args = typing.get_args(getattr(cause, "ref_type", None))
    return NAMES.get(args[0]) if len(args) == 1 else None


def _chain(error: BaseException):
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        yield error
        error = error.__cause__ or error.__context__


def refuse_bare_words(argv: list[str], command: str) -> None:
    """A word without `=` is no setting (Hydra's own report of it is four lines)."""
    bare = [a for a in argv if "=" not in a and not a.startswith(("-", "~"))]
    if bare:
        raise TinyGPTError(f"{bare[0]!r} is not a setting: settings are key=value, e.g. model=gpt-nano (see `{command} --help`)")


def take_verbatim(argv: list[str], key: str) -> tuple[list[str], str | None]:
    """Remove `key=value` from argv and return its value untouched by Hydra's override grammar,
    which rejects non-ASCII text and resolves `${...}`; free text such as a prompt needs neither."""
    rest, value = [], None
    for arg in argv:
        if arg.startswith(f"{key}="):
            value = arg[len(key) + 1 :]
        else:
            rest.append(arg)
    return rest, value


def run_command(argv: list[str], config_name: str, command: str, doc: str, fn: Callable[[object], T], verbatim=()) -> T:
    """A compose-API command: `--help` prints doc and the settings with their defaults, `--cfg`
    the composed settings; otherwise compose argv and call fn(settings), mistakes in one line.
    The `verbatim` keys (free text, paths) are taken as typed, past Hydra's override grammar,
    which rejects `=`, `,` and non-ASCII characters in values."""
    from omegaconf import OmegaConf

    given = {}
    for key in verbatim:
        argv, value = take_verbatim(argv, key)
        if value is not None:
            given[key] = value

    if any(a in ("-h", "--help") for a in argv):
        print(doc.strip() + "\n\nSettings (key=value), with their defaults:\n")
        print(OmegaConf.to_yaml(guard(lambda: compose_raw(config_name, [], command))), end="")
        sys.exit(0)
    if any(a in ("-c", "--cfg") or a.startswith("--cfg=") for a in argv):
        overrides = [a for a in argv if not a.startswith("-") and a not in ("job", "all")]
        print(OmegaConf.to_yaml(guard(lambda: compose_raw(config_name, overrides, command))), end="")
        sys.exit(0)
    flags = [a for a in argv if a.startswith("-")]
    if flags:
        fail(f"unknown option {flags[0]!r} for `{command}`; settings are key=value (see `{command} --help`)")
    guard(lambda: refuse_bare_words(argv, command))

    def run():
        # A placeholder stands in for each verbatim value while composing (a required key is given).
        settings = compose(config_name, [*argv, *(f"{key}=given" for key in given)], command)
        for key, value in given.items():  # a dotted key (task.path) sets a field of a section
            *path, name = key.split(".")
            setattr(functools.reduce(getattr, path, settings), name, value)
        return fn(settings)

    return guard(run)


# --- processes and run directories -------------------------------------------------------------


def rank() -> int:
    """This process's rank under torchrun or SLURM (see gpt.runtime.distributed.from_env), 0 alone."""
    return int(os.environ.get("RANK", os.environ.get("SLURM_PROCID", "0") if "SLURM_NTASKS" in os.environ else "0"))


def world_size() -> int:
    """How many processes the run has under torchrun or SLURM (as gpt.runtime.distributed.from_env
    reads it, without importing torch), 1 alone."""
    env = os.environ
    return int(env.get("WORLD_SIZE", 1) if "RANK" in env or "SLURM_NTASKS" not in env else env["SLURM_NTASKS"])
