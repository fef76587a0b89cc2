"""The teaching kit: a slide deck per chapter and an A4 handout, built with the book
(scripts/slides.py runs as a Sphinx extension in both editions' builds), read in headless
Chromium (conftest.py ``browser``, one tab for every deck).

Every deck of both editions, opened from its file with nothing else reachable: at least 4
slides; each slide, reached with the arrow key, keeps every element inside its box (no text
under body size: a table too big for one slide is split over several); every figure loaded;
the numbers on its "What you can now say" slides are the ones the notebook stored in that
section (read here from the .ipynb); its Chinese characters are drawn with the book's web
font, which has a glyph for each.
The handout prints on A4: one PDF page per sheet of two slides, 2 to 4 pages a chapter, and
nothing wider than the printable width or cut by its box (tests/test_browser.py's print check).
"""
from __future__ import annotations

import base64
import io
import json
import re
import time
from pathlib import Path

import pytest
from test_browser import A4_WIDTH_PX, PRINT_JS

from helpers import load_script

ROOT = Path(__file__).resolve().parents[1]


def _script(name: str):
    return load_script(name)


slides = _script("slides")

CHAPTERS = sorted(p.stem for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
NUMBERS_HEADINGS = ("What you can now say with numbers", "In a few sentences",
                    "现在你能用数字说清楚的事", "现在可以用数字说清的事", "几句话总结")
NUMBER = re.compile(r"\d+(?:[.,]\d+)*(?:e-?\d+)?")
CJK = re.compile(r"[\u2e80-\u9fff\uf900-\ufaff\ufe30-\ufe4f\uff00-\uffef]")
MIN_SLIDES = 4
PAGES_PER_CHAPTER = (2, 5)      # A4 pages of a chapter on the handout (3 to 8 slides + prompts)
KIT_SHEETS = 2                  # the diagram and the cheat sheet, before the chapters
CHEAT_SHEET_DIAGRAM_PT = 8      # the least text size of the cheat sheet's diagram on A4


def notebook_numbers(chapter: str, edition: str = "en") -> list[str]:
    """The numbers the notebook prints in its "What you can now say with numbers" (or "In a
    few sentences") section, in order: the stdout of its code cells, except those nbval does
    not compare (timings of this machine). ``zh``: the Chinese notebook's (notebooks/zh/)."""
    folder = ROOT / "notebooks" / ("zh" if edition == "zh" else "")
    cells = json.loads((folder / f"{chapter}.ipynb").read_text(encoding="utf-8"))["cells"]
    inside, text = False, ""
    for cell in cells:
        src = "".join(cell["source"])
        if cell["cell_type"] == "markdown":
            heads = [
                line.lstrip("#").strip() for line in src.splitlines() if line.startswith("## ")
            ]
            inside = heads[-1] in NUMBERS_HEADINGS if heads else inside
        elif inside and "nbval-ignore-output" not in cell["metadata"].get("tags", []):
            text += "".join("".join(o["text"]) for o in cell.get("outputs", [])
                            if o["output_type"] == "stream")
    return NUMBER.findall(text)


def font_gaps(deck_html: str) -> str:
    """The CJK characters of a deck's text that its inline font has no glyph for."""
    from fontTools.ttLib import TTFont
    m = re.search(r"url\(data:font/woff2;base64,([A-Za-z0-9+/=]+)\)", deck_html)
    text = re.sub(r"data:[^\"')]+", "", re.sub(r"<style>.*?</style>|<script>.*?</script>", "",
                                                deck_html, flags=re.DOTALL))
    chars = set(CJK.findall(re.sub(r"<[^>]+>", "", text)))
    if not m:
        return "".join(sorted(chars))
    cmap = TTFont(io.BytesIO(base64.b64decode(m.group(1))))["cmap"].getBestCmap()
    return "".join(sorted(c for c in chars if ord(c) not in cmap))


# Each slide shown in turn (the deck's own show()): every element inside the slide's box, and
# the slide's fitting factor.
SLIDES_JS = """() => [...document.querySelectorAll('.slide')].map((s, k) => {
  window.tokenflowDeck.show(k);
  const r = s.getBoundingClientRect();
  const out = [...s.querySelectorAll('*')].filter(e => {
    const q = e.getBoundingClientRect();
    return q.left < r.left - 1 || q.right > r.right + 1 || q.top < r.top - 1
      || q.bottom > r.bottom + 1;
  }).map(e => `${e.tagName.toLowerCase()}.${e.className}: ${(e.innerText || '').slice(0, 40)}`);
  return {shown: s.checkVisibility(), kind: s.dataset.kind, out: out.slice(0, 5),
          k: parseFloat(s.style.getPropertyValue('--k') || '1'),
          scroll: s.scrollHeight > s.clientHeight + 1 || s.scrollWidth > s.clientWidth + 1};
})"""
DECK_JS = """() => ({
  count: window.tokenflowDeck.count,
  images: [...document.images].map(i => i.complete && i.naturalWidth > 0),
  numbers: [...document.querySelectorAll('.slide[data-kind="numbers"] .body > *')]
      .map(p => p.textContent).join('\\n'),
  title: document.querySelector('.slide h1').textContent,
})"""


@pytest.fixture(scope="module")
def page(browser):
    """One tab at 1280 x 720 (a slide's own size) that records every request that is not for
    a file: or data: URL (the browser cannot reach a network anyway, conftest.py)."""
    ctx = browser.new_context(viewport={"width": slides.WIDTH, "height": slides.HEIGHT})
    p = ctx.new_page()
    p.requests = []
    p.on("request", lambda r: r.url.startswith(("file:", "data:")) or p.requests.append(r.url))
    p.errors = []
    p.on("pageerror", lambda e: p.errors.append(str(e)))
    p.on("console", lambda m: m.type == "error" and p.errors.append(m.text))
    yield p
    ctx.close()


def check_deck(page, path: Path, chapter: str, edition: str = "en") -> tuple[list[str], dict]:
    """The problems of one deck, and what it shows (DECK_JS)."""
    html_text = path.read_text(encoding="utf-8")
    problems = [f"refers to {u}" for u in re.findall(r"(?:https?:)?//[\w.-]+\.\w+", html_text)]
    gaps = font_gaps(html_text)
    if gaps:
        problems.append(f"no glyph in the deck's font for {gaps!r}")
    page.requests.clear()
    page.errors.clear()
    page.goto(path.as_uri() + "#1", wait_until="load")
    page.wait_for_function("() => window.tokenflowDeck !== undefined")
    page.evaluate("() => document.fonts.ready.then(() => null)")
    deck = page.evaluate(DECK_JS)
    if deck["count"] < MIN_SLIDES:
        problems.append(f"{deck['count']} slides, want >= {MIN_SLIDES}")
    for k, s in enumerate(page.evaluate(SLIDES_JS)):
        if not s["shown"]:
            problems.append(f"slide {k + 1}: not shown")
        problems += [f"slide {k + 1} ({s['kind']}): sticks out: {o}" for o in s["out"]]
        if s["scroll"] or s["k"] < 0.6 - 1e-9:
            problems.append(f"slide {k + 1} ({s['kind']}): overflows (text at {s['k']:.0%})")
    if not all(deck["images"]) or not deck["images"]:
        problems.append(f"figures loaded: {deck['images']}")
    want, got = notebook_numbers(chapter, edition), NUMBER.findall(deck["numbers"])
    if got != want:
        problems.append(f"numbers differ from the notebook's:\n  deck     {got}\n  notebook {want}")
    page.evaluate("() => document.fonts.ready.then(() => null)")   # every slide was shown
    # the Chinese face loaded; the emoji face (when the decks have emoji) loaded or unused
    font = page.evaluate("() => [...document.fonts].filter(f => f.family.replace(/\"/g, '')"
                         " === 'Tokenflow CJK').map(f => f.status)")
    if not font or font[0] != "loaded" or not set(font[1:]) <= {"loaded", "unloaded"}:
        problems.append(f"web font faces {font}, want the first loaded")
    problems += [f"request {u}" for u in page.requests] + page.errors
    return problems, deck


def test_decks_in_chromium(page, book_html_dir, zh_html_dir):
    """Both editions' decks (module docstring); the Chinese ones have their titles translated."""
    start = time.perf_counter()
    problems, titles, counts = [], {}, {}
    for edition, folder in (("en", book_html_dir / "slides"), ("zh", zh_html_dir / "slides")):
        for chapter in CHAPTERS:
            path = folder / f"{chapter[:2]}.html"
            if not path.is_file():
                problems.append(f"{edition} {chapter}: no deck {path}")
                continue
            found, deck = check_deck(page, path, chapter, edition)
            problems += [f"{edition} {chapter}: {p}" for p in found]
            titles[edition, chapter], counts[edition, chapter] = deck["title"], deck["count"]
    problems += [f"zh {c}: title not translated: {titles['zh', c]!r}" for c in CHAPTERS
                 if ("zh", c) in titles and titles["zh", c] == titles.get(("en", c))]
    print(f"slides per deck: {counts}; {time.perf_counter() - start:.1f} s")
    assert not problems, "\n".join(problems)


def test_deck_keys_and_hash(page, book_html_dir):
    """#N opens slide N; End, Home and the arrow keys move as they say; printed, a deck shows
    every slide."""
    path = book_html_dir / "slides" / "01.html"
    page.goto(path.as_uri() + "#3", wait_until="load")
    page.wait_for_function("() => window.tokenflowDeck !== undefined")
    def now():
        return page.evaluate("() => window.tokenflowDeck.current()")
    seen = [now()]
    for key in ("ArrowRight", "End", "ArrowRight", "ArrowLeft", "Home", "ArrowLeft"):
        page.keyboard.press(key)
        seen.append(now())
    n = page.evaluate("() => window.tokenflowDeck.count")
    assert seen == [2, 3, n - 1, n - 1, n - 2, 0, 0], seen
    page.emulate_media(media="print")
    shown = page.evaluate("() => [...document.querySelectorAll('.slide')].filter("
                          "s => s.checkVisibility()).length")
    page.emulate_media(media="screen")
    assert shown == n


def test_handout_prints_on_a4(page, book_html_dir, zh_html_dir):
    """Both editions' handout.html printed to A4 PDFs in _build/handout/ (as `make handout`):
    one page per sheet, the diagram and the cheat sheet first, 2 to 5 pages per chapter, every
    chapter there; in print media every sheet fits the printable height (so none spills onto
    a second page), every slide fits, nothing is wider than the printable width or cut, the
    cheat sheet's diagram has no text under CHEAT_SHEET_DIAGRAM_PT (8 pt) on paper. Each
    PDF read back (pypdf): its text has the cheat sheet's numbers and the diagram's labels in
    that edition's words, and the Chinese one embeds the CJK font."""
    assert slides.A4_PRINT_WIDTH == A4_WIDTH_PX
    problems, report = [], {}
    for edition, folder in (("zh", zh_html_dir / "slides"), ("en", book_html_dir / "slides")):
        name = f"tokenflow-handout{'-zh' if edition == 'zh' else ''}.pdf"
        pdf = ROOT / "_build" / "handout" / name
        r = slides.print_handout(page, folder / "handout.html", pdf)
        if not pdf.read_bytes().startswith(b"%PDF") or r["pages"] != sum(r["sheets"].values()):
            problems.append(f"{edition}: {r['pages']} PDF pages for {r['sheets']} sheets")
        problems += [f"{edition}: {p}" for p in pdf_problems(pdf, edition)]
        if r["sheets"].pop("kit", 0) != KIT_SHEETS:
            problems.append(f"{edition}: not {KIT_SHEETS} kit sheets first")
        report[edition] = r["sheets"]
        if sorted(r["sheets"]) != [c[:2] for c in CHAPTERS]:
            problems.append(f"{edition}: chapters on the handout {sorted(r['sheets'])}")
        lo, hi = PAGES_PER_CHAPTER
        problems += [f"{edition} chapter {c}: {n} pages, want {lo} to {hi}"
                     for c, n in r["sheets"].items() if not lo <= n <= hi]
        printed = page.evaluate(f"(W) => ({PRINT_JS})(W, '.handout')", A4_WIDTH_PX)
        problems += [f"{edition}: {p}" for p in printed["problems"]]
        fit = page.evaluate(
            """(H) => [...document.querySelectorAll('.slide')].filter(s => {
            const r = s.getBoundingClientRect();
            return [...s.querySelectorAll('*')].some(e => { const q = e.getBoundingClientRect();
              return q.right > r.right + 1 || q.bottom > r.bottom + 1; }); }).map(s => s.id).concat(
            [...document.querySelectorAll('.sheet')]
              .filter(s => s.getBoundingClientRect().height > H)
              .map(s => 'sheet of chapter ' + s.dataset.chapter + ' taller than the page'))""",
            slides.A4_PRINT_HEIGHT,
        )
        problems += [f"{edition}: does not fit: {i}" for i in fit]
        # the cheat sheet's diagram read from paper: its smallest text, as printed (CSS px of
        # the A4 layout, 96 per inch), at least CHEAT_SHEET_DIAGRAM_PT
        least = page.evaluate("""() => Math.min(...[...document.querySelectorAll(
            '.cheatsheet svg.diagram text')].map(t => { const svg = t.ownerSVGElement;
              return parseFloat(t.getAttribute('font-size')) *
                     svg.getBoundingClientRect().width / svg.viewBox.baseVal.width; }))""")
        report[f"{edition} cheat sheet diagram pt"] = round(least * 72 / 96, 1)
        if not least * 72 / 96 >= CHEAT_SHEET_DIAGRAM_PT:
            problems.append(f"{edition}: cheat sheet diagram text {least * 72 / 96:.1f} pt")
    page.emulate_media(media="screen")
    page.set_viewport_size({"width": slides.WIDTH, "height": slides.HEIGHT})
    print("handout: A4 pages per chapter", report)
    assert not problems, "\n".join(problems)


def pdf_problems(pdf: Path, edition: str) -> list[str]:
    """What a printed handout lacks: the cheat sheet's numbers (12,288, 129,280, 6 of 384, as
    models.json gives them), the diagram's first label, every font embedded (Chromium draws
    the inline web font as Type 3 glyph procedures, the others as embedded font files), and
    for ``zh`` Chinese text that reads back as Chinese (the fonts map glyphs to Unicode)."""
    from pypdf import PdfReader
    reader = PdfReader(str(pdf))
    text = " ".join("\n".join(p.extract_text() or "" for p in reader.pages[:KIT_SHEETS]).split())
    models = json.loads((ROOT / "src" / "tokenflow" / "data" / "models.json")
                        .read_text(encoding="utf-8"))["models"]
    cfg = {k: v.get("config", v) for k, v in models.items()}
    moe = next(c for c in cfg.values() if c.get("n_routed_experts") == 384)
    want = [f"{cfg['GPT-3-175B']['hidden_size']:,}", f"{cfg['DeepSeek-V3']['vocab_size']:,}",
            ("384 选 6" if edition == "zh" else f"{moe['num_experts_per_tok']} of 384"),
            ("速查表" if edition == "zh" else "cheat sheet")]
    problems = [f"PDF text lacks {w!r}" for w in want if w not in text]
    for i, p in enumerate(reader.pages[:KIT_SHEETS]):
        for name, f in (p["/Resources"].get("/Font") or {}).items():
            f = f.get_object()
            fonts = [d.get_object() for d in f.get("/DescendantFonts", [])] or [f]
            embedded = all("/CharProcs" in g or any(
                k in (g.get("/FontDescriptor") or {}) for k in
                ("/FontFile", "/FontFile2", "/FontFile3")) for g in fonts)
            if not embedded:
                problems.append(f"page {i + 1}: font {name} ({f.get('/BaseFont')}) not embedded")
    if edition == "zh" and len(CJK.findall(text)) < 200:
        problems.append(f"{len(CJK.findall(text))} Chinese characters read back from the kit")
    return problems


def test_diagram_deck_fits_and_has_notes(page, book_html_dir, zh_html_dir):
    """slides/diagram.html of both editions: the token-flow diagram in parts
    (slides.DIAGRAM_PARTS), one 1280 x 720 slide each, every box and label inside its slide,
    every node of the diagram's file drawn with its label in the edition's words on some
    slide, and N shows each slide's speaker notes. (Text size: test_no_text_under_body_size.)"""
    from tokenflow.viz import load_diagram
    problems = []
    for edition, folder in (("en", book_html_dir), ("zh", zh_html_dir)):
        page.goto((folder / "slides" / "diagram.html").as_uri(), wait_until="load")
        page.wait_for_function("() => window.tokenflowDeck !== undefined")
        n = page.evaluate("() => window.tokenflowDeck.count")
        ids = page.evaluate("() => [...document.querySelectorAll('marker')].map(m => m.id)")
        if len(set(ids)) != len(ids):     # a marker in a hidden slide draws no arrowhead
            problems.append(f"{edition}: arrowhead marker ids repeat: {ids}")
        if n != len(slides.DIAGRAM_PARTS):
            problems.append(f"{edition}: {n} slides, want {len(slides.DIAGRAM_PARTS)}")
        words, boxes = "", 0
        for k in range(n):
            if k:
                page.keyboard.press("ArrowRight")
            r = page.evaluate("""() => { const s = document.querySelector('.slide.active');
              const b = s.getBoundingClientRect();
              const texts = [...s.querySelectorAll('svg text, svg rect')];
              return {out: texts.filter(t => { const q = t.getBoundingClientRect();
                        return q.left < b.left || q.right > b.right || q.top < b.top ||
                               q.bottom > b.bottom; }).map(t => t.textContent),
                      boxes: s.querySelectorAll('svg rect').length,
                      words: [...s.querySelectorAll('svg text')].map(t => t.textContent)
                        .join(' ')}; }""")
            problems += [f"{edition} slide {k + 1}: outside the slide: {t}" for t in r["out"]]
            words, boxes = words + " " + r["words"], boxes + r["boxes"]
            page.keyboard.press("n")
            if not page.evaluate("() => document.querySelector('.slide.active aside.notes')"
                                 ".checkVisibility()"):
                problems.append(f"{edition} slide {k + 1}: N does not show the speaker notes")
            page.keyboard.press("n")
        first = {"en": "token id", "zh": "词元 id"}[edition]
        parts = {node for _, grid in slides.DIAGRAM_PARTS for node in grid}
        if first not in words or parts != set(load_diagram().nodes) or boxes < len(parts):
            problems.append(f"{edition}: labels {words[:80]!r}, {boxes} boxes")
    assert not problems, "\n".join(problems)


# Every element with text of its own, on every slide of every deck: its computed font size at
# 1280 x 720 (an SVG text's scaled by the SVG), in CSS px of the slide (the deck scales a slide
# to the window).
TEXT_SIZES_JS = """() => { const s = document.querySelector('.slide.active');
  const k = s.getBoundingClientRect().width / 1280, out = [];
  for (const e of s.querySelectorAll('*')) {
    const own = [...e.childNodes].some(n => n.nodeType === 3 && n.textContent.trim());
    if (!own || !e.checkVisibility()) continue;
    let px = parseFloat(getComputedStyle(e).fontSize);
    if (e.closest('svg')) { const m = e.getScreenCTM(); px *= m ? Math.hypot(m.a, m.b) : 1; }
    out.push([px / k, e.tagName.toLowerCase(), e.textContent.trim().slice(0, 40)]);
  }
  return out; }"""


def text_sizes(page, path: Path) -> list[tuple[int, float, str, str]]:
    """(slide number, px, tag, text) of every text element of the deck at ``path``."""
    page.set_viewport_size({"width": slides.WIDTH, "height": slides.HEIGHT})
    page.goto(path.as_uri(), wait_until="load")
    page.wait_for_function("() => window.tokenflowDeck !== undefined")
    out = []
    for k in range(page.evaluate("() => window.tokenflowDeck.count")):
        if k:
            page.keyboard.press("ArrowRight")
        out += [(k + 1, *t) for t in page.evaluate(TEXT_SIZES_JS)]
    return out


@pytest.mark.parametrize("deck", ["diagram", *[c[:2] for c in CHAPTERS]])
def test_no_text_under_body_size(page, book_html_dir, zh_html_dir, deck):
    """Projected at 1280 x 720, no text on any slide of the deck (both editions) is smaller
    than the body size, slides.MIN_TEXT_PX (24 px; 5 % for rounding): a table too big for a
    slide at that size is split over slides (slides.split_table), never set smaller."""
    small = []
    for edition, folder in (("en", book_html_dir), ("zh", zh_html_dir)):
        sizes = text_sizes(page, folder / "slides" / f"{deck}.html")
        assert len(sizes) >= 5, (edition, deck)
        small += [f"{edition} slide {k}: {px:.1f} px <{tag}> {text!r}"
                  for k, px, tag, text in sizes if px < 0.95 * slides.MIN_TEXT_PX]
    assert not small, "\n".join(small)



def test_split_table_keeps_rows_header_and_columns():
    """slides.split_table on tokenflow.viz.Table HTML: a small table stays whole; a tall one
    goes over slides in row order, the header on each, the notes naming the rows; a wide one
    shows the first column (and the second, after a narrow first) on every slide and every
    other column on one, the notes naming them; the Chinese notes too. Whether each part then
    fits at body size is checked in Chromium by test_no_text_under_body_size."""
    from tokenflow.viz.fmt import Table
    assert slides.split_table(Table([[1, "a"], [2, "b"]], ["n", "x"])._repr_html_()) == [None]
    tall = Table([[k, f"row {k}"] for k in range(40)], ["n", "x"])._repr_html_()
    parts = slides.split_table(tall)
    assert len(parts) >= 3
    rows = [int(n) for html_text, _ in parts
            for n in re.findall(r"<tr><td[^>]*>(\d+)</td>", html_text)]
    assert rows == list(range(40))
    assert all(h.count("<th ") == 2 for h, _ in parts)
    assert parts[0][1][0] == 1 and parts[-1][1][1:3] == (40, 40)
    wide = Table([[k] + [f"column {c} of row {k}, a long cell" for c in range(8)]
                  for k in range(3)], ["n"] + [f"c{c}" for c in range(8)])._repr_html_()
    parts = slides.split_table(wide)
    shown = [p[1][3] for p in parts]
    assert len(parts) >= 2 and all(s[0] == "n" for s in shown)
    assert {c for s in shown for c in s[1:]} == {f"c{c}" for c in range(8)}
    assert sum(len(s) for s in shown) < 9 + 2 * len(shown)     # only the key columns repeat
    for lang, word in (("en", "Columns shown here"), ("zh_CN", "这一页显示的列")):
        deck = slides.Deck("00", "notebooks/00_x", "t", [
            slides.Slide("table", "t", h, part=part) for h, part in parts])
        slides.speaker_notes(deck, [], lang)
        assert all(word in s.notes and "c0" in deck.slides[0].notes for s in deck.slides)


def test_kit_without_a_browser():
    """The cheat sheet's numbers are tokenflow.analysis's on the bundled configs (checked here
    against models.json's fields), every chapter slide has speaker notes, the prompts are the
    chapters' "predict, then run" exercises, and a diagram node without a place is refused."""
    models = json.loads((ROOT / "src" / "tokenflow" / "data" / "models.json")
                        .read_text(encoding="utf-8"))["models"]
    ll = models["Llama-3-8B"].get("config", models["Llama-3-8B"])
    kv = 2 * ll["num_hidden_layers"] * ll["num_key_value_heads"] * (
        ll.get("head_dim") or ll["hidden_size"] // ll["num_attention_heads"]) * 2
    ds = models["DeepSeek-V3"].get("config", models["DeepSeek-V3"])
    a2a = ds["num_experts_per_tok"] * ds["hidden_size"] * 2
    for edition in ("en", "zh_CN"):
        sheet = slides.cheat_sheet(edition)
        for n in (f"{kv:,} B", f"{a2a:,} B", "12,288", "129,280"):
            assert n in sheet, (edition, n)
        # a shape is written with letters: [B, S, 12,288] would read as four dimensions
        shapes = re.findall(r"\[[^\]<>]*\]", re.sub(r"<[^>]+>", "", sheet))
        assert shapes and not [s for s in shapes if re.search(r"\d,\d{3}", s)], (edition, shapes)
    decks = [slides.chapter_deck(nb, ROOT, "en") for nb in slides.chapters(ROOT)]
    assert all(s.notes for d in decks for s in d.slides)
    prompts = slides.exercise_prompts(ROOT / "notebooks" / "00_token_flow.ipynb")
    assert prompts and all(p.startswith("<strong>1. Predict") or "Predict" in p for p in prompts)
    assert "Predict" not in slides.exercise_prompts(
        ROOT / "notebooks" / "00_token_flow.ipynb", ROOT, "zh_CN")[0]
    grid = dict(slides.DIAGRAM_GRID)
    del slides.DIAGRAM_GRID["router"]
    try:
        with pytest.raises(ValueError, match="router"):
            slides.diagram_svg()
    finally:
        slides.DIAGRAM_GRID.update(grid)


def test_deck_content_comes_from_the_notebook(tmp_path):
    """Without a browser: a tagged figure cell gives a figure slide with the book's caption
    and the heading above it, printed items are packed onto as many slides as they need, in
    order, the Chinese edition takes its prose from the catalog, and a tagged cell without
    outputs is refused."""
    png = base64.b64encode(b"\x89PNG fake").decode()
    nb = {
        "cells": [
            {
                "cell_type": "markdown",
                "metadata": {},
                "source": "# Chapter 9: x\n\n**The question.** Why?",
            },
            {"cell_type": "markdown", "metadata": {}, "source": "## A heading"},
            {
                "cell_type": "code",
                "metadata": {"tags": ["slide"]},
                "source": "",
                "outputs": [{"output_type": "display_data", "data": {"image/png": png}}],
            },
            {"cell_type": "markdown", "metadata": {}, "source": "*The caption.*\n\nMore prose."},
            {
                "cell_type": "code",
                "metadata": {"tags": ["slide"]},
                "source": "",
                "outputs": [
                    {
                        "output_type": "stream",
                        "name": "stdout",
                        "text": "".join(
                            f"{i}. item {i} " + "word " * 60 + "\n" for i in range(1, 5)
                        ),
                    }
                ],
            },
        ]
    }
    path = tmp_path / "notebooks" / "99_x.ipynb"
    path.parent.mkdir()
    path.write_text(json.dumps(nb), encoding="utf-8")
    po = tmp_path / "locale" / "zh_CN" / "LC_MESSAGES" / "notebooks"
    po.mkdir(parents=True)
    (po / "99_x.po").write_text(
        'msgid ""\nmsgstr ""\n"Content-Type: text/plain; charset=utf-8\\n"\n\n'
        'msgid "A heading"\nmsgstr "一个标题"\n',
        encoding="utf-8",
    )
    deck = slides.chapter_deck(path, tmp_path)
    kinds = [s.kind for s in deck.slides]
    assert kinds[:2] == ["title", "figure"] and len(kinds) >= 4, kinds
    assert set(kinds[2:]) == {"numbers"}, kinds      # four long items need more than one slide
    shown = "".join(s.body for s in deck.slides[2:])
    at = [shown.index(f"item {i} ") for i in range(1, 5)]
    assert at == sorted(at)
    assert "Why?" in deck.slides[0].body and deck.slides[1].title == "A heading"
    assert "<figcaption><em>The caption.</em></figcaption>" in deck.slides[1].body
    zh = slides.chapter_deck(path, tmp_path, "zh_CN")
    assert zh.slides[1].title == "一个标题" and zh.slides[2].title.startswith("一个标题")
    nb["cells"][2]["outputs"] = []
    path.write_text(json.dumps(nb), encoding="utf-8")
    with pytest.raises(ValueError, match="tagged 'slide'"):
        slides.chapter_deck(path, tmp_path)


def test_pack_items_fills_a_slide_exactly_to_its_line_budget():
    """Items of one line each: a budget of 3 lines holds exactly 3 per slide, in order; a
    two-line item that would cross the budget starts the next slide; an item longer than the
    budget gets a slide of its own; wide characters count two columns."""
    one = "x" * slides.CHARS_PER_LINE
    assert slides.pack_items([one] * 7, lines=3) == [[one] * 3, [one] * 3, [one]]
    two = "y" * (slides.CHARS_PER_LINE + 1)
    assert slides.pack_items([one, one, two], lines=3) == [[one, one], [two]]
    huge = "z" * (slides.CHARS_PER_LINE * 5)
    assert slides.pack_items([one, huge, one], lines=3) == [[one], [huge], [one]]
    wide = "中" * (slides.CHARS_PER_LINE // 2 + 1)              # 2 lines of columns
    assert slides.pack_items([one, one, wide], lines=3) == [[one, one], [wide]]
