"""The built book read in a real browser: headless Chromium (Debian's ``chromium``) driven by
Playwright, every page served from 127.0.0.1 with every other request blocked.

Per page of _toc.yml, at 1280 px: no console errors, no blocked (non-local) requests, every
image loaded, no code or output box wider than its content without a scrollbar, math typeset
by MathJax where the page has math, the sidebar lists every chapter, and each kernel-less
explorer (tokenflow.viz.precomputed_explorer) shows a different output when its controls move.
A full-page screenshot per page at 1280 px and (the same page reflowed) at 390 px goes to
``_build/screenshots/`` as JPEG; at 390 px no page may scroll sideways either.

The book is built once per test run (the ``book_html_dir`` fixture in conftest.py, shared with
tests/test_book.py), and the browser is started once per test process (conftest.py ``browser``:
/usr/bin/chromium, or $TOKENFLOW_CHROMIUM; the Makefile installs Debian's package under CI;
``playwright install`` is not needed, and downloads a browser). The pages of one test file open
one after the other in one tab (:class:`Tab`), which keeps Chromium's caches.
"""
from __future__ import annotations

import functools
import http.server
import threading
from pathlib import Path

import pytest

from helpers import load_script

ROOT = Path(__file__).resolve().parents[1]
SHOTS = ROOT / "_build" / "screenshots"


book_pdf = load_script("book_pdf")
A4_WIDTH_PX, PRINT_JS = book_pdf.A4_WIDTH_PX, book_pdf.PRINT_JS
# the page list and the quiet static server are the PDF script's (one copy)
toc_pages, _Quiet = book_pdf.toc_pages, book_pdf._Quiet
# Boxes that must scroll (not clip) when their content is wider than they are.
BOXES = ("div.cell_input, div.cell_output, div.cell_output .output, div.highlight, "
         "div.highlight pre, div.cell_output pre, .tf-explorer, .tf-table-wrap, "
         "mjx-container[display='true']")


def serve(directory):
    """Serve ``directory`` on ``http://127.0.0.1:<port>/`` (port picked by the OS) in a
    thread; yields the base URL, then stops the server."""
    handler = functools.partial(_Quiet, directory=str(directory))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/"
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture(scope="module")
def server(book_html_dir):
    """The built book on 127.0.0.1 (:func:`serve`)."""
    yield from serve(book_html_dir)


@pytest.fixture(scope="module")
def tab(browser):
    """One :class:`Tab` for the pages of this test file, in a context of its own."""
    ctx = browser.new_context(viewport={"width": 1280, "height": 900})
    yield Tab(ctx.new_page())
    ctx.close()


class Tab:
    """A browser tab that opens the pages of a test file one after the other. Reusing one tab
    keeps Chromium's renderer process and its caches (compiled scripts, fonts, decoded images):
    about half the CPU time per page of a new tab each time. Each :meth:`open` starts as a new
    tab would: 1280 x 900 px, an empty sessionStorage, a fresh log."""

    def __init__(self, page):
        self.page, self.base = page, ""
        self.log: dict = {"errors": [], "blocked": []}
        page.add_init_script("try { sessionStorage.clear() } catch (e) {}")
        page.on("request", self._request)
        page.on("console", lambda m: m.type == "error" and self.log["errors"].append(
            f"console: {m.text} @ {m.location.get('url', '')}"))
        page.on("pageerror", lambda e: self.log["errors"].append(f"pageerror: {e}"))
        page.on("response", lambda r: r.status >= 400 and self.log["errors"].append(
            f"HTTP {r.status}: {r.url}"))

    def _request(self, r):
        if not r.url.startswith(self.base) and not r.url.startswith(("data:", "blob:")):
            self.log["blocked"].append(r.url)

    def open(self, base: str, path: str):
        """``base + path`` loaded, its widgets drawn, its fonts and math ready; returns (page,
        log) where log has ``errors`` (console errors, page errors, failed loads) and
        ``blocked``: every request for anything not under ``base`` (the browser resolves no
        host name but 127.0.0.1, so they cannot reach the network; see conftest.py
        ``browser``)."""
        page = self.page
        if base != self.base:
            page.goto("about:blank")             # the last page, from another server, stops
        self.base, self.log = base, {"errors": [], "blocked": []}
        page.set_viewport_size({"width": 1280, "height": 900})
        page.goto(base + path, wait_until="load")
        page.wait_for_function(WIDGETS_DRAWN, timeout=15_000)   # widgets drawn, fonts fetched
        page.evaluate("() => document.fonts.ready.then(() => null)")
        page.evaluate(
            "() => (window.MathJax && MathJax.startup && MathJax.startup.promise) || null")
        return page, self.log


WIDGETS_DRAWN = """() => !document.querySelector(
    'script[type="application/vnd.jupyter.widget-view+json"]')
  || document.querySelectorAll('.jupyter-widgets').length > 0"""

CHECKS_JS = """(boxes) => {
  const imgs = [...document.querySelectorAll('img')];
  const clipped = [...document.querySelectorAll(boxes)].filter(e => {
      const o = getComputedStyle(e).overflowX;
      return e.scrollWidth > e.clientWidth + 1 && o !== 'auto' && o !== 'scroll';
  }).map(e => e.className + ': ' + e.scrollWidth + ' > ' + e.clientWidth + ' px; '
                + (e.innerText || '').slice(0, 60));
  const nav = [...document.querySelectorAll('.bd-sidebar-primary nav a.reference.internal')];
  return {
    images: imgs.length,
    broken: imgs.filter(i => !(i.complete && i.naturalWidth > 0)).map(i => i.src.slice(0, 80)),
    clipped: clipped,
    math_sources: document.querySelectorAll('.math, span.math, div.math').length,
    equations: document.querySelectorAll('mjx-container').length,
    math_errors: document.querySelectorAll('mjx-merror').length,
    nav: nav.map(a => new URL(a.href).pathname),
    page_overflow: document.scrollingElement.scrollWidth - window.innerWidth,
    explorers: document.querySelectorAll('.tf-explorer').length,
  };
}"""

# Move every control of every explorer (to its last value, or its first when it is already
# at the last), one at a time; after each move
# exactly one output must be visible and it must differ from the one shown before.
EXPLORE_JS = """() => {
  const visible = x => [...x.querySelectorAll('.tf-out')].filter(o => o.style.display !== 'none');
  const moves = [];
  for (const x of document.querySelectorAll('.tf-explorer')) {
    for (const c of x.querySelectorAll('[data-tf-ctl]')) {
      const before = visible(x).map(o => o.getAttribute('data-key'));
      const last = String((c.tagName === 'SELECT' ? c.options.length : (+c.max + 1)) - 1);
      // to the last value, or to the first when the control already shows the last one
      c.value = c.value === last ? '0' : last;
      c.dispatchEvent(new Event('input', {bubbles: true}));
      const after = visible(x);
      moves.push({before: before, after: after.map(o => o.getAttribute('data-key')),
                  shown: after.length === 1 && after[0].getBoundingClientRect().height > 0});
    }
  }
  return moves;
}"""


def _explore_ok(moves) -> list[str]:
    return [f"explorer move {m}" for m in moves
            if not (m["shown"] and len(m["before"]) == 1 and m["after"] != m["before"])]


GLYPHS_JS = (Path(__file__).with_name("glyphs.js")).read_text(encoding="utf-8")

# Every figure of a page as drawn: its intended CSS width (the width matplotlib drew it at: the
# inline style myst-nb writes, or the width attribute of an explorer's <img>), its displayed box
# and its bitmap's pixels, and whether it is an explorer's (tokenflow.viz.static: PNG_DPI) or
# an inline figure (the kernel's retina PNG: twice figure.dpi).
FIGURES_JS = """() => [...document.querySelectorAll('.bd-article img')]
  .filter(i => i.naturalWidth > 0 && /\\.png|image\\/png/.test(i.src)
               && i.getClientRects().length > 0)      // shown (not an explorer's other setting)
  .map(i => { const r = i.getBoundingClientRect();
    return {src: i.getAttribute('src').slice(-24),
            natural: parseFloat(i.style.width) || +i.getAttribute('width') || i.naturalWidth / 2,
            shown: r.width, height: r.height, pixels: [i.naturalWidth, i.naturalHeight],
            explorer: i.closest('.tf-explorer') !== null,
            column: i.closest('.bd-article').getBoundingClientRect().width}; })"""

# The page's wide content at the current width, after the layout has settled (two frames, and
# the Mermaid diagrams drawn): every shown table whose content is wider than its room, the
# element that overflows (the table itself or a box around it), whether that element scrolls,
# and whether a scroll hint (scripts/book_html.py) is shown after its box; and each Mermaid
# diagram's drawn size and the smallest of its labels' text heights (CSS px, as displayed).
LAYOUT_JS = """async () => {
  const frame = () => new Promise(r => requestAnimationFrame(() => r()));
  for (let i = 0; i < 300 && [...document.querySelectorAll('pre.tokenflow-mermaid')]
       .some(p => !p.querySelector('svg')); i++) await frame();
  await frame(); await frame();
  const tables = [];
  for (const t of document.querySelectorAll('.bd-article table')) {
    if (!t.checkVisibility() || t.getBoundingClientRect().width === 0) continue;
    let e = t;
    while (e && !e.matches('.bd-article') && e.scrollWidth <= e.clientWidth + 1)
      e = e.parentElement;
    if (!e || e.matches('.bd-article')) continue;                // it fits
    const o = getComputedStyle(e).overflowX, box = e.closest('.tf-scroll-box, .tf-figure');
    const hint = box && box.nextElementSibling;
    tables.push({box: e.className || e.tagName, content: e.scrollWidth, room: e.clientWidth,
                 scrolls: o === 'auto' || o === 'scroll',
                 hint: !!(hint && hint.matches('.tf-figure-hint') && hint.checkVisibility()),
                 text: (t.innerText || '').trim().slice(0, 40)});
  }
  const diagrams = [...document.querySelectorAll('pre.tokenflow-mermaid svg')].map(svg => {
    const r = svg.getBoundingClientRect(), scale = r.width / svg.viewBox.baseVal.width;
    const sizes = [...svg.querySelectorAll('.nodeLabel, .edgeLabel, text')]
      .filter(e => (e.textContent || '').trim())
      .map(e => parseFloat(getComputedStyle(e).fontSize) * scale);
    const box = svg.closest('pre'), hint = box.nextElementSibling;
    return {width: r.width, height: r.height, labels: sizes.length,
            least_px: Math.min(...sizes),
            clipped: box.scrollWidth > box.clientWidth + 1 &&
                     !(hint && hint.matches('.tf-figure-hint') && hint.checkVisibility())};
  });
  return {tables: tables, diagrams: diagrams};
}"""

DIAGRAM_TEXT_PX = 10
"""The least height of a Mermaid diagram's label text, at 1280 px and on a 390 px phone."""

DIAGRAM_MAX_HEIGHT = 1700
"""The most CSS px a Mermaid diagram may be tall at 1280 px (under two 900 px screens)."""


def layout_problems(walked: dict) -> tuple[list[str], dict]:
    """At 1280 and 390 px (``layout`` and ``layout_phone`` of each page read): every table
    whose content is wider than its room scrolls in its own box, with the scroll hint shown
    under it (a table cut mid-word with no cue is a problem); every Mermaid diagram's labels
    are at least :data:`DIAGRAM_TEXT_PX` high, a diagram wider than its box shows the hint,
    and at 1280 px it is at most :data:`DIAGRAM_MAX_HEIGHT` tall. Returns the problems and
    counts (tables that scroll, diagrams, their least label px and greatest height)."""
    problems, seen = [], {"scrolling tables": 0, "diagrams": 0, "least label px": 99.0,
                          "tallest diagram px": 0.0}
    for f, res in walked.items():
        for width, key in ((1280, "layout"), (390, "layout_phone")):
            for t in res[key]["tables"]:
                seen["scrolling tables"] += 1
                if not (t["scrolls"] and t["hint"]):
                    problems.append(f"{f} at {width} px: table {t['text']!r} is "
                                    f"{t['content']} px in {t['room']} px ({t['box']}), "
                                    f"scrolls {t['scrolls']}, hint shown {t['hint']}")
            for d in res[key]["diagrams"]:
                seen["diagrams"] += 1
                seen["least label px"] = min(seen["least label px"], d["least_px"])
                if width == 1280:
                    seen["tallest diagram px"] = max(seen["tallest diagram px"], d["height"])
                if not d["labels"] or d["least_px"] < DIAGRAM_TEXT_PX:
                    problems.append(f"{f} at {width} px: diagram labels {d['least_px']:.1f} px "
                                    f"({d['labels']} labels)")
                if d["clipped"]:
                    problems.append(f"{f} at {width} px: diagram wider than its box, no hint")
                if width == 1280 and d["height"] > DIAGRAM_MAX_HEIGHT:
                    problems.append(f"{f}: diagram {d['height']:.0f} px tall at 1280 px")
    return problems, seen


FIGURE_DPI = 120
"""figure.dpi of the chapters (tokenflow.viz.setup_notebook): an inline figure's PNG has twice
as many pixels per inch (retina)."""


def figure_text_px(fig: dict) -> float:
    """The height on the screen, in CSS px, of a figure's smallest text
    (tokenflow.viz.style.MIN_FONT_PT points): points -> the bitmap's pixels (its resolution)
    -> the displayed box, whichever of its width and height is shrunk more."""
    from tokenflow.viz.static import PNG_DPI
    from tokenflow.viz.style import MIN_FONT_PT
    dpi = PNG_DPI if fig["explorer"] else 2 * FIGURE_DPI
    scale = min(fig["shown"] / fig["pixels"][0], fig["height"] / fig["pixels"][1])
    return MIN_FONT_PT / 72 * dpi * scale


PHONE_TEXT_PX = 10
"""The least height of figure text on a 390 px phone."""

DESKTOP_TEXT_PX = 16
"""The least height of figure text at 1280 px: 10 pt at 120 px per inch is 16.7 px (the body
text's size), less the 3 % a figure may be shrunk by."""


def reading_size_problems(walked: dict) -> tuple[list[str], int, dict]:
    """The figures of the pages read that are shown below their natural width at 1280 px,
    whose text is under :data:`PHONE_TEXT_PX` at 390 px, or whose displayed height / width
    differs from their bitmap's by more than 2 % at either width; the number of figures at
    1280 px; the smallest text (px) at each width."""
    small, least = [], {1280: float("inf"), 390: float("inf")}
    count = 0
    for f, res in walked.items():
        for fig in res["figures"]:
            count += 1
            least[1280] = min(least[1280], figure_text_px(fig))
            if fig["shown"] < 0.97 * fig["natural"]:
                small.append(f"{f}: {fig['src']} {fig['natural']:.0f} px shown at "
                             f"{fig['shown']:.0f} px in a {fig['column']:.0f} px column")
        for width, key in ((1280, "figures"), (390, "figures_phone")):
            for fig in res[key]:
                # (displayed height / width against the bitmap's: an inline height kept while
                # the width shrinks squashes the figure)
                ratio = (fig["height"] / fig["shown"]) / (fig["pixels"][1] / fig["pixels"][0])
                if abs(ratio - 1) > 0.02:
                    small.append(f"{f}: {fig['src']} at {width} px shown {fig['shown']:.0f} x "
                                 f"{fig['height']:.0f} px, its aspect ratio off by "
                                 f"{100 * (ratio - 1):+.0f} %")
        for fig in res["figures_phone"]:
            px = figure_text_px(fig)
            least[390] = min(least[390], px)
            if px < PHONE_TEXT_PX:
                small.append(f"{f}: {fig['src']} text {px:.1f} px at 390 px "
                             f"({fig['shown']:.0f} of {fig['natural']:.0f} px)")
    return small, count, least


def no_web_font(page) -> None:
    """With $TOKENFLOW_NO_WEB_FONT set, the book's web font stylesheet answers empty and the
    slides' inline @font-face rules are dropped: what a build without the fonts shows (the
    glyph checks then fail on every page with Chinese)."""
    import os
    if os.environ.get("TOKENFLOW_NO_WEB_FONT"):
        page.route("**/tokenflow-zh-font.css*",
                   lambda r: r.fulfill(body="", content_type="text/css"))
        page.add_init_script("""document.addEventListener('DOMContentLoaded', () => {
            for (const s of document.querySelectorAll('style'))
              s.textContent = s.textContent.replace(/@font-face\\s*{[^}]*}/g, '');
            });""")


def read_page(tab: Tab, base: str, path: str, shots: bool = True,
              solutions: bool = False) -> dict:
    """Everything the tests of this file check on one page, read in one load (a page load is
    most of a check's CPU time), in an order where no step changes what a later one reads:

    at 1280 px :data:`CHECKS_JS`, the glyphs (tests/glyphs.js), the figures' sizes, the wide
    tables and diagrams (:data:`LAYOUT_JS`), the full-page screenshot; at 390 px (no
    transitions) the figures' sizes and the wide tables and diagrams again; at 1280 px every
    explorer control moved (:data:`EXPLORE_JS`); at 390 px the sideways scroll and the
    screenshot; the page's log up to there; with ``solutions``, back at 1280 px, each
    solution's state before and after a click on its toggle (:data:`SOLUTIONS_JS`)."""
    page, log = tab.open(base, path)
    out = {"checks": page.evaluate(CHECKS_JS, BOXES), "glyphs": page.evaluate(GLYPHS_JS),
           "figures": page.evaluate(FIGURES_JS), "layout": page.evaluate(LAYOUT_JS)}
    name = path.replace("/", "__").removesuffix(".html")
    if shots:
        page.screenshot(path=str(SHOTS / f"{name}-1280.jpg"), full_page=True, quality=70)
    # the same page reflowed for a phone; no transitions, so the sidebars are gone at once
    page.add_style_tag(content="*, *::before, *::after {transition: none !important}")
    page.set_viewport_size({"width": 390, "height": 900})
    out["figures_phone"] = page.evaluate(FIGURES_JS)
    out["layout_phone"] = page.evaluate(LAYOUT_JS)
    page.set_viewport_size({"width": 1280, "height": 900})
    out["moves"] = page.evaluate(EXPLORE_JS)
    page.set_viewport_size({"width": 390, "height": 900})
    out["phone_overflow"] = page.evaluate(
        "() => document.scrollingElement.scrollWidth - innerWidth")
    if shots:
        page.screenshot(path=str(SHOTS / f"{name}-390.jpg"), full_page=True, quality=70)
    out["log"] = {k: list(v) for k, v in log.items()}
    if solutions:
        page.set_viewport_size({"width": 1280, "height": 900})
        out["solutions"] = read_solutions(page)
    return out


def page_problems(res: dict) -> list[str]:
    """The problems :func:`read_page` found that :func:`test_every_page_in_chromium` reports."""
    r, log, phone_overflow = res["checks"], res["log"], res["phone_overflow"]
    problems = log["errors"] + [f"blocked {u}" for u in log["blocked"]]
    problems += [f"image not loaded: {u}" for u in r["broken"]]
    problems += [f"clipped: {c}" for c in r["clipped"]] + _explore_ok(res["moves"])
    if r["page_overflow"] > 1:
        problems.append(f"page scrolls sideways by {r['page_overflow']} px at 1280 px")
    if phone_overflow > 1:
        problems.append(f"page scrolls sideways by {phone_overflow} px at 390 px")
    if r["math_sources"] and (r["equations"] < r["math_sources"] or r["math_errors"]):
        problems.append(f"math: {r['math_sources']} sources, {r['equations']} typeset, "
                        f"{r['math_errors']} errors")
    want = {"/" + f + ".html" for f in toc_pages()[1:]}
    missing = want - set(r["nav"])
    if missing:
        problems.append(f"sidebar misses {sorted(missing)}")
    return problems


def glyph_problems(walked: dict, prefix: str = "") -> tuple[list[str], int]:
    """The characters drawn as the missing-glyph box on the pages read, at most 8 per page,
    and how many (character, font) pairs were drawn."""
    problems, checked = [], 0
    for path, res in walked.items():
        r = res["glyphs"]
        checked += r["checked"]
        problems += [f"{prefix}{path}: {m}" for m in r["missing"][:8]]
        if len(r["missing"]) > 8:
            problems.append(f"{prefix}{path}: ... {len(r['missing']) - 8} more")
    return problems, checked


@pytest.fixture(scope="module")
def walked(tab, server) -> dict:
    """Every page of _toc.yml read once (:func:`read_page`), for the tests below: page ->
    what was read."""
    no_web_font(tab.page)
    SHOTS.mkdir(parents=True, exist_ok=True)
    return {f: read_page(tab, server, f + ".html", solutions=f.startswith("notebooks/"))
            for f in toc_pages()}


def test_every_page_in_chromium(walked):
    report, problems = {}, []
    for f, res in walked.items():
        r = res["checks"]
        report[f] = {"images": r["images"], "sliders_moved": len(res["moves"]),
                     "equations": r["equations"], "console_errors": len(res["log"]["errors"]),
                     "phone_overflow": res["phone_overflow"]}
        problems += [f"{f}: {p}" for p in page_problems(res)]
    print("\npage                              images  sliders moved  equations  console errors"
          "  sideways px at 390")
    for f, r in report.items():
        print(f"{f:<34}{r['images']:>6}{r['sliders_moved']:>15}{r['equations']:>11}"
              f"{r['console_errors']:>16}{r['phone_overflow']:>20}")
    print(f"screenshots: {SHOTS}")
    assert not problems, "\n".join(problems)


def test_no_character_is_drawn_as_a_box(walked):
    """No Chinese character or emoji of an English page is drawn as the missing-glyph box
    (tests/test_browser_glyphs.py says how it is measured; the Chinese pages:
    tests/test_browser_zh.py)."""
    problems, checked = glyph_problems(walked)
    print(f"\n{len(walked)} pages, {checked} (character, font) pairs drawn")
    assert checked > 100, "the pages show Chinese characters: the walk found too few"
    assert not problems, "\n".join(problems)


def test_figures_are_shown_at_their_reading_size(walked):
    """Every figure of the English edition (tests/test_browser_zh.py: the Chinese one) is drawn
    for the column: at 1280 px it is shown at its natural size (at least 97 % of it), so its
    text, which matplotlib was given at tokenflow.viz.style.MIN_FONT_PT or more
    (tests/test_viz_figure_text.py), is 16.7 px high, an explorer's as an inline figure's
    (both at 120 px per inch; at least :data:`DESKTOP_TEXT_PX`); at 390 px (a phone) the same
    text is still at least :data:`PHONE_TEXT_PX` high (:func:`figure_text_px`, from the size
    each figure is displayed at); at both widths each figure keeps its bitmap's aspect ratio
    (within 2 %); the page does not scroll sideways there
    (:func:`test_every_page_in_chromium`)."""
    small, count, least = reading_size_problems(walked)
    print(f"\n{count} figures; smallest text {least[1280]:.1f} px at 1280 px, "
          f"{least[390]:.1f} px at 390 px")
    assert count > 35, count          # 40 figures shown at their first setting
    assert not small, "\n".join(small)
    assert least[1280] >= DESKTOP_TEXT_PX, least


def test_wide_tables_and_diagrams_scroll_with_a_cue(walked):
    """At 1280 and 390 px no table of the English edition is cut off: one wider than the
    column scrolls in its own box with the scroll hint under it (scripts/book_html.py); the
    token-flow diagram (chapters 0 and 6) is drawn with labels at least
    :data:`DIAGRAM_TEXT_PX` high at both widths (a phone scrolls its box) and is at most
    :data:`DIAGRAM_MAX_HEIGHT` tall at 1280 px (:func:`layout_problems`)."""
    problems, seen = layout_problems(walked)
    print(f"\n{seen}")
    assert seen["scrolling tables"] > 20 and seen["diagrams"] == 4, seen   # 2 pages, 2 widths
    assert not problems, "\n".join(problems)


def test_explorer_works_in_chromium(tab, tmp_path):
    """A page holding only a precomputed explorer (figures and a table), no book around it:
    served locally, moving each control shows a different output, images load, no errors."""
    import matplotlib.pyplot as plt

    from tokenflow.viz import Table, precomputed_explorer

    def fig(head, layer):
        f, ax = plt.subplots(figsize=(3, 2))
        ax.bar([0, 1, 2], [head, layer, head + layer])
        ax.set_title(f"head {head}, layer {layer}")
        return f

    a = precomputed_explorer(fig, {"head": [0, 1, 2], "layer": [0, 1]}, title="figures")
    b = precomputed_explorer(lambda mode: Table([[mode, len(mode)]], ["mode", "chars"]),
                             {"mode": ["prefill", "decode"]}, title="tables")
    (tmp_path / "x.html").write_text(
        # (an icon, as the book has: else Chromium asks for /favicon.ico, a 404 in the console)
        f'<!doctype html><meta charset=utf-8><link rel="icon" href="data:,">'
        f"<body>{a._repr_html_()}{b._repr_html_()}</body>",
        encoding="utf-8")
    handler = functools.partial(_Quiet, directory=str(tmp_path))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        base = f"http://127.0.0.1:{httpd.server_address[1]}/"
        page, log = tab.open(base, "x.html")
        imgs = page.evaluate("() => [...document.images].map(i => i.naturalWidth)")
        # scripts run here: controls and the "precomputed" note shown, "run this cell" hidden
        shown = page.evaluate("""() => [...document.querySelectorAll('.tf-explorer')].map(x =>
            ['.tf-controls', '.tf-note-live', '.tf-note-run'].map(
                s => x.querySelector(s).checkVisibility()))""")
        moves = page.evaluate(EXPLORE_JS)
        page.goto("about:blank")                 # before its server stops
    finally:
        httpd.shutdown()
        httpd.server_close()
    assert shown == [[True, True, False]] * 2, shown
    assert len(imgs) == 6 and min(imgs) > 0
    assert len(moves) == 3 and not _explore_ok(moves), moves
    assert not log["errors"] and not log["blocked"], log


# Every solution cell of a chapter (class tag_solution, set by scripts/fold_solutions.py): how
# many outputs it has and how many of them (and of its code boxes) take space on the screen.
SOLUTIONS_JS = """() => {
  // (a closed <details> skips its content's rendering, but getBoundingClientRect still lays it
  // out; checkVisibility() answers what is drawn)
  const shown = e => { const r = e.getBoundingClientRect();
                       return r.width > 0 && r.height > 0 && e.checkVisibility(
                           {visibilityProperty: true, opacityProperty: true}); };
  return [...document.querySelectorAll('.cell.tag_solution')].map(c => ({
    outputs: c.querySelectorAll('.cell_output').length,
    shown: [...c.querySelectorAll('.cell_output, .cell_input')].filter(shown).length,
    text: (c.querySelector('.cell_output') || {textContent: ''}).textContent.trim().slice(0, 40),
  }));
}"""


def read_solutions(page) -> dict:
    """The page's solution cells before and after a click on each toggle, and how many prose
    solution dropdowns are open on load (for :func:`test_solutions_hidden_until_opened`)."""
    before = page.evaluate(SOLUTIONS_JS)
    open_prose = page.evaluate("() => [...document.querySelectorAll('details.sd-dropdown')]"
                               ".filter(d => d.open).length")
    for summary in page.query_selector_all(".cell.tag_solution > details > summary"):
        summary.click()
    try:  # (myst-nb fades the opened content in)
        page.wait_for_function(
            f"() => ({SOLUTIONS_JS})().every(s => s.shown === 2 * s.outputs)", timeout=5_000
        )
    except Exception:
        pass
    return {"before": before, "open_prose": open_prose, "after": page.evaluate(SOLUTIONS_JS)}


def test_solutions_hidden_until_opened(walked):
    """In every chapter, no solution's code or output takes space on the page before its toggle
    is opened (the prose dropdown before it stays closed too); after a click on each toggle
    its code and its output are shown."""
    import json
    problems, counts = [], {}
    for f, res in walked.items():
        if not f.startswith("notebooks/"):
            continue
        nb = json.loads((ROOT / f"{f}.ipynb").read_text(encoding="utf-8"))
        want = sum("solution" in c.get("metadata", {}).get("tags", []) for c in nb["cells"]
                   if c["cell_type"] == "code")
        before, after = res["solutions"]["before"], res["solutions"]["after"]
        if len(before) != want or not all(s["outputs"] for s in before):
            problems.append(f"{f}: {len(before)} solution cells with outputs "
                            f"{[s['outputs'] for s in before]}, the notebook has {want}")
        problems += [f"{f}: solution {i + 1} shown before opening: {s['text']!r}"
                     for i, s in enumerate(before) if s["shown"]]
        if res["solutions"]["open_prose"]:
            problems.append(f"{f}: {res['solutions']['open_prose']} solution dropdowns open "
                            f"on load")
        problems += [f"{f}: solution {i + 1} still hidden after opening"
                     for i, s in enumerate(after) if s["shown"] != 2 * s["outputs"]]
        counts[f] = len(before)
    print("solution cells per chapter:", counts)
    assert sum(counts.values()) >= 30 and not problems, "\n".join(problems)


# The A4 print check (scripts/book_pdf.py, which `make pdf` runs): printed on A4 with 10 mm side
# margins the page is 190 mm = 718 CSS px wide, and in print media nothing may stick out of that
# width or be cut by its box. tests/test_slides.py checks the handout with the same PRINT_JS.



def pdf_report(path: Path, words: tuple[str, ...] = ()) -> dict:
    """What a printed book holds (pypdf): its pages, outline titles, fonts with whether each is
    embedded, and ``missing``: those of ``words`` its text lacks (whitespace runs read as one
    space; the pages' text is extracted in order only until every word is found, text
    extraction being most of the CPU time)."""
    from pypdf import PdfReader
    reader = PdfReader(path)
    fonts = {}
    for pg in reader.pages:
        for font in (pg.get("/Resources") or {}).get("/Font", {}).values():
            font = font.get_object()
            name = str(font.get("/BaseFont", font.get("/Name", "?")))
            desc = font
            if font.get("/Subtype") == "/Type0":
                desc = font["/DescendantFonts"][0].get_object()
            desc = (desc.get("/FontDescriptor") or {})
            desc = desc.get_object() if hasattr(desc, "get_object") else desc
            embedded = font.get("/Subtype") == "/Type3" or any(
                k in desc for k in ("/FontFile", "/FontFile2", "/FontFile3"))
            fonts[name] = fonts.get(name, True) and embedded
    text, missing = "", list(words)
    for pg in reader.pages:
        if not missing:
            break
        text += pg.extract_text() or ""
        flat = " ".join(text.split())
        missing = [w for w in missing if w not in flat]
    return {"pages": len(reader.pages), "outline": [o.title for o in reader.outline],
            "fonts": fonts, "missing": missing}


def test_pages_print_on_a4(browser, book_html_dir):
    """Every page in print media at A4 width: nothing cut or sticking out (trace tables wrap
    their note column, code wraps, figures and explorers fit), no explorer control printed;
    the pages, printed to A4 in the order of _toc.yml, make one PDF, _build/print/tokenflow.pdf
    (what `make pdf` writes): an outline entry per page, every font embedded, the running
    example in its text."""
    out = ROOT / "_build" / "print" / "tokenflow.pdf"
    result = book_pdf.print_edition(browser, book_html_dir, out, toc_pages())
    print("A4 pages:", result["pages"], "total", sum(result["pages"].values()))
    assert not result["problems"], "\n".join(result["problems"])
    assert list(result["pages"]) == toc_pages() and all(n >= 1 for n in result["pages"].values())
    report = pdf_report(out, ("北京是中国的首", "Attention and the KV cache",
                              "licensed under CC BY 4.0"))
    assert report["pages"] == sum(result["pages"].values())
    assert len(report["outline"]) == len(toc_pages())
    assert report["fonts"] and all(report["fonts"].values()), report["fonts"]
    assert not report["missing"], report["missing"]


def model_page_in_book(tab, base: str, path: str) -> dict:
    """Chapter 7 of a built edition: its model page drawn, the default setting's numbers
    (DeepSeek-V3 on an H800, FP8, 64 x 4,096, EP32) as the Python prints them, no console
    error; returns the shown numbers by key."""
    from tokenflow.analysis.costmodel import reference_config
    from tokenflow.viz.model_page import fmt_bytes, fmt_si, page_numbers
    page, log = tab.open(base, path)
    assert page.locator(".tf-model-page[data-mounted]").count() == 1, f"{path}: no model page"
    shown = page.evaluate("""() => Object.fromEntries([...document.querySelectorAll(
        '.tf-model-page [data-k]')].map(e => [e.dataset.k, e.textContent]))""")
    r = page_numbers(reference_config("DeepSeek-V3"), "H800", "fp8", 64, 4096, 1, 32)
    for k, unit in (("weights", "B"), ("kv_cache", "B"), ("params_total", ""),
                    ("decode_tokens_per_s", "tok/s"), ("prefill_tokens_per_s", "tok/s")):
        want = fmt_bytes(r[k]) if unit == "B" else fmt_si(r[k], unit)
        assert shown[k] == want, f"{path}: {k} {shown[k]!r}"
    assert shown["vocab_logits"] == "129,280" and not log["errors"] and not log["blocked"], log
    return shown


def test_chapter_7_opens_on_the_model_page(tab, server):
    shown = model_page_in_book(tab, server, "notebooks/07_simulator_lenses.html")
    assert shown["decode_binding"] in ("memory", "compute", "InfiniBand", "NVLink")


# Each figure box of a page (scripts/book_html.py FIGURE_JS) as drawn: whether its content is
# wider than the box (measured here, not read from the class the script sets), whether the hint
# after it is drawn, and the image's natural width (its --tf-figure-width) and shown width.
FIGURE_BOXES_JS = """() => [...document.querySelectorAll('.bd-article .tf-figure')]
  .filter(b => b.getClientRects().length > 0)
  .map(b => { const h = b.nextElementSibling, img = b.querySelector('img');
    return {scrolls: b.scrollWidth - b.clientWidth > 1,
            hint: !!h && h.classList.contains('tf-figure-hint') && h.checkVisibility(),
            natural: parseFloat(img.style.width) || +img.getAttribute('width'),
            shown: img.getBoundingClientRect().width,
            explorer: img.closest('.tf-out') !== null}; })"""

SETTLED = "() => new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))"


@pytest.mark.parametrize("path", ["notebooks/03_ffn_moe.html"])
def test_the_scroll_hint_shows_under_a_figure_only_while_it_scrolls(tab, server, path):
    """At 1280 px no figure box scrolls and no hint is drawn; at 390 px (a phone) some boxes
    scroll sideways, exactly those show the hint, the page itself does not scroll, and
    back at 1280 px the hints are gone again."""
    page, log = tab.open(server, path)
    page.evaluate(SETTLED)
    desk = page.evaluate(FIGURE_BOXES_JS)
    page.set_viewport_size({"width": 390, "height": 900})
    page.evaluate(SETTLED)
    phone = page.evaluate(FIGURE_BOXES_JS)
    overflow = page.evaluate("() => document.scrollingElement.scrollWidth - innerWidth")
    page.set_viewport_size({"width": 1280, "height": 900})
    page.evaluate(SETTLED)
    back = page.evaluate(FIGURE_BOXES_JS)
    assert any(not b["explorer"] for b in desk) and any(b["explorer"] for b in desk), desk
    assert not any(b["scrolls"] or b["hint"] for b in desk + back), desk + back
    assert any(b["scrolls"] for b in phone), phone
    assert [b["hint"] for b in phone] == [b["scrolls"] for b in phone], phone
    assert all(b["shown"] < b["natural"] + 1 for b in phone), phone   # never above natural
    assert overflow <= 1, overflow
