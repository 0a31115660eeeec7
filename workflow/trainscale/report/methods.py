"""The report's Methods section: docs/methods.md rendered to HTML.

One document states how every figure is measured and computed; the report shows it as written,
its markup rendered (CommonMark with tables). Its title is left out (the report has its own
heading), its sections become `<h3>` and every section and bold term gets an anchor,
`methods-<slug>`, which figure captions link to.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

from markupsafe import Markup

__all__ = ["METHODS", "anchor", "methods_html"]

METHODS = Path(__file__).resolve().parents[3] / "docs" / "methods.md"


def anchor(title: str) -> str:
    """`methods-` and GitHub's heading slug: lower case, punctuation dropped, spaces to hyphens."""
    return "methods-" + re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-")


@cache
def methods_html(path: Path = METHODS) -> Markup:
    """docs/methods.md as HTML for the report (raw HTML in the page is escaped, not passed)."""
    from markdown_it import MarkdownIt  # only the report needs it

    md = MarkdownIt("commonmark", {"html": False}).enable("table")
    tokens = md.parse(path.read_text(encoding="utf-8"))
    if tokens and tokens[0].type == "heading_open" and tokens[0].tag == "h1":
        tokens = tokens[3:]  # heading_open, inline, heading_close
    seen: set[str] = set()
    for i, token in enumerate(tokens):
        title = _anchored_text(tokens, i)
        if title is None or anchor(title) in seen:
            continue
        seen.add(anchor(title))
        token.attrSet("id", anchor(title))
        if token.type == "heading_open":
            token.tag = tokens[i + 2].tag = "h3"
    return Markup(md.renderer.render(tokens, md.options, {}))


def _anchored_text(tokens: list, i: int) -> str | None:
    """The text an anchor at tokens[i] names: a section's title, or a list item's bold term."""
    token = tokens[i]
    if token.type == "heading_open" and token.tag == "h2":
        return tokens[i + 1].content
    if token.type != "list_item_open" or i + 2 >= len(tokens):
        return None
    children = [c for c in tokens[i + 2].children or [] if c.content or c.type != "text"]
    if not children or children[0].type != "strong_open":
        return None
    end = next(j for j, c in enumerate(children) if c.type == "strong_close")
    return "".join(c.content for c in children[1:end]).split(" (")[0]
