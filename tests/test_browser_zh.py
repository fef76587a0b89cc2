"""The Chinese edition read in headless Chromium, like tests/test_browser.py reads the English
one (its own file so that pytest-xdist runs the two in parallel): the zh/ build served next to
the English build, every page checked, the language switch followed, and a search for 首都.
"""
from __future__ import annotations

import pytest

from test_browser import (BOXES, CHECKS_JS, EXPLORE_JS, _explore_ok, serve, tab,  # noqa: F401
                          toc_pages)


@pytest.fixture(scope="module")
def server(book_html_dir, zh_html_dir):
    """The English build, with the Chinese edition in its zh/ folder, on 127.0.0.1."""
    yield from serve(book_html_dir)


def test_every_chinese_page_in_chromium(tab, server, zh_html_dir):
    """The Chinese edition (built into zh/ of the served English build): every page has no
    console errors or blocked requests, loads its images, typesets its math, moves its
    explorers, and its language switch opens the same page of the English edition (the
    English page answers 200; tests/test_browser.py checks what it shows); searching for 首都
    finds pages (jieba segments the Chinese index)."""
    problems, counts = [], {"pages": 0, "sliders_moved": 0, "equations": 0}
    for f in toc_pages():
        page, log = tab.open(server, f"zh/{f}.html")
        r = page.evaluate(CHECKS_JS, BOXES)
        moves = page.evaluate(EXPLORE_JS)
        switch = page.locator("a.tokenflow-language-switch")
        if switch.count() != 1:
            problems.append(f"zh/{f}: {switch.count()} language switches")
        else:
            # up to the English page's response, not its whole load (which the English
            # browser test pays for and checks)
            with page.expect_navigation(wait_until="commit") as nav:
                switch.click()
            status = nav.value.status if nav.value else None
            if status != 200 or not page.url.endswith(f"/{f}.html") or "/zh/" in page.url:
                problems.append(f"zh/{f}: switch went to {page.url} (HTTP {status})")
        errors = log["errors"] + log["blocked"]   # up to the switch (the tab moves on)
        problems += [f"zh/{f}: {e}" for e in errors]
        problems += [f"zh/{f}: image not loaded: {u}" for u in r["broken"]]
        problems += [f"zh/{f}: {p}" for p in _explore_ok(moves)]
        if r["math_sources"] and (r["equations"] < r["math_sources"] or r["math_errors"]):
            problems.append(f"zh/{f}: math {r['equations']} of {r['math_sources']} typeset")
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
