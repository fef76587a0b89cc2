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
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from test_browser import serve, tab, toc_pages  # noqa: F401

GLYPHS_JS = (Path(__file__).with_name("glyphs.js")).read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def server(book_html_dir, zh_html_dir):
    """Both editions (Chinese in zh/) on 127.0.0.1."""
    yield from serve(book_html_dir)


def _no_web_font(page) -> None:
    """With $TOKENFLOW_NO_WEB_FONT set, the book's web font stylesheet answers empty and the
    slides' inline @font-face rules are dropped: what a build without the fonts shows."""
    if os.environ.get("TOKENFLOW_NO_WEB_FONT"):
        page.route("**/tokenflow-zh-font.css*",
                   lambda r: r.fulfill(body="", content_type="text/css"))
        page.add_init_script("""document.addEventListener('DOMContentLoaded', () => {
            for (const s of document.querySelectorAll('style'))
              s.textContent = s.textContent.replace(/@font-face\\s*{[^}]*}/g, '');
            });""")


def _pages(html: Path) -> list[str]:
    pages = [f"{f}.html" for f in toc_pages()]
    pages += [f"zh/{f}.html" for f in toc_pages()]
    for folder in ("slides", "zh/slides"):
        pages += [f"{folder}/{p.name}" for p in sorted((html / folder).glob("*.html"))]
    return pages


def test_no_character_is_drawn_as_a_box(tab, server, book_html_dir):  # noqa: F811
    _no_web_font(tab.page)
    pages = _pages(book_html_dir)
    assert any("handout" in p for p in pages) and any(p.startswith("zh/slides/") for p in pages)
    problems, checked, chars = [], 0, 0
    for path in pages:
        page, _ = tab.open(server, path)
        r = page.evaluate(GLYPHS_JS)
        checked += r["checked"]
        chars = max(chars, r["chars"])
        problems += [f"{path}: {m}" for m in r["missing"][:8]]
        if len(r["missing"]) > 8:
            problems.append(f"{path}: ... {len(r['missing']) - 8} more")
    print(f"\n{len(pages)} pages, {checked} (character, font) pairs drawn; "
          f"most distinct characters on one page: {chars}")
    assert checked > 1000, "the pages show Chinese characters: the walk found too few"
    assert not problems, "\n".join(problems)


# Every figure of a page: its intended CSS width (the width matplotlib drew it at, at figure.dpi
# 120: the inline style myst-nb writes, or half the retina PNG's pixels) and its displayed width.
FIGURES_JS = """() => [...document.querySelectorAll('.bd-article img')]
  .filter(i => i.naturalWidth > 0 && /\\.png|image\\/png/.test(i.src)
               && i.getClientRects().length > 0)      // shown (not an explorer's other setting)
  .map(i => ({src: i.getAttribute('src').slice(-24),
              natural: parseFloat(i.style.width) || i.naturalWidth / 2,
              shown: i.getBoundingClientRect().width,
              column: i.closest('.bd-article').getBoundingClientRect().width}))"""


def test_figures_are_shown_at_their_reading_size(tab, server):  # noqa: F811
    """Every figure of the English edition (the Chinese pages show the same PNGs) is drawn for
    the column: at 1280 px it is shown at its natural size (at least 97 % of it), so its text,
    which matplotlib was given at tokenflow.viz.style.MIN_FONT_PT or more
    (tests/test_viz_figure_text.py), is at body size (10 pt at 120 px per inch: 16.7 px); at
    390 px (a phone) the same text is still at least 7 px high."""
    from tokenflow.viz.style import MIN_FONT_PT
    text_px = MIN_FONT_PT / 72 * 120
    small, phone, count = [], [], 0
    for f in toc_pages():
        page, _ = tab.open(server, f"{f}.html")
        for fig in page.evaluate(FIGURES_JS):
            count += 1
            if fig["shown"] < 0.97 * fig["natural"]:
                small.append(f"{f}: {fig['src']} {fig['natural']:.0f} px shown at "
                             f"{fig['shown']:.0f} px in a {fig['column']:.0f} px column")
        page.set_viewport_size({"width": 390, "height": 844})
        for fig in page.evaluate(FIGURES_JS):
            px = text_px * fig["shown"] / fig["natural"]
            if px < 7:
                phone.append(f"{f}: {fig['src']} text {px:.1f} px at 390 px")
    print(f"\n{count} figures; at 1280 px {count - len(small)} at natural size")
    assert count > 25, count                       # 35 figures shown at their first setting
    assert not small + phone, "\n".join(small + phone)
