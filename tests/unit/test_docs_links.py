"""Every relative link in README.md and docs/*.md resolves: to a file or directory of the
repository, and a ``#anchor`` to a heading of the markdown file it names, by GitHub's
rules for heading anchors. Links to ``http(s)://`` and ``mailto:`` are not followed."""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path
from urllib.parse import unquote

ROOT = Path(__file__).resolve().parents[2]

FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
CODE_SPAN = re.compile(r"(`+).*?\1", re.DOTALL)
# [text](target "title") and ![alt](target): the target up to a space or the closing ")".
INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE = re.compile(r"^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$")
HTML_ID = re.compile(r"<a\s+(?:name|id)=\"([^\"]+)\"")
GITHUB_LINE = re.compile(r"L\d+(-L\d+)?")
EXTERNAL = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


def slug(heading: str) -> str:
    """GitHub's anchor for a heading's text: markup dropped, lower case, punctuation
    other than ``-`` and ``_`` removed, each space a ``-``."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link: its text
    text = text.replace("`", "").replace("*", "")
    text = re.sub(r"<[^>]+>", "", text)
    text = text.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _prose_lines(text: str) -> Iterable[str]:
    """The lines outside fenced code blocks."""
    fenced = None
    for line in text.splitlines():
        match = FENCE.match(line)
        if match:
            if fenced is None:
                fenced = match.group(1)
            elif match.group(1) == fenced:
                fenced = None
            continue
        if fenced is None:
            yield line


def anchors(path: Path) -> set[str]:
    """The anchors GitHub gives ``path``'s headings (the second of a name gets ``-1``,
    and so on), and those of ``<a name=...>``/``<a id=...>`` tags."""
    found: set[str] = set()
    seen: dict[str, int] = {}
    for line in _prose_lines(path.read_text(encoding="utf-8")):
        found.update(HTML_ID.findall(line))
        match = HEADING.match(line)
        if match is None:
            continue
        base = slug(match.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def links(path: Path) -> Iterable[str]:
    """The link targets written in ``path``, outside code blocks and code spans (a
    link's text, and a code span, may run over a line break)."""
    prose = []
    for line in _prose_lines(path.read_text(encoding="utf-8")):
        reference = REFERENCE.match(line)
        if reference:
            yield reference.group(1)
        else:
            prose.append(line)
    yield from INLINE_LINK.findall(CODE_SPAN.sub("", "\n".join(prose)))


def broken_links(path: Path, root: Path = ROOT) -> list[str]:
    """``path``'s relative links that do not resolve, each as ``target: why``."""
    broken = []
    for target in links(path):
        if not target or EXTERNAL.match(target):
            continue
        location, _, anchor = target.partition("#")
        resolved = (path.parent / unquote(location)).resolve() if location else path
        if location and not resolved.exists():
            broken.append(f"{target}: no such file")
            continue
        if location and root not in resolved.parents and resolved != root:
            broken.append(f"{target}: outside the repository")
            continue
        if not anchor:
            continue
        if resolved.suffix == ".md":
            if unquote(anchor) not in anchors(resolved):
                broken.append(f"{target}: no heading with anchor #{anchor}")
        elif not GITHUB_LINE.fullmatch(anchor):
            broken.append(f"{target}: #{anchor} is neither a line (L12) nor a markdown heading")
    return broken


def documents(root: Path = ROOT) -> list[Path]:
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def test_every_relative_link_in_readme_and_docs_resolves() -> None:
    checked = documents()
    assert len(checked) > 1 and all(p.exists() for p in checked)
    broken = {str(p.relative_to(ROOT)): b for p in checked if (b := broken_links(p))}
    assert broken == {}


def test_the_check_reports_a_missing_file_a_missing_heading_and_a_bad_line_anchor(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "code.py").write_text("x = 1\n")
    (tmp_path / "docs" / "other.md").write_text("# The `other` page: A & B\n\n## Twice\n\n## Twice\n")
    readme = tmp_path / "README.md"
    readme.write_text(
        "# Top\n\n"
        "[ok](docs/other.md#the-other-page-a--b) [ok](docs/other.md#twice-1) [ok](#top)\n"
        "[ok](src/code.py) [ok](src/code.py#L1-L2) [ok](https://example.com/x#y) [ok](src/)\n"
        "`[not a link](nowhere.md)`\n\n"
        "```\n[not a link](nowhere.md)\n```\n\n"
        "[gone](docs/missing.md) ![gone](docs/missing.png) [bad](docs/other.md#twice-2)\n"
        "[bad](#bottom) [bad](src/code.py#main) [a link whose text\nwraps](docs/wrapped.md)\n"
        "`a code span\nover [two](lines.md) lines`\n\n"
        "[ref]: docs/also-missing.md\n"
    )
    assert broken_links(readme, tmp_path) == [
        "docs/also-missing.md: no such file",  # reference definitions come first
        "docs/missing.md: no such file",
        "docs/missing.png: no such file",
        "docs/other.md#twice-2: no heading with anchor #twice-2",
        "#bottom: no heading with anchor #bottom",
        "src/code.py#main: #main is neither a line (L12) nor a markdown heading",
        "docs/wrapped.md: no such file",
    ]


def test_slugs_follow_githubs_rules() -> None:
    assert slug("More than one core (`--workers`)") == "more-than-one-core---workers"
    assert slug("Security: users, tags, permissions") == "security-users-tags-permissions"
    assert slug("Dead letters (leveret's API, used by the console and `leveret dlq`)") == (
        "dead-letters-leverets-api-used-by-the-console-and-leveret-dlq"
    )
    assert slug("**Bold** [link](x.md) and ActiveMQ.DLQ") == "bold-link-and-activemqdlq"
