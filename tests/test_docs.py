"""The docs cannot go stale. docs/math_to_code.md: every reference [`gpt/<file>.py:<line>`](...)
is followed by a code span that must appear on that very line (after moving code, rewrite the
numbers with `python tests/test_docs.py --fix`: it finds each snippet's line again). README.md:
it stays a ten-minute read, and each of its relative links names a file that exists (and a
heading of it, for a #anchor). Links between the docs pages are checked by
`mkdocs build --strict`, their commands by tests/test_doc_commands.py.
Run: pytest tests/test_docs.py"""

from __future__ import annotations

import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DOC = REPO / "docs" / "math_to_code.md"
README = REPO / "README.md"
# [`gpt/model/attention.py:80`](../gpt/model/attention.py#L80) `q, k, v = self.c_attn(x)`
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


def github_anchors(page: Path) -> set[str]:
    """The ids GitHub gives a Markdown file's headings (MkDocs' toc gives plain headings the same)."""
    anchors, fenced = set(), False
    for line in page.read_text().splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced and (m := re.match(r"#{1,6} (.+)", line)):
            anchors.add(re.sub(r"[^\w\- ]", "", m[1].strip().lower()).replace(" ", "-"))
    return anchors


def test_readme_links_name_files_and_headings_that_exist():
    links = re.findall(r"\]\(([^)\s]+)\)", README.read_text())
    assert len(links) >= 10, "the README lost its links to the docs"
    broken = []
    for link in links:
        if re.match(r"[a-z]+:", link):  # http(s):, mailto:
            continue
        path, _, anchor = link.partition("#")
        target = (README.parent / path) if path else README
        if not target.exists():
            broken.append(f"{link}: no such file")
        elif anchor and anchor not in github_anchors(target):
            broken.append(f"{link}: {path or 'README.md'} has no heading #{anchor}")
    assert not broken, "\n".join(broken)


def test_readme_links_every_docs_page():
    linked = {Path(link.partition("#")[0]).name for link in re.findall(r"\]\((docs/[^)\s]+)\)", README.read_text())}
    pages = {p.name for p in (REPO / "docs").glob("*.md")}
    assert pages <= linked, f"README.md does not link {sorted(pages - linked)}"


def test_readme_is_a_ten_minute_read():
    """What, install, the quickstart, the next five things, the tests: every other topic has its page in docs/."""
    lines = len(README.read_text().splitlines())
    assert lines <= 250, f"README.md has {lines} lines; move a topic to its docs/ page"


if __name__ == "__main__" and sys.argv[1:] == ["--fix"]:
    DOC.write_text(fix(DOC.read_text()))
    print(f"renumbered {len(references(DOC.read_text()))} references in {DOC}")
