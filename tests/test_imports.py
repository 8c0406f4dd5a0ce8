"""The package's layering: imports flow one way, from the commands down to the settings, with no
circle; settings import no behaviour; `import gpt` imports no command; the top of gpt/ is the
package's face. Every import of a gpt module counts, those inside functions too: a lazy import
only hides a circle (or an upward import) until the day the import moves to the top.
Run: pytest tests/test_imports.py"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import REPO

PACKAGE = REPO / "gpt"

# Lowest first: a package may import its own modules and those of the layers below it, never one
# above. One layer's packages do not import each other unless listed in the same tuple's order
# (a tuple's packages are peers: each may import only what is below the layer).
LAYERS = [
    ("gpt.version", "gpt.errors"),
    ("gpt.config",),  # the settings: torch-free, behaviour-free
    ("gpt.runtime",),  # devices, threads, processes, signals, the run lock, atomic files
    ("gpt.model", "gpt.chat", "gpt.tracking"),  # the model; the chat template's language; a run's records
    ("gpt.tokenizers",),  # text <-> ids (with the chat template when the tokenizer has one)
    ("gpt.data", "gpt.generation", "gpt.interop"),  # prepared data and batches; decoding; Hugging Face formats
    ("gpt.checkpoints",),  # the format, run directories, resuming, a model from whatever a user names
    ("gpt.evals",),  # perplexity, scoring, tasks, chat replies, the harness adapter
    ("gpt.training", "gpt.serve", "gpt.scaling"),  # what the commands run
    ("gpt.apps",),  # the command line
    ("gpt", "gpt.__main__"),  # the package's face: `from gpt import train, sample`
]
FACE = {"__init__.py", "__main__.py", "version.py", "errors.py"}


def modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(REPO).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def imports_of(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The gpt modules `name` imports anywhere in its file (`from gpt.runtime import io` is gpt.runtime.io)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from .x import y
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, *([base] if base else [])])
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:  # gpt.config.RunConfig -> gpt.config
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports_of(name, path, known) for name, path in known.items()}


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Each circle once, as the path from a module back to itself (depth-first search)."""
    found, done = [], set()

    def visit(node: str, path: list[str], on_path: set[str]) -> None:
        for nxt in sorted(edges.get(node, ())):
            if nxt in on_path:
                cycle = path[path.index(nxt) :]
                if set(cycle) not in [set(c) for c in found]:
                    found.append([*cycle, nxt])
            elif nxt not in done:
                visit(nxt, [*path, nxt], on_path | {nxt})
        done.add(node)

    for start in sorted(edges):
        if start not in done:
            visit(start, [start], {start})
    return found


def layer_of(module: str) -> tuple[int, str]:
    """(layer, package) of a module: the longest package of LAYERS it lies in."""
    best = None
    for rank, packages in enumerate(LAYERS):
        for package in packages:
            if (module == package or module.startswith(package + ".")) and (best is None or len(package) > len(best[1])):
                best = (rank, package)
    if best is None:
        raise AssertionError(f"{module} is in no layer of tests/test_imports.py's LAYERS: place it there")
    return best


def upward(edges: dict[str, set[str]]) -> list[str]:
    """Imports of a package of the same or a higher layer than the importer's own package."""
    bad = []
    for module, targets in sorted(edges.items()):
        rank, package = layer_of(module)
        for target in sorted(targets):
            target_rank, target_package = layer_of(target)
            if target_package != package and target_rank >= rank:
                bad.append(f"{module} -> {target} ({package} is layer {rank}, {target_package} layer {target_rank})")
    return bad


def test_the_checks_see_a_planted_circle_and_a_planted_upward_import(tmp_path):
    """The checks themselves: imports inside functions, `from gpt.x import y` and relative imports
    are edges, and a planted circle and a planted upward import are found."""
    planted = tmp_path / "config.py"
    planted.write_text(
        "from gpt.errors import TinyGPTError\n\ndef f():\n    from gpt.evals import tasks\n    from .data import sources\n"
    )
    known = modules()
    assert imports_of("gpt.config", planted, known) == {"gpt.errors", "gpt.evals.tasks", "gpt.data.sources"}
    edges = graph() | {"gpt.config": imports_of("gpt.config", planted, known)}
    assert any({"gpt.config", "gpt.evals.tasks"} <= set(c) for c in circles(edges))
    assert "gpt.config -> gpt.evals.tasks (gpt.config is layer 1, gpt.evals layer 7)" in upward(edges)
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
    assert circles({"a": {"b"}, "b": set()}) == []
    library_to_command = graph() | {"gpt.scaling.study": {"gpt.apps.train"}}
    assert any(line.startswith("gpt.scaling.study -> gpt.apps.train") for line in upward(library_to_command))
    peers = graph() | {"gpt.model.gpt": {"gpt.chat.template"}}  # one layer's packages do not import each other
    assert any(line.startswith("gpt.model.gpt -> gpt.chat.template") for line in upward(peers))


def test_no_module_of_gpt_imports_itself_back():
    found = circles(graph())
    assert not found, "import circles:\n" + "\n".join(" -> ".join(c) for c in found)


def test_imports_flow_one_way_down_the_layers():
    """Every module is in a layer, and imports only its own package and the layers below: the
    command line is imported by nothing in the library, the model by nothing it does not need."""
    bad = upward(graph())
    assert not bad, "upward imports:\n" + "\n".join(bad)


def test_settings_import_no_behaviour():
    """gpt/config/ is the settings: what it may import is itself and the error type (the task
    registry, the data sources and the model's code are left to their own packages)."""
    edges = graph()
    outside = {t for m, targets in edges.items() if layer_of(m)[1] == "gpt.config" for t in targets}
    assert {t for t in outside if not t.startswith("gpt.config")} == {"gpt.errors"}


def test_importing_gpt_imports_no_command_and_no_torch():
    """`import gpt` is the package's face: `gpt.train` and `gpt.sample` import the commands when
    called, so importing the package costs nothing."""
    code = "import sys, gpt; print(sorted(m for m in sys.modules if m.startswith(('gpt.', 'torch'))))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    assert out.stdout.strip() == "['gpt.version']"


def test_the_top_of_gpt_is_the_package_face():
    """Modules live in the packages that name their concept; only the face is at the top."""
    assert {p.name for p in PACKAGE.glob("*.py")} == FACE


@pytest.mark.parametrize("limit", [800])
def test_no_module_of_the_library_is_a_long_file(limit):
    """A guideline, not a rule to split by: ~400 lines hints that a module may hold two concerns
    (STYLE.md), and one concern split over two files to stay under a number reads worse than one
    file of 500. Twice that is two jobs in one file, whatever they are: split it by job."""
    long = {str(p.relative_to(REPO)): n for p in PACKAGE.rglob("*.py") if (n := len(p.read_text().splitlines())) > limit}
    assert not long, f"modules over {limit} lines: {long}"
