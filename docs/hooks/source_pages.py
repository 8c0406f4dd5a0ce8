"""MkDocs hook (mkdocs.yml, `hooks:`): a page on the site for each source file the docs link to.

The pages link into the source tree the way GitHub shows it: `../gpt/model.py#L198` in
docs/math_to_code.md opens model.py at line 198. MkDocs knows only the files under docs/, so
with `--strict` every such link would fail the build, and turning its not-found check down
would let a broken link between two pages through as well. Instead, for each file of the
repository that a page links to, this hook adds a page to the site (source/gpt/model.py/) that
shows the file with an anchor per line (L1, L2, ...), and points the links there. MkDocs then
checks those links as it checks any other: a link to a file that does not exist is left as it
is and fails the build ("not found among documentation files"), and a line past the end of the
file is a missing anchor, which fails it too (`validation: anchors: warn` in mkdocs.yml).
"""

from __future__ import annotations

import html
import posixpath
import re
from pathlib import Path

from mkdocs.structure.files import File, Files, InclusionLevel

# An inline Markdown link's target: ](path#anchor)
LINK = re.compile(r"\]\((?P<path>[^()\s#:]+)(?P<anchor>#[^()\s]*)?\)")
FOLDER = "source"  # where the generated pages go, under the site's root

# The repository path of each linked source file -> the src_uri of its generated page (one build).
_pages: dict[str, str] = {}


def _source_file(page_uri: str, target: str, config) -> str | None:
    """The repository path of a link's target when the link leaves docs/ for a file of the
    repository, else None (links between pages are MkDocs' own to check)."""
    docs = Path(config.docs_dir).resolve()
    repo = Path(config.config_file_path).resolve().parent
    path = (docs / posixpath.dirname(page_uri) / target).resolve()
    if path.is_relative_to(docs) or not path.is_relative_to(repo) or not path.is_file():
        return None
    return path.relative_to(repo).as_posix()


def _listing(repo_path: str, repo: Path) -> str:
    lines = (repo / repo_path).read_text(encoding="utf-8").splitlines()
    width = len(str(len(lines)))
    body = "\n".join(
        f'<span id="L{n}"><a class="lineno" href="#L{n}">{n:>{width}}</a>  {html.escape(line)}</span>'
        for n, line in enumerate(lines, 1)
    )
    return (
        f"# {repo_path}\n\n"
        "The file as it was when this site was built; the links of the other pages point at its lines.\n\n"
        f'<pre class="source-listing"><code>{body}</code></pre>\n'
    )


def on_files(files: Files, config) -> Files:
    _pages.clear()
    repo = Path(config.config_file_path).resolve().parent
    for page in list(files.documentation_pages()):
        for m in LINK.finditer(page.content_string):
            source = _source_file(page.src_uri, m["path"], config)
            if source is not None and source not in _pages:
                _pages[source] = f"{FOLDER}/{source}.md"
    for source, uri in _pages.items():
        content = _listing(source, repo)
        files.append(File.generated(config, uri, content=content, inclusion=InclusionLevel.NOT_IN_NAV))
    return files


def on_page_markdown(markdown: str, page, config, files) -> str:
    here = posixpath.dirname(page.file.src_uri) or "."

    def point(m: re.Match) -> str:
        source = _source_file(page.file.src_uri, m["path"], config)
        if source is None or source not in _pages:
            return m[0]
        return f"]({posixpath.relpath(_pages[source], here)}{m['anchor'] or ''})"

    return LINK.sub(point, markdown)
