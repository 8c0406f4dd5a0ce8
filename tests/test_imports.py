"""The package has no import circles, and settings import no behaviour. Every import of a gpt
module counts, those inside functions too: a lazy import only hides a circle until the day the
import moves to the top. Run: pytest tests/test_imports.py"""

from __future__ import annotations

import ast
from pathlib import Path

from helpers import REPO

PACKAGE = REPO / "gpt"


def modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(REPO).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def imports_of(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The gpt modules `name` imports anywhere in its file (`from gpt import io` is gpt.runtime.io)."""
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


def test_the_finder_sees_a_circle_through_a_lazy_import(tmp_path):
    """The check itself: imports inside functions, `from gpt import x` and relative imports are
    edges, and a planted circle is found."""
    planted = tmp_path / "config.py"
    planted.write_text(
        "from gpt.errors import TinyGPTError\n\ndef f():\n    from gpt.evals import tasks\n    from .data import sources\n"
    )
    known = modules()
    assert imports_of("gpt.config", planted, known) == {"gpt.errors", "gpt.evals.tasks", "gpt.data.sources"}
    edges = graph() | {"gpt.config": imports_of("gpt.config", planted, known)}
    assert any({"gpt.config", "gpt.evals.tasks"} <= set(c) for c in circles(edges))
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_no_module_of_gpt_imports_itself_back():
    found = circles(graph())
    assert not found, "import circles:\n" + "\n".join(" -> ".join(c) for c in found)


def test_settings_import_no_behaviour():
    """gpt/config/__init__.py is the settings: what it may import is the error type alone (the task
    registry, the data sources and the model check names it leaves to their own modules)."""
    assert imports_of("gpt.config", PACKAGE / "config" / "__init__.py", modules()) == {"gpt.errors"}
