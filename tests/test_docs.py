"""docs/math_to_code.md cannot go stale: every reference [`gpt/<file>.py:<line>`](...) is
followed by a code span that must appear on that very line. After moving code, rewrite the
numbers with `python tests/test_docs.py --fix` (it finds each snippet's line again).
Run: pytest tests/test_docs.py"""

from __future__ import annotations

import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DOC = REPO / "docs" / "math_to_code.md"
# [`gpt/model.py:195`](../gpt/model.py#L195) `q, k, v = self.c_attn(x)`
REF = re.compile(
    r"\[`(?P<file>gpt/[\w/]+\.py):(?P<line>\d+)`\]\(\.\./(?P<link>gpt/[\w/]+\.py)#L(?P<anchor>\d+)\) `(?P<code>[^`]+)`"
)


def references(text: str) -> list[re.Match]:
    return list(REF.finditer(text))


def lines_holding(file: str, code: str) -> list[int]:
    lines = (REPO / file).read_text().splitlines()
    return [n for n, line in enumerate(lines, 1) if code in line]


def fix(text: str) -> str:
    def renumber(m: re.Match) -> str:
        found = lines_holding(m["file"], m["code"])
        if len(found) != 1:
            raise SystemExit(f"`{m['code']}` is on {len(found)} lines of {m['file']}: make the snippet unique")
        n = found[0]
        return f"[`{m['file']}:{n}`](../{m['file']}#L{n}) `{m['code']}`"

    return REF.sub(renumber, text)


def test_every_reference_points_at_its_code():
    text = DOC.read_text()
    refs = references(text)
    assert len(refs) >= 30, "the page lost its references (or their format changed)"
    stale = []
    for m in refs:
        assert m["file"] == m["link"] and m["line"] == m["anchor"], m[0]
        lines = (REPO / m["file"]).read_text().splitlines()
        line = int(m["line"])
        if not (1 <= line <= len(lines) and m["code"] in lines[line - 1]):
            stale.append(
                f"{m['file']}:{line} does not hold `{m['code']}` (it is on line(s) {lines_holding(m['file'], m['code'])})"
            )
    assert not stale, "\n".join(stale) + "\nrun: python tests/test_docs.py --fix"


def test_no_bare_line_numbers():
    """Only checkable references: an 'l. 123' without its code would go stale unnoticed."""
    assert not re.search(r"\bl\. \d", DOC.read_text())


if __name__ == "__main__" and sys.argv[1:] == ["--fix"]:
    DOC.write_text(fix(DOC.read_text()))
    print(f"renumbered {len(references(DOC.read_text()))} references in {DOC}")
