"""Every command the README and docs/ show still works as typed: each `python train.py`,
`python sample.py`, `python serve.py`, `tinygpt <command>`, `python -m gpt <command>` and
`torchrun ... train.py` of a ```bash block, and of an inline code span, is split as a shell
splits it (shlex: quoting as typed) and handed to the command's own entry point with its work
stubbed out, so its overrides are composed with the real configs into typed settings (and the
train command's model shape and data source checked) without training, sampling or serving
anything. A misspelt key, a renamed option or a value the settings refuse fails here.

Placeholders (`<stamp>`, `<partition>`, ...) are replaced by plausible values (PLACEHOLDERS);
`...` (settings left to the reader) is dropped; a command's syntax (`tinygpt <command> --help`)
is skipped; `tinygpt harness` takes lm_eval's options, not tinygpt settings, so lm_eval's own
parser reads them; the one command shown as a mistake must fail (REFUSED). What is skipped or
dropped is printed (pytest -s); `python tests/test_doc_commands.py` lists every command found.
A documented command that no longer works is a documentation bug: fix the page (or the code).
Run: pytest tests/test_doc_commands.py  (compose only: ~20 s on 2 CPU cores)
"""

from __future__ import annotations

import re
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]

# A placeholder as the docs write it -> what stands in for it here.
PLACEHOLDERS = {
    "<stamp>": "2026-11-30_09-08-08-114758",
    "<sft stamp>": "2026-11-30_09-12-40-502113",
    "<run dir>": "outputs/runs/2026-11-30_09-08-08-114758",
    "<sweep dir>": "outputs/sweeps/2026-11-30_09-08-08-114758",
    "<dir>": "outputs/sweeps/2026-11-30_09-08-08-114758",
    "<partition>": "gpu",
    "<hub id or folder>": "gpt2",
    "<node0 host>": "node0.cluster",
    "<folder>": "some/folder",
    "<file or folder>": "hellaswag.jsonl",
}
# In a command's syntax rather than a command (`tinygpt <command> --help`): nothing to run.
TEMPLATES = ("<command>",)
# Commands the docs show as mistakes, with the error they must give.
REFUSED = {"python train.py foo": "'foo' is not a setting"}

SHIMS = {"train.py": "train", "sample.py": "sample", "serve.py": "serve"}
FENCE = re.compile(r"^\s*```(?P<lang>[\w-]*)\s*$")
PLACEHOLDER = re.compile(r"<[A-Za-z][\w ./-]*>")
# How an inline code span that is a command begins (in a ```bash block every line is looked at).
PREFIXES = ("python train.py", "python sample.py", "python serve.py", "python -m gpt ", "tinygpt ", "torchrun ")


@dataclass(frozen=True)
class Command:
    where: str  # file:line
    text: str  # as written (without its comment)
    command: str | None  # train, sample, ... (None: `tinygpt --help`)
    args: tuple[str, ...]
    dropped: tuple[str, ...] = ()  # the `...` left to the reader


def _shell_lines(path: Path):
    """(line number, text) of each logical line of the ```bash blocks (continuations joined),
    and of each inline code span outside the blocks that starts like a tinygpt command."""
    lines = path.read_text().splitlines()
    prose: list[str] = []
    fence = None
    pending, start = "", 0
    for n, line in enumerate(lines, 1):
        m = FENCE.match(line)
        if fence is None and m:
            fence = m["lang"]
            prose.append("")
            continue
        if fence is not None and m and not m["lang"]:
            fence = None
            prose.append("")
            continue
        if fence is None:
            prose.append(line)
            continue
        prose.append("")
        if fence not in ("bash", "sh", "shell"):
            continue
        if not pending:
            start = n
        stripped = line.strip()
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        yield start, pending + stripped
        pending = ""
    text = "\n".join(prose)
    for m in re.finditer(r"(?<!`)`([^`]+)`(?!`)", text):
        span = " ".join(m[1].split())
        if span.startswith(PREFIXES):
            yield text.count("\n", 0, m.start()) + 1, span


def _simple_commands(line: str):
    """The simple commands of a shell line: split at |, &&, || and ;, comments dropped."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    words: list[str] = []
    for token in lexer:
        if token in ("|", "||", "&&", ";", "&"):
            yield words
            words = []
        else:
            words.append(token)
    yield words


def _as_command(words: list[str]) -> tuple[str | None, list[str]] | None:
    """(command, its arguments) when the words run tinygpt (command None: `tinygpt --help`), else None."""
    while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", words[0]):  # VAR=value before a command
        words = words[1:]
    if words[:1] == ["python"] and len(words) >= 2 and words[1] in SHIMS:
        return SHIMS[words[1]], words[2:]
    if words[:1] == ["torchrun"] and "train.py" in words:
        return "train", words[words.index("train.py") + 1 :]
    if words[:3] == ["python", "-m", "gpt"]:
        rest = words[3:]
    elif words[:1] == ["tinygpt"]:
        rest = words[1:]
    else:
        return None
    if not rest or rest[0].startswith("-"):
        return None, rest
    return rest[0], rest[1:]


def _words(line: str, where: str) -> list[list[str]] | None:
    """The simple commands of a documented line with its placeholders replaced (None: the
    line shows a command's syntax, not a command). A placeholder is swapped for a marker
    before the shell split (its < and > would read as redirections) and for its stand-in
    after it (so one in a comment is dropped with the comment)."""
    found = PLACEHOLDER.findall(line)
    marked = PLACEHOLDER.sub(lambda m: f"@@{found.index(m[0])}@@", line)
    commands = []
    for words in _simple_commands(marked):
        used = {found[int(i)] for w in words for i in re.findall(r"@@(\d+)@@", w)}
        if used & set(TEMPLATES):
            return None
        unknown = used - set(PLACEHOLDERS)
        assert not unknown, f"{where}: placeholder {sorted(unknown)[0]} has no stand-in; add one to PLACEHOLDERS"
        commands.append([re.sub(r"@@(\d+)@@", lambda m: PLACEHOLDERS[found[int(m[1])]], w) for w in words])
    return commands


def collect(pages=PAGES) -> tuple[list[Command], list[tuple[str, str, str]]]:
    """The documented commands, and (where, text, why) of each one not checked."""
    found: list[Command] = []
    skipped: list[tuple[str, str, str]] = []
    for path in pages:
        name = path.relative_to(REPO).as_posix() if path.is_relative_to(REPO) else path.name
        for n, line in _shell_lines(path):
            where, shown = f"{name}:{n}", line.split("  #")[0].strip()
            commands = _words(line, where)
            for words in commands or []:
                parsed = _as_command(words)
                if parsed is None:
                    continue
                command, args = parsed
                if command == "...":  # `tinygpt ...`
                    commands = None
                else:
                    dropped = tuple(a for a in args if a == "..." or a.endswith("=..."))
                    kept = tuple(a for a in args if a not in dropped)
                    found.append(Command(where, shown, command, kept, dropped))
            if commands is None:
                skipped.append((where, shown, "a command's syntax, not a command"))
    return found, skipped


COMMANDS, NOT_CHECKED = collect()
# Each distinct command once (composing takes a quarter of a second), under its first place.
UNIQUE = list({(c.command, c.args): c for c in reversed(COMMANDS)}.values())[::-1]


# Hydra's own flags, which `tinygpt train` passes on (with --cfg's argument).
HYDRA_FLAGS = {"-m", "--multirun", "--cfg", "-c", "--help", "-h", "--hydra-help", "--info", "-i", "--resolve"}


@pytest.fixture
def stubbed(monkeypatch, tmp_path):
    """The commands other than train run through `tinygpt`'s entry point with their work
    replaced by a recorder: they compose and check their settings as they do for a user (the
    verbatim keys, --help and --cfg included), then hand them over here instead of running."""
    from gpt.apps import chat, export, plot, prepare, sample, scaling, serve, sweep
    from gpt.apps import eval as eval_app

    handed: list[tuple[str, object]] = []
    for module, name in [
        (sample, "sample"),
        (eval_app, "evaluate"),
        (export, "export"),
        (prepare, "prepare"),
        (chat, "chat"),
        (plot, "plot"),
    ]:
        monkeypatch.setattr(module, name, lambda settings, *args, _name=name, **kwargs: handed.append((_name, settings)))
    monkeypatch.setattr(serve, "serve", lambda settings: handed.append(("serve", settings)))
    monkeypatch.setattr(sweep, "summarise", lambda settings: handed.append(("summarise", settings)))
    monkeypatch.setattr(scaling, "run", lambda settings, extra, argv: handed.append(("scaling", _study_jobs(settings, extra))))
    monkeypatch.setattr(sys, "argv", ["tinygpt"])  # gpt.apps.main sets it
    monkeypatch.chdir(tmp_path)  # nothing should be written; if anything is, it lands here
    return handed


def _model_and_source(settings) -> None:
    """The checks of train's preflight that need no files, network or devices."""
    from gpt.data import sources
    from gpt.model import registry

    registry.with_vocab(settings.model, 1)
    sources.check(settings.data.source)


def _study_jobs(settings, extra: list[str]):
    """A study's jobs composed as `tinygpt scaling` composes them before launching: the preset's
    overrides and the command line's, at each size of its ladder."""
    from gpt.apps import common, scaling

    overrides = [*settings.train, *extra]
    scaling._refuse_horizon_overrides(overrides)
    for depth in settings.depths:
        _model_and_source(
            common.compose("config", [*overrides, f"model.depth={depth}", f"train.flops_budget={settings.budgets[0]:g}"])
        )
    return settings


def _sweep_values(overrides: list[str]) -> list[list[str]]:
    """Each override of a multirun as the `key=value` overrides it stands for: every value of a
    comma list, both ends of an interval (its search space is the sweeper's)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import IntervalSweep

    options = []
    for o in OverridesParser.create().parse_overrides(overrides):
        if not o.is_sweep_override():
            options.append([o.input_line])
            continue
        value = o.value()
        values = [value.start, value.end] if isinstance(value, IntervalSweep) else list(o.sweep_string_iterator())
        options.append([f"{o.get_key_element()}={v}" for v in values])
    return options


def _is_hydra(override: str) -> bool:
    return override.startswith(("hydra.", "hydra/", "+hydra", "~hydra"))


def check_train(args: tuple[str, ...]) -> None:
    """`tinygpt train ARGS` composed into its settings as train.main composes them before Hydra
    starts (a multirun: every value it lists, each with the others at their first), the model
    shape and data source checked, and Hydra's own overrides (hydra.run.dir, hydra.launcher.*,
    hydra.sweeper.*) composed with Hydra's config. (Composing each value of a config's search
    space, as train.main also does, is tests/apps/test_sweep.py's.)"""
    from gpt.apps import common

    command = "tinygpt train"
    flags = [a for a in args if a.startswith("-")]
    assert set(flags) <= HYDRA_FLAGS, f"unknown option {sorted(set(flags) - HYDRA_FLAGS)[0]!r} for tinygpt train"
    cfg = "--cfg" in flags or "-c" in flags  # its argument (job, hydra, all) is no setting
    words = [a for a in args if not a.startswith("-") and ("=" in a or not cfg)]
    common.refuse_bare_words(words, command)
    if not ("-m" in flags or "--multirun" in flags):
        _model_and_source(common.compose("config", [a for a in words if not _is_hydra(a)], command))
        if any(_is_hydra(a) for a in words):
            common.compose_raw("config", words, command, hydra=True)
        return
    options = _sweep_values(words)
    firsts = [values[0] for values in options]
    common.compose_raw("config", firsts, command, hydra=True)  # the launcher's and sweeper's settings too
    jobs = [firsts] + [firsts[:i] + [v] + firsts[i + 1 :] for i, values in enumerate(options) for v in values[1:]]
    for job in jobs:
        _model_and_source(common.compose("config", [a for a in job if not _is_hydra(a)], command))


def check_harness(args: tuple[str, ...]) -> None:
    """`tinygpt harness ARGS`: lm_eval's options, which tinygpt passes on with a few defaults
    added; read by lm_eval's own parser (an unknown option exits with status 2)."""
    if not args:  # `tinygpt harness` alone prints its help
        return
    cli = pytest.importorskip("lm_eval._cli", reason="lm_eval's parser (lm_eval >= 0.4.10, the eval extra)")
    sys.argv = ["tinygpt harness", *args]
    cli.HarnessCLI().parse_args()


def run(cmd: Command, handed: list) -> None:
    """Check one command; a refused one raises TinyGPTError or exits with status 2."""
    from gpt.apps import main

    if cmd.command == "train":
        return check_train(cmd.args)
    if cmd.command == "harness":
        return check_harness(cmd.args)
    main.main([cmd.command, *cmd.args] if cmd.command else list(cmd.args))
    helped = cmd.command is None or any(a in ("-h", "--help", "-c", "--cfg") for a in cmd.args)
    assert helped or handed, f"`{cmd.text}` did not reach the command"


@pytest.mark.parametrize("cmd", UNIQUE, ids=[f"{c.where} {' '.join([c.command or '', *c.args])[:60]}" for c in UNIQUE])
def test_documented_command_is_valid(cmd, stubbed, capsys):
    from gpt.errors import TinyGPTError

    expected = REFUSED.get(cmd.text)
    try:
        run(cmd, stubbed)
    except TinyGPTError as e:
        assert expected is not None and expected in str(e), f"{cmd.where}: `{cmd.text}` is refused: {e}"
        return
    except SystemExit as e:
        err = capsys.readouterr().err
        if e.code not in (0, None):
            assert expected is not None and expected in err, f"{cmd.where}: `{cmd.text}` is refused:\n{err}"
            return
    assert expected is None, f"{cmd.where}: `{cmd.text}` is shown as a mistake ({expected}) but is accepted"


def test_the_docs_hold_commands_to_check():
    """Enough commands are found (a change to the extraction cannot pass on none), from the
    README and the pages that show commands; what is skipped is listed with its reason."""
    print(f"{len(COMMANDS)} documented commands ({len(UNIQUE)} distinct) checked; not checked:")
    for where, text, why in NOT_CHECKED:
        print(f"  {where}: {text}  ({why})")
    for c in COMMANDS:
        if c.dropped:
            print(f"  {c.where}: {c.text}  (checked without {' '.join(c.dropped)})")
    assert len(COMMANDS) >= 100 and len(UNIQUE) >= 70, (
        f"only {len(COMMANDS)} commands found in {', '.join(p.name for p in PAGES)}"
    )
    sources = {c.where.split(":")[0] for c in COMMANDS}
    for page in ("README.md", "docs/training.md", "docs/data.md", "docs/sampling.md", "docs/serving.md", "docs/evaluation.md"):
        assert page in sources, f"no command found in {page}"
    assert {c.command for c in COMMANDS} >= {"train", "sample", "serve", "eval", "export", "prepare", "sweep", "scaling"}


if __name__ == "__main__":
    for c in COMMANDS:
        extra = f"   (without {' '.join(c.dropped)})" if c.dropped else ""
        print(f"{c.where}: tinygpt {' '.join([c.command or '', *c.args])}{extra}")
    for where, text, why in NOT_CHECKED:
        print(f"{where}: not checked: {text}  ({why})")
    print(f"{len(COMMANDS)} commands ({len(UNIQUE)} distinct), {len(NOT_CHECKED)} not checked")
