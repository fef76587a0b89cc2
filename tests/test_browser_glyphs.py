"""No character of the book is drawn as the missing-glyph box, in Chromium without any CJK or emoji
system font (the reader's laptop; this test machine has none): every page of both editions, every
chapter's slide deck and the A4 handout of both editions.

Measured on the rendered page, not from the stylesheets it links (tests/glyphs.js): each Chinese
character or emoji of the page, with the font its element computes (style, weight, family
list), is drawn on a canvas and compared with that font's drawing of code points no font has
(``.notdef``, the box); a character drawn the same way has no glyph. The fonts are the book's
web fonts (tokenflow.viz.fonts.WEB_FONTS, made by scripts/build_fonts.py): without them, e.g.
``TOKENFLOW_NO_WEB_FONT=1`` (the served ``tokenflow-zh-font.css`` answered empty), every page
with Chinese fails. The pages are read at 1280 px.

The book's pages are read here in the same load as their other checks (a page load is most of
a check's CPU time): the English pages by tests/test_browser.py
(``test_no_character_is_drawn_as_a_box``, which also checks the figures' sizes), the Chinese
ones by tests/test_browser_zh.py (``test_no_chinese_page_character_is_drawn_as_a_box``). This
file reads the slides and handouts of both editions.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from test_browser import GLYPHS_JS, glyph_problems, no_web_font, serve, tab  # noqa: F401


@pytest.fixture(scope="module")
def server(book_html_dir, zh_html_dir):
    """Both editions (Chinese in zh/) on 127.0.0.1."""
    yield from serve(book_html_dir)


def _slides(html: Path) -> list[str]:
    pages = []
    for folder in ("slides", "zh/slides"):
        pages += [f"{folder}/{p.name}" for p in sorted((html / folder).glob("*.html"))]
    return pages


def test_no_slide_character_is_drawn_as_a_box(tab, server, book_html_dir):  # noqa: F811
    no_web_font(tab.page)
    pages = _slides(book_html_dir)
    assert any("handout" in p for p in pages) and any(p.startswith("zh/slides/") for p in pages)
    walked = {}
    for path in pages:
        page, _ = tab.open(server, path)
        walked[path] = {"glyphs": page.evaluate(GLYPHS_JS)}
    problems, checked = glyph_problems(walked)
    chars = max(r["glyphs"]["chars"] for r in walked.values())
    print(f"\n{len(pages)} pages, {checked} (character, font) pairs drawn; "
          f"most distinct characters on one page: {chars}")
    assert checked > 1000, "the decks show Chinese characters: the walk found too few"
    assert not problems, "\n".join(problems)
