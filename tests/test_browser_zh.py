"""The Chinese edition read in headless Chromium, like tests/test_browser.py reads the English
one (its own file so that pytest-xdist runs the two in parallel): the zh/ build served next to
the English build, every page checked, the language switch followed, and a search for 首都.
"""
from __future__ import annotations

import pytest

from test_browser import (BOXES, CHECKS_JS, DESKTOP_TEXT_PX, EXPLORE_JS,  # noqa: F401
                          FIGURES_JS, GLYPHS_JS, LAYOUT_JS, ROOT, _explore_ok, book_pdf,
                          glyph_problems, layout_problems, no_web_font, pdf_report,
                          reading_size_problems, serve, tab, toc_pages)


@pytest.fixture(scope="module")
def server(book_html_dir, zh_html_dir):
    """The English build, with the Chinese edition in its zh/ folder, on 127.0.0.1."""
    yield from serve(book_html_dir)


@pytest.fixture(scope="module")
def walked(tab, server, zh_html_dir) -> dict:
    """Every page of the Chinese edition read once, for the tests below: page -> its checks
    (CHECKS_JS), glyphs (tests/glyphs.js, read first), explorer moves, the problems of its
    language switch and its log up to the switch; the figures' sizes
    (tests/test_browser.py FIGURES_JS) and its wide tables and diagrams (LAYOUT_JS) at 1280 px
    and at 390 px, and how far the page scrolls sideways at 390 px."""
    no_web_font(tab.page)
    walked = {}
    for f in toc_pages():
        page, log = tab.open(server, f"zh/{f}.html")
        res = {"glyphs": page.evaluate(GLYPHS_JS), "checks": page.evaluate(CHECKS_JS, BOXES),
               "figures": page.evaluate(FIGURES_JS), "layout": page.evaluate(LAYOUT_JS),
               "switch": []}
        # (no transitions: the sidebars are gone at once)
        page.add_style_tag(content="*, *::before, *::after {transition: none !important}")
        page.set_viewport_size({"width": 390, "height": 900})
        res["figures_phone"] = page.evaluate(FIGURES_JS)
        res["layout_phone"] = page.evaluate(LAYOUT_JS)
        res["phone_overflow"] = page.evaluate(
            "() => document.scrollingElement.scrollWidth - innerWidth")
        page.set_viewport_size({"width": 1280, "height": 900})
        res["moves"] = page.evaluate(EXPLORE_JS)
        switch = page.locator("a.tokenflow-language-switch")
        if switch.count() != 1:
            res["switch"].append(f"{switch.count()} language switches")
        else:
            # up to the English page's response, not its whole load (which the English
            # browser test pays for and checks)
            with page.expect_navigation(wait_until="commit") as nav:
                switch.click()
            status = nav.value.status if nav.value else None
            if status != 200 or not page.url.endswith(f"/{f}.html") or "/zh/" in page.url:
                res["switch"].append(f"switch went to {page.url} (HTTP {status})")
        res["errors"] = log["errors"] + log["blocked"]   # up to the switch (the tab moves on)
        walked[f"zh/{f}"] = res
    return walked


def test_every_chinese_page_in_chromium(walked, tab, server):
    """The Chinese edition (built into zh/ of the served English build): every page has no
    console errors or blocked requests, loads its images, typesets its math, moves its
    explorers, and its language switch opens the same page of the English edition (the
    English page answers 200; tests/test_browser.py checks what it shows); searching for 首都
    finds pages (jieba segments the Chinese index)."""
    problems, counts = [], {"pages": 0, "sliders_moved": 0, "equations": 0}
    for f, res in walked.items():
        r, moves = res["checks"], res["moves"]
        problems += [f"{f}: {e}" for e in res["switch"] + res["errors"]]
        problems += [f"{f}: image not loaded: {u}" for u in r["broken"]]
        problems += [f"{f}: {p}" for p in _explore_ok(moves)]
        if r["math_sources"] and (r["equations"] < r["math_sources"] or r["math_errors"]):
            problems.append(f"{f}: math {r['equations']} of {r['math_sources']} typeset")
        counts["pages"] += 1
        counts["sliders_moved"] += len(moves)
        counts["equations"] += r["equations"]
    page, log = tab.open(server, "zh/search.html?q=%E9%A6%96%E9%83%BD")
    page.wait_for_function("() => document.querySelectorAll('#search-results li').length > 0",
                           timeout=20_000)
    hits = page.locator("#search-results li").count()
    print(f"\nChinese edition: {counts}; search for 首都: {hits} pages")
    assert not problems, "\n".join(problems)
    assert hits >= 3


def test_chinese_figures_are_shown_at_their_reading_size(walked):
    """The Chinese edition's figures (its own PNGs, drawn with Chinese labels), measured as
    tests/test_browser.py's test_figures_are_shown_at_their_reading_size measures the English
    ones: natural size at 1280 px with text at least DESKTOP_TEXT_PX high, at 390 px text at
    least PHONE_TEXT_PX high and no page scrolling sideways, and at both widths the aspect
    ratio of its bitmap."""
    small, count, least = reading_size_problems(walked)
    sideways = [f"{f}: page scrolls sideways by {r['phone_overflow']} px at 390 px"
                for f, r in walked.items() if r["phone_overflow"] > 1]
    print(f"\n{count} figures; smallest text {least[1280]:.1f} px at 1280 px, "
          f"{least[390]:.1f} px at 390 px")
    assert count > 35, count
    assert not small + sideways, "\n".join(small + sideways)
    assert least[1280] >= DESKTOP_TEXT_PX, least


def test_chinese_wide_tables_and_diagrams_scroll_with_a_cue(walked):
    """The Chinese edition's tables and token-flow diagram, checked as tests/test_browser.py's
    test_wide_tables_and_diagrams_scroll_with_a_cue checks the English ones: a table wider than
    its room scrolls with the hint under it, the diagram's labels are legible at 1280 and
    390 px and it is not taller than two screens at 1280 px."""
    problems, seen = layout_problems(walked)
    print(f"\n{seen}")
    assert seen["scrolling tables"] > 20 and seen["diagrams"] == 4, seen
    assert not problems, "\n".join(problems)


def test_no_chinese_page_character_is_drawn_as_a_box(walked):
    """No character of a Chinese page is drawn as the missing-glyph box (tests/glyphs.js,
    measured as tests/test_browser_glyphs.py says)."""
    problems, checked = glyph_problems(walked)
    print(f"\n{len(walked)} pages, {checked} (character, font) pairs drawn")
    assert checked > 1000, "the pages show Chinese characters: the walk found too few"
    assert not problems, "\n".join(problems)


def test_the_chinese_book_prints_on_a4_with_its_glyphs(browser, zh_html_dir):
    """The Chinese edition printed whole, as `make pdf` does (scripts/book_pdf.py): every page
    fits A4 and prints no explorer control; the PDF embeds every font it uses and its text is
    the Chinese of the pages (drawn with the edition's web font: this machine may have no
    Chinese font at all, and the web font covers every character, tests/test_i18n.py)."""
    out = ROOT / "_build" / "print" / "tokenflow-zh.pdf"
    result = book_pdf.print_edition(browser, zh_html_dir, out, toc_pages())
    print("zh A4 pages:", result["pages"], "total", sum(result["pages"].values()))
    assert not result["problems"], "\n".join(result["problems"])
    report = pdf_report(out, ("北京是中国的首", "词元", "注意力与 KV 缓存", "本书正文与插图"))
    assert len(report["outline"]) == len(toc_pages())
    assert report["fonts"] and all(report["fonts"].values()), report["fonts"]
    assert not report["missing"], report["missing"]


def test_the_chinese_chapter_7_model_page_speaks_chinese(tab, server, zh_html_dir):
    from test_browser import model_page_in_book
    shown = model_page_in_book(tab, server, "zh/notebooks/07_simulator_lenses.html")
    assert shown["decode_binding"] in ("显存", "计算", "InfiniBand", "NVLink")
