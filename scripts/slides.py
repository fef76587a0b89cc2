"""Teaching slides and a printable handout, made from the chapters themselves.

One deck per chapter, ``slides/NN.html`` next to the book's pages (``_build/html/slides/``, and
``_build/html/zh/slides/`` for the Chinese edition), with ``slides/index.html`` and
``slides/handout.html`` (every deck, two slides to an A4 page). Nothing on a slide is typed
in: a deck is read from its notebook's sources and stored outputs, so it says what the book says.

* Slide 1: the chapter's title and its question (the paragraph that starts with
  ``**The question.**``, else the first paragraph after the title).
* Every code cell tagged ``slide`` gives slides from its stored outputs: one per figure
  (``image/png`` or ``image/svg+xml``) with the caption the book shows under it (the first
  paragraph of the next markdown cell, when it is in italics); else one per table
  (``tokenflow.viz.Table``'s HTML; one too big to read at body size goes over several,
  :func:`split_table`); else its printed text, one paragraph per item (``1. ...``,
  ``- ...``, as ``tokenflow.viz.say`` prints them), on as many slides as the items need.
* A slide's title is the heading its cell sits under.

Prose (title, question, headings, captions) is the notebook's markdown; in the Chinese edition
each message is looked up in ``locale/zh_CN/LC_MESSAGES/notebooks/<chapter>.po``, as Sphinx does
(an untranslated or fuzzy message stays English). Outputs stay as stored, as in the book.

Each file stands alone: figures are ``data:`` URLs, style and script are inline, and Chinese
characters and emoji are drawn with subsets of the book's web fonts (``TokenflowCJK-zh.woff2``,
``TokenflowEmoji.woff2``, SIL OFL,
subset by ``build_fonts._subset``), inline as well, since Chromium refuses fonts from ``file://``
URLs. No request leaves the file: a deck opens from a USB stick. Keys: right / left arrow,
PageDown / PageUp, space, Home / End; the two buttons; ``#3`` in the URL opens slide 3. A slide is
laid out at 1280 x 720 CSS px and scaled to the window; no text is smaller than the body size,
MIN_TEXT_PX (24 px): a table too big for a slide at that size goes over as many slides as it
needs (:func:`split_table`), and the inline script only lets a table that has room grow.
Printing a deck gives one 16:9 page per slide; printing ``handout.html`` gives A4 pages, two
slides each, every chapter on a new page.

The book builds the decks of the edition it builds (this file is a Sphinx extension, loaded by
_config.yml; ``build-finished`` of the HTML builder). By hand, from the repository root:

    python scripts/slides.py build [--lang zh_CN] [--out DIR]   # decks of one edition
    python scripts/slides.py handout    # both editions' handout.html -> _build/handout/*.pdf

``handout`` prints with Chromium (Playwright, as the browser tests do): $TOKENFLOW_CHROMIUM, else
``chromium`` on PATH, else Playwright's own build (``make handout`` finds or installs one).
"""
from __future__ import annotations

import argparse
import base64
import html
import io
import json
import math
import posixpath
import re
import shutil
import sys
import time
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SLIDE_TAG = "slide"
WIDTH, HEIGHT = 1280, 720             # a slide's box in CSS px (16:9)
A4_PRINT_WIDTH = 718                  # 190 mm (A4 less 10 mm side margins) in CSS px
A4_PRINT_HEIGHT = 1031                # 273 mm (A4 less 12 mm top and bottom margins)
HANDOUT_ZOOM = A4_PRINT_WIDTH / WIDTH  # a slide on the handout: 718 x 404 px, two to a page
MIN_TEXT_PX = 24                      # body size on a projected 1280 x 720 slide: no text smaller
PER_SHEET = 2
QUESTION = "**The question.**"
ITEM = re.compile(r"(\d+\.|-)\s")     # an item as tokenflow.viz.say starts it
# Text on one slide: about CHARS_PER_LINE columns (a Chinese character takes two) at the
# slides' text size, LINES_PER_SLIDE lines; a guess that the inline script's fitting corrects.
CHARS_PER_LINE, LINES_PER_SLIDE = 80, 11
# A table on a slide at body size (MIN_TEXT_PX), a guess that errs wide: its text as wide as
# text_em says (in em of the text), each cell padded by TABLE_CELL_PAD px, a row TABLE_ROW_PAD px
# plus TABLE_LINE_PX px a line, all within TABLE_WIDTH x TABLE_HEIGHT px (the slide's content
# box, 1160 x 554 px, less a margin); a wrapped text column no narrower than MIN_WRAP_EM.
TABLE_CELL_PAD, TABLE_ROW_PAD, TABLE_LINE_PX = 29, 6.8, 32.4
TABLE_WIDTH, TABLE_HEIGHT, MIN_WRAP_EM = 1130, 552, 8
HIDDEN_BLUE = "#3b7dd8"               # tokenflow.analysis.trace.COLORS["hidden"]
EDITIONS = {"en": ("", "en"), "zh_CN": ("zh", "zh-CN")}   # Sphinx language: (folder, html lang)


def _build_fonts():
    """scripts/build_fonts.py (the web font's file, family, code point ranges and subsetter)."""
    import importlib.util
    if "build_fonts" not in sys.modules:
        spec = importlib.util.spec_from_file_location(
            "build_fonts", ROOT / "scripts" / "build_fonts.py"
        )
        sys.modules["build_fonts"] = module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    return sys.modules["build_fonts"]


build_fonts = _build_fonts()
FONT, FONT_FAMILY, FONT_RANGES = (
    build_fonts.WEB_FONT,
    build_fonts.WEB_FAMILY,
    build_fonts.WEB_RANGES,
)


# --- prose ----------------------------------------------------------------------------------
def read_catalog(root: Path, lang: str, page: str) -> dict[str, str]:
    """The translations of ``page`` (e.g. ``notebooks/00_token_flow``) into ``lang``: msgid ->
    msgstr, without fuzzy or empty entries (Sphinx leaves those English too). ``{}`` for English
    or a page without a catalog."""
    if lang == "en":
        return {}
    po = root / "locale" / lang / "LC_MESSAGES" / f"{page}.po"
    if not po.is_file():
        return {}
    from babel.messages.pofile import read_po
    with po.open("rb") as f:
        catalog = read_po(f)
    return {m.id: m.string for m in catalog if m.id and m.string and not m.fuzzy}


class Prose:
    """Markdown of one notebook rendered for a slide, translated message by message.

    A message is what Sphinx's gettext builder extracts: a paragraph, heading or table cell,
    its lines joined by spaces. Relative links to book pages (``../book/intro.md``, ``01_x.ipynb``)
    point at the built pages from ``slides/``; other relative links are dropped (their text
    stays)."""

    def __init__(self, catalog: dict[str, str], page_dir: str = "notebooks"):
        from markdown_it import MarkdownIt
        self.catalog, self.page_dir = catalog, page_dir
        self.md = MarkdownIt("commonmark", {"html": False}).enable("table")
        self.md.add_render_rule("link_open", lambda _, *args: self._link_open(*args))

    def _link_open(self, tokens, idx, options, env):
        token = tokens[idx]
        href = token.attrGet("href") or ""
        if not re.match(r"[a-z]+:", href) and not href.startswith("#"):
            path, _, anchor = href.partition("#")
            stem, ext = posixpath.splitext(posixpath.normpath(posixpath.join(self.page_dir, path)))
            href = (
                f"../{stem}.html" + (f"#{anchor}" if anchor else "")
                if ext in (".md", ".ipynb")
                else ""
            )
        if not href:
            return "<a>"
        token.attrSet("href", href)
        return self.md.renderer.renderToken(tokens, idx, options, env)

    def message(self, text: str) -> str:
        """``text`` in this edition's language (itself when untranslated)."""
        return self.catalog.get(" ".join(text.split("\n")).strip(), text)

    def inline(self, text: str) -> str:
        """One message (a paragraph, heading or caption) as inline HTML, its ``$...$`` math
        as plain text (:func:`math_text`: the slides load no math renderer)."""
        return self.md.renderInline(math_text(self.message(text)))

    def blocks(self, markdown: str) -> list[tuple[str, str, str]]:
        """The top-level blocks of ``markdown``: (kind, tag, inline source) for headings
        (``heading``, ``h2``) and paragraphs (``paragraph``, ``p``); other blocks are skipped."""
        tokens, out = self.md.parse(markdown), []
        for i, t in enumerate(tokens):
            if t.level == 0 and t.type in ("heading_open", "paragraph_open"):
                out.append((t.type.removesuffix("_open"), t.tag, tokens[i + 1].content))
        return out


MATH_WORDS = {
    r"\lceil": "⌈", r"\rceil": "⌉", r"\lfloor": "⌊", r"\rfloor": "⌋", r"\cdot": "·",
    r"\times": "×", r"\approx": "≈", r"\le": "≤", r"\ge": "≥", r"\leq": "≤", r"\geq": "≥",
    r"\neq": "≠", r"\to": "→", r"\infty": "∞", r"\sum": "Σ", r"\in": "∈", r"\sqrt": "√",
    r"\Delta": "Δ", r"\beta": "β", r"\mathcal": "", r"\mathrm": "", r"\text": "",
    r"\tfrac": "", r"\frac": "", r"\top": "ᵀ", r"\min": "min", r"\max": "max",
    r"\log": "log", r"\exp": "exp", r"\ldots": "…", r"\dots": "…",
}
OPERATORS = {"·", "×", "≈", "≤", "≥", "≠", "→", "∈", "min", "max", "log", "exp"}
SUPERSCRIPTS = str.maketrans("0123456789-+T", "⁰¹²³⁴⁵⁶⁷⁸⁹⁻⁺ᵀ")


def _tex_word(command: str, space: str) -> str:
    """A control word as text; the space TeX ignores after it goes too, except around the
    operators, which keep their spacing (``\\Delta z`` -> ``Δz``, ``a \\cdot b`` -> ``a · b``)."""
    word = MATH_WORDS.get(command, command[1:])
    return word + (space if word in OPERATORS else "")


def _tex_plain(tex: str) -> str:
    """One ``$...$`` formula as plain text: ``\\lceil c\\,TK/E \\rceil`` -> ``⌈c·TK/E⌉``,
    ``p(\\text{一})`` -> ``p(一)``, ``\\frac{a}{b}`` -> ``(a)/(b)``, ``x^{2}`` -> ``x²``."""
    t = re.sub(r"\\[td]?frac\{([^{}]*)\}\{([^{}]*)\}",
               lambda m: "/".join(x if x.isalnum() else f"({x})" for x in m.groups()), tex)
    t = re.sub(r"\\[,;:!]|~", lambda m: "·" if m.group(0) == r"\," else " ", t)
    t = re.sub(r"(\\[A-Za-z]+)(\s*)", lambda m: _tex_word(*m.groups()), t)
    t = re.sub(r"\^\{([0-9+\-Tᵀ]+)\}|\^([0-9T])",
               lambda m: (m.group(1) or m.group(2)).translate(SUPERSCRIPTS), t)
    t = re.sub(r"\^\{([^{}]*)\}", r"^(\1)", t.replace("{,}", ","))
    t = re.sub(r"\s+", " ", t.replace("{", "").replace("}", "")).strip()
    t = re.sub(r"([⌈⌊(])\s+", r"\1", t)
    return re.sub(r"\s+([⌉⌋)])", r"\1", t)


def math_text(markdown: str) -> str:
    """``markdown`` with every inline ``$...$`` and display ``$$...$$`` formula (outside code
    spans) replaced by :func:`_tex_plain`'s plain text, so no ``$`` math reaches a slide."""
    parts = re.split(r"(`[^`]*`)", markdown)
    return "".join(
        part if part.startswith("`") else
        re.sub(r"\$\$(.+?)\$\$|\$([^$]+?)\$", lambda m: _tex_plain(m.group(1) or m.group(2)),
               part, flags=re.S)
        for part in parts)


def plain(inline_html: str) -> str:
    """The text of an inline HTML fragment (for alt and title attributes)."""
    return html.unescape(re.sub(r"<[^>]+>", "", inline_html)).strip()


# --- a chapter's slides ----------------------------------------------------------------------
@dataclass
class Slide:
    """One slide: its ``kind`` (``title``, ``figure``, ``table``, ``numbers``; the tests read the
    numbers off the ``numbers`` slides), its ``title`` (inline HTML) and its ``body`` (HTML)."""

    kind: str                  # title, figure, table, numbers, diagram
    title: str                 # inline HTML
    body: str                  # HTML
    notes: str = ""            # the speaker notes (HTML; press N in a deck to show them)
    part: tuple = ()           # a split table's part: (first row, last row, rows, columns shown)


@dataclass
class Deck:
    """A chapter's slides, in order, with the chapter's number, page and title (inline HTML)."""

    number: str                # "00"
    page: str                  # "notebooks/00_token_flow"
    title: str                 # inline HTML
    slides: list[Slide] = field(default_factory=list)


def _source(cell) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else src


def _text(value) -> str:
    return "".join(value) if isinstance(value, list) else value


def text_items(text: str) -> list[str]:
    """Printed text as items: a line that starts with ``1.`` or ``-`` (or is not indented)
    starts one, an indented line continues it (``say`` wraps with an indent). Blank lines go."""
    items: list[str] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        if items and line.startswith(" ") and not ITEM.match(line.lstrip()):
            items[-1] += " " + line.strip()
        else:
            items.append(line.strip())
    return items


def _columns(text: str) -> int:
    """Columns of ``text``, wide characters counting 2 (as tokenflow.viz.fmt.display_width)."""
    return sum(2 if unicodedata.east_asian_width(c) in ("W", "F") else 1 for c in text)


def pack_items(items: list[str], lines: int = LINES_PER_SLIDE) -> list[list[str]]:
    """Items in order, grouped so that each group fills at most ``lines`` estimated lines (an
    item longer than that gets a group of its own)."""
    groups: list[list[str]] = [[]]
    used = 0
    for item in items:
        need = math.ceil(_columns(item) / CHARS_PER_LINE)
        if groups[-1] and used + need > lines:
            groups.append([])
            used = 0
        groups[-1].append(item)
        used += need
    return [g for g in groups if g]


def _item_html(item: str) -> str:
    m = ITEM.match(item)
    mark, rest = (m.group(1), item[m.end():]) if m else ("", item)
    mark_html = f'<span class="mark">{html.escape(mark)}</span> ' if mark else ""
    return f'<p class="item">{mark_html}{html.escape(rest)}</p>'


def _caption(cells: list, i: int, prose: Prose) -> str:
    """The book's caption of the figure in cell ``i``: the next cell's first paragraph when it
    is all in italics (``*...*``), as inline HTML; else ``""``."""
    if i + 1 >= len(cells) or cells[i + 1]["cell_type"] != "markdown":
        return ""
    blocks = prose.blocks(_source(cells[i + 1]))
    if not blocks or blocks[0][0] != "paragraph":
        return ""
    text = blocks[0][2].strip()
    if text.startswith("*") and text.endswith("*") and not text.startswith("**"):
        return prose.inline(text)
    return ""


def _figure(mime: str, data, caption: str) -> str:
    b64 = _text(data).strip() if mime == "image/png" else \
        base64.b64encode(_text(data).encode("utf-8")).decode()
    alt = html.escape(plain(caption) or "figure", quote=True)
    cap = f"<figcaption>{caption}</figcaption>" if caption else ""
    return (f'<figure><img src="data:{mime};base64,{b64}" alt="{alt}">{cap}</figure>')


def _static_part(html_text: str) -> str:
    """The table of an output; for the model page (``tokenflow.viz.model_page``), only its
    stored summary table, without the page's scripts."""
    m = re.search(r'<div class="tf-mp-static">(.*?)</div><script', html_text, re.S)
    return m.group(1) if m else html_text


TABLE = re.compile(r'(?P<head>.*?<table class="tf-table">)\s*(?:<caption>(?P<caption>.*?)'
                   r'</caption>)?\s*<thead>(?P<thead>.*?)</thead>\s*<tbody>(?P<tbody>.*?)'
                   r'</tbody>\s*</table>(?P<tail>.*)', re.S)
CELL = re.compile(r"(<t[hd][^>]*>)(.*?)(</t[hd]>)", re.S)


NARROW, WIDE = set(" ,.:;'|!ijlftr[]()/-"), set("ABCDEFGHKNOQRUVMWmw")


def text_em(text: str) -> float:
    """The width of ``text`` in em of a sans-serif face, a guess from widths of the Arial /
    Liberation Sans kind (a Chinese character 1 em, a digit 0.56 em), 6 % wider for safety."""
    return 1.06 * sum(1.0 if unicodedata.east_asian_width(c) in ("W", "F") else
                      0.3 if c in NARROW else 0.72 if c in WIDE else
                      0.56 for c in text)


def _lines(text: str, em: float) -> int:
    """Lines of ``text`` wrapped at ``em`` (at least one; a wrap loses some of each line)."""
    wide, em = text_em(text), max(em, 1.0)
    return max(1, math.ceil(wide * 1.15 / em)) if wide > em else 1


def _words(text: str) -> float:
    """The width of the longest word of ``text`` (where a header can wrap no further), em."""
    return max([text_em(w) for w in text.split()] or [0.0])


def split_table(table_html: str) -> list[tuple[str, tuple] | None]:
    """``table_html`` (a ``tokenflow.viz.Table``) as the tables of as many slides as it needs to
    fit at body size, by the guess of :func:`text_em` and the sizes above.

    Headers wrap between words. A table wider than :data:`TABLE_WIDTH` either wraps its text
    columns (left-aligned; never numbers, a shape or within a word), no narrower than
    :data:`MIN_WRAP_EM`, or shows fewer columns a slide: the first (the first two, after a
    narrow first) on each, the others shared evenly; whichever needs fewer slides, all the
    columns together on a tie. Then the rows, in order, go as many to a slide as fit in
    :data:`TABLE_HEIGHT` (as evenly as that allows), the header (and caption) on each.
    Each part is ``(html, (first row, last row, rows, shown column headers or ()))``;
    ``[None]`` when the table fits one slide as it is, or is not a plain table."""
    m = TABLE.match(table_html)
    if not m:
        return [None]
    raw_head = CELL.findall(m["thead"])
    raw_rows = [CELL.findall(r) for r in re.findall(r"<tr>(.*?)</tr>", m["tbody"], re.S)]
    if not raw_rows or any(len(r) != len(raw_head) for r in raw_rows):
        return [None]
    head = [plain(c[1]) for c in raw_head]
    rows = [[plain(c[1]) for c in r] for r in raw_rows]
    natural = [max([_words(h)] + [text_em(r[j]) for r in rows]) for j, h in enumerate(head)]
    text = [j for j in range(len(head)) if "text-align:right" not in raw_rows[0][j][0]]
    # where a text cell can wrap no further: its longest word, a shape ("[1, 5, 128]") whole
    least = [max([_words(h)] + [text_em(r[j]) if r[j].startswith("[") else _words(r[j])
                                for r in rows]) for j, h in enumerate(head)]

    def px(ems):
        return sum(w * MIN_TEXT_PX + TABLE_CELL_PAD for w in ems)

    def height(cells, width):
        return TABLE_ROW_PAD + TABLE_LINE_PX * max(_lines(c, width[j]) for j, c in enumerate(cells))

    caption = m["caption"]
    cap_px = TABLE_LINE_PX * _lines(plain(caption), CHARS_PER_LINE * 0.5) if caption else 0

    def chunked(width, budget):
        chunks, chunk, used = [], [], 0
        for r, row in enumerate(rows):
            need = height(row, width)
            if chunk and used + need > budget:
                chunks.append(chunk)
                chunk, used = [], 0
            chunk.append(r)
            used += need
        return chunks + [chunk]

    def layout(width, groups):
        """(slides, groups, row chunks) with these column widths (em) and column groups."""
        budget = TABLE_HEIGHT - cap_px - height(head, width)
        chunks = chunked(width, budget)
        while len(chunks) > 1 and len(chunked(width, budget - 5)) == len(chunks):   # even parts
            budget -= 5
            chunks = chunked(width, budget)
        return len(groups) * len(chunks), groups, chunks, width

    everything = [list(range(len(head)))]
    candidates = []
    # all the columns, the text columns wrapped as little as they need (if they can)
    wrap_at, width = max(natural), list(natural)
    while px(width) > TABLE_WIDTH and wrap_at > MIN_WRAP_EM:
        wrap_at -= 0.25
        width = [max(least[j], min(w, wrap_at)) if j in text else w
                 for j, w in enumerate(natural)]
    if px(width) <= TABLE_WIDTH:
        candidates.append(layout(width, everything))
    # or fewer columns a slide, unwrapped: the first column (two, if it is narrow) on each
    key = [0, 1] if natural[0] < 2 and len(head) > 2 else [0]
    rest = [j for j in range(len(head)) if j not in key]
    for n in range(2, len(rest) + 1):
        size = math.ceil(len(rest) / n)
        groups = [key + rest[g:g + size] for g in range(0, len(rest), size)]
        if all(px(natural[j] for j in g) <= TABLE_WIDTH for g in groups):
            candidates.append(layout(list(natural), groups))
            break
    if not candidates:
        candidates.append(layout(width, everything))   # as narrow as it goes: the test tells
    _, groups, chunks, width = min(candidates, key=lambda c: c[0])   # fewest slides; all first
    wrap = {j for j in text if width[j] < natural[j]}
    if len(groups) == 1 and len(chunks) == 1 and not wrap:
        return [None]

    def cell(raw, j):
        opening, inner, closing = raw
        if j in wrap:
            inner = f'<span class="wrap" style="max-width:{width[j]:.1f}em">{inner}</span>'
        return f"{opening}{inner}{closing}"

    cap = f"<caption>{caption}</caption>" if caption else ""
    parts = []
    for group in groups:
        shown = tuple(head[j] for j in group) if len(groups) > 1 else ()
        for chunk in chunks:
            thead = "<tr>" + "".join(f"{raw_head[j][0]}{raw_head[j][1]}{raw_head[j][2]}"
                                     for j in group) + "</tr>"
            tbody = "".join("<tr>" + "".join(cell(raw_rows[r][j], j) for j in group) + "</tr>\n"
                            for r in chunk)
            parts.append((f'{m["head"]}{cap}\n<thead>{thead}</thead>\n<tbody>\n{tbody}'
                          f'</tbody></table>{m["tail"]}',
                          (chunk[0] + 1, chunk[-1] + 1, len(rows), shown)))
    return parts


def cell_slides(cells: list, i: int, title: str, prose: Prose) -> list[Slide]:
    """The slides of the code cell ``i`` (tagged ``slide``), under the heading ``title``.

    Raises:
        ValueError: if the cell has no figure, table or printed text stored.
    """
    outputs = cells[i].get("outputs", [])
    figures = [(mime, o["data"][mime]) for o in outputs for mime in ("image/png", "image/svg+xml")
               if mime in o.get("data", {})]
    if figures:
        caption = _caption(cells, i, prose)
        return [
            Slide("figure", title, _figure(mime, data, caption if k == len(figures) - 1 else ""))
            for k, (mime, data) in enumerate(figures)
        ]
    tables = [_static_part(_text(o["data"]["text/html"])) for o in outputs
              if 'class="tf-table"' in _text(o.get("data", {}).get("text/html", ""))]
    if tables:
        out = []
        for t in tables:
            parts = split_table(t)
            out += [Slide("table", title + (f" ({k + 1}/{len(parts)})" if len(parts) > 1 else ""),
                          f'<div class="table">{t if part is None else part[0]}</div>',
                          part=() if part is None else part[1])
                    for k, part in enumerate(parts)]
        return out
    text = "".join(_text(o["text"]) for o in outputs
                   if o["output_type"] == "stream" and o.get("name") == "stdout")
    groups = pack_items(text_items(text))
    if not groups:
        raise ValueError(f"cell {i} is tagged {SLIDE_TAG!r} but has no figure, table or "
                         "printed text stored: run the notebook")
    return [Slide("numbers", title + (f" ({k + 1}/{len(groups)})" if len(groups) > 1 else ""),
                  "".join(_item_html(item) for item in group))
            for k, group in enumerate(groups)]


def chapter_deck(notebook: Path, root: Path = ROOT, lang: str = "en") -> Deck:
    """The deck of one chapter notebook in edition ``lang`` (``en`` or ``zh_CN``).

    Raises:
        ValueError: if the notebook has no ``# title`` in its first cell, no paragraph after
            it, or a cell tagged ``slide`` without stored outputs to show.
    """
    page = f"notebooks/{notebook.stem}"
    prose = Prose(read_catalog(root, lang, page))
    # the Chinese edition's outputs: the Chinese notebook's (scripts/zh_notebooks.py), if any
    zh = root / "notebooks" / "zh" / notebook.name
    source = zh if lang == "zh_CN" and zh.is_file() else notebook
    cells = json.loads(source.read_text(encoding="utf-8"))["cells"]
    blocks = prose.blocks(_source(cells[0]))
    titles = [b[2] for b in blocks if b[1] == "h1"]
    paragraphs = [b[2] for b in blocks if b[0] == "paragraph"]
    if not titles or not paragraphs:
        raise ValueError(f"{notebook}: the first cell needs a '# title' and a paragraph")
    question = next((p for p in paragraphs if p.startswith(QUESTION)), paragraphs[0])
    title = prose.inline(titles[0])
    book_page = f"../{page}.html"
    deck = Deck(notebook.stem[:2], page, title)
    deck.slides.append(Slide("title", title, f'<p class="question">{prose.inline(question)}</p>'
                             f'<p class="source"><a href="{book_page}">{page}.ipynb</a></p>'))
    heading = titles[0]
    for i, cell in enumerate(cells):
        if cell["cell_type"] == "markdown":
            heads = [b[2] for b in prose.blocks(_source(cell)) if b[0] == "heading"]
            heading = heads[-1] if heads else heading
        elif SLIDE_TAG in cell.get("metadata", {}).get("tags", []):
            deck.slides += cell_slides(cells, i, prose.inline(heading), prose)
    speaker_notes(deck, exercise_prompts(notebook, root, lang), lang)
    return deck


def chapters(root: Path = ROOT) -> list[Path]:
    """The chapter notebooks, in order (``notebooks/NN_*.ipynb``)."""
    return sorted((root / "notebooks").glob("[0-9][0-9]_*.ipynb"))


# --- font ------------------------------------------------------------------------------------
def font_css(text: str) -> str:
    """``@font-face`` for :data:`FONT_FAMILY`: the book's web fonts (Chinese, and emoji under the
    same family with their own ``unicode-range``) cut to the characters of ``text``, woff2
    inline; ``""`` when ``text`` has none."""
    from fontTools.ttLib import TTFont
    css = []
    for path, ranges in ((FONT, FONT_RANGES), (build_fonts.EMOJI_FONT, build_fonts.EMOJI_RANGES)):
        chars = {c for c in text if any(a <= ord(c) <= b for a, b in ranges)}
        if not chars:
            continue
        font = build_fonts._subset(TTFont(str(path)), chars)
        font.flavor = "woff2"
        buf = io.BytesIO()
        font.save(buf)
        css.append(f'@font-face {{ font-family: "{FONT_FAMILY}"; font-weight: 400; '
                   f"unicode-range: {', '.join(f'U+{a:X}-{b:X}' for a, b in ranges)};\n"
                   f"  src: url(data:font/woff2;base64,"
                   f'{base64.b64encode(buf.getvalue()).decode()}) format("woff2"); }}\n')
    if not css:
        return ""
    return ("/* " + FONT_FAMILY + ": subsets of Noto Sans CJK SC and Noto Color Emoji, "
            "SIL Open Font License 1.1 */\n" + "".join(css))


# --- HTML ------------------------------------------------------------------------------------
STYLE = """
html { --k: 1; }
body { margin: 0; background: #2b2d31; color: #1f2328;
  font-family: "%(font)s", system-ui, -apple-system, "Segoe UI", Roboto, "Noto Sans",
               "Liberation Sans", Arial, sans-serif; }
.slide { box-sizing: border-box; width: %(w)dpx; height: %(h)dpx; margin: 0 auto 24px;
  padding: 44px 60px 52px; background: #fff; display: flex; flex-direction: column; gap: 18px;
  position: relative; overflow: visible;
  font-size: max(%(body_px)dpx, calc(26px * min(var(--k), 1)));
  line-height: 1.35; }
.slide h1 { font-size: max(%(body_px)dpx, calc(50px * min(var(--k), 1))); margin: auto 0 0;
  color: %(blue)s;
  line-height: 1.2; }
.slide h2 { font-size: max(%(body_px)dpx, calc(34px * min(var(--k), 1))); margin: 0;
  color: %(blue)s; line-height: 1.2;
  border-bottom: 3px solid %(blue)s; padding-bottom: 8px; }
.slide .body { flex: 1 1 auto; min-height: 0; display: flex; flex-direction: column; gap: 12px; }
.slide[data-kind="title"] .body { flex: 0 1 auto; margin-bottom: auto; }
.slide .question { font-size: max(%(body_px)dpx, calc(30px * min(var(--k), 1)));
  margin: 0; }
.slide .source { font-size: %(body_px)dpx; margin: 0; }
.slide .source a { color: #59636e; }
code, pre { font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, "Liberation Mono",
  monospace, "%(font)s"; }
.slide code { font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, "Liberation Mono",
  monospace, "%(font)s"; font-size: max(0.9em, %(body_px)dpx); background: #f3f4f6;
  padding: 0 0.2em;
  border-radius: 3px; }
.slide figure { margin: 0; flex: 1 1 auto; min-height: 0; display: flex; flex-direction: column;
  align-items: center; gap: 8px; }
.slide figure img { flex: 1 1 auto; min-height: 0; max-width: 100%%; width: 100%%;
  object-fit: contain; }
.slide figcaption { font-size: %(body_px)dpx; color: #444;
  text-align: center; }
.slide .item { margin: 0 0 0.35em; }
.slide ul.decks { list-style: none; padding: 0; margin: 0; }
.slide .item .mark { color: %(blue)s; font-weight: 600; }
.slide .table { flex: 0 1 auto; min-height: 0;
  font-size: calc(%(body_px)dpx * max(var(--k), 1)); }
.slide table.tf-table { border-collapse: collapse; font-variant-numeric: tabular-nums;
  margin: 0 auto; }
.slide table.tf-table th, .slide table.tf-table td { padding: 0.12em 0.6em; white-space: nowrap;
  border-bottom: 1px solid #d0d7de; }
.slide table.tf-table th, .slide table.tf-table .wrap { white-space: normal; }
.slide table.tf-table .wrap { display: inline-block; }
.slide table.tf-table caption { caption-side: top; text-align: left; font-weight: 600;
  padding-bottom: 0.3em; }
.slide footer { position: absolute; left: 60px; right: 60px; bottom: 16px; display: flex;
  justify-content: space-between; font-size: %(body_px)dpx; color: #8b949e; }
nav.deck-nav { display: none; }
html.js body { overflow: hidden; height: 100vh; }
html.js .slide { display: none; position: absolute; left: 50%%; top: 50%%; margin: 0;
  transform: translate(-50%%, -50%%) scale(var(--s, 1)); }
html.js .slide.active { display: flex; }
html.js nav.deck-nav { display: flex; gap: 8px; position: fixed; left: 50%%; bottom: 8px;
  transform: translateX(-50%%); z-index: 2; opacity: 0.6; }
html.js nav.deck-nav:hover { opacity: 1; }
nav.deck-nav button { font-size: 18px; padding: 2px 12px; border: 1px solid #8b949e;
  border-radius: 4px; background: #fff; cursor: pointer; }
@media print {
  @page { size: %(w)dpx %(h)dpx; margin: 0; }
  html.js body, body { background: #fff; overflow: visible; height: auto; }
  html.js .slide, .slide { display: flex; position: relative; left: auto; top: auto;
    transform: none; margin: 0; break-after: page; }
  nav.deck-nav, html.js nav.deck-nav { display: none; }
}
"""

HANDOUT_STYLE = """
.handout .sheet { display: flex; flex-direction: column; gap: 16px; align-items: center;
  margin: 0 auto 24px; height: %(h)dpx; box-sizing: border-box; background: #fff; }
.handout .slide { zoom: %(zoom)s; margin: 0; box-shadow: 0 0 0 1px #d0d7de; }
@media print {
  @page { size: A4; margin: 12mm 10mm; }
  .handout .sheet { break-after: page; margin: 0; }
  .handout .slide { break-after: auto; }
}
"""

# Fit each slide: --k smaller (down to MIN_K) until every element of its body lies in its
# content box (inside the padding) and the footer in the slide; the style keeps every text at
# MIN_TEXT_PX or more whatever --k, so a slide that cannot fit sticks out (the tests see it). A
# table also grows (up to MAX_K_TABLE) while it fits. Then (decks only) one slide at a time,
# scaled to the window, with keys, buttons and #N.
SCRIPT = """
(function () {
  var MIN_K = 0.6, MAX_K_TABLE = 1.5;
  var slides = [].slice.call(document.querySelectorAll('.slide'));
  function inside(e, r) {
    var q = e.getBoundingClientRect();
    return q.left >= r.left - 1 && q.right <= r.right + 1 && q.top >= r.top - 1 &&
           q.bottom <= r.bottom + 1;
  }
  function fits(s) {
    var r = s.getBoundingClientRect(), cs = getComputedStyle(s), z = r.width / s.offsetWidth;
    var box = {left: r.left + parseFloat(cs.paddingLeft) * z,
               right: r.right - parseFloat(cs.paddingRight) * z,
               top: r.top + parseFloat(cs.paddingTop) * z,
               bottom: r.bottom - parseFloat(cs.paddingBottom) * z};
    return [].slice.call(s.querySelectorAll('*')).every(function (e) {
      var q = e.getBoundingClientRect();    // not drawn (the notes, an SVG's defs): no box
      if (q.width === 0 && q.height === 0) return true;
      return e.closest('footer') ? inside(e, r) : inside(e, box);
    }) && s.scrollWidth <= s.clientWidth + 1 && s.scrollHeight <= s.clientHeight + 1;
  }
  function setK(s, k) { s.style.setProperty('--k', k); }
  function fit() {
    slides.forEach(function (s) {
      var shown = s.style.display, k = 1;
      s.style.display = 'flex';
      while (!fits(s) && k > MIN_K + 1e-9) { k = Math.round((k - 0.05) * 100) / 100; setK(s, k); }
      if (s.dataset.kind === 'table') {
        while (k < MAX_K_TABLE - 1e-9) {
          setK(s, Math.round((k + 0.05) * 100) / 100);
          if (!fits(s)) { setK(s, k); break; }
          k = Math.round((k + 0.05) * 100) / 100;
        }
      }
      s.style.display = shown;
    });
    document.documentElement.dataset.fitted = 'yes';
  }
  var deck = document.body.classList.contains('deck');
  var i = 0;
  function show(n) {
    i = Math.max(0, Math.min(slides.length - 1, n));
    slides.forEach(function (s, k) { s.classList.toggle('active', k === i); });
    history.replaceState(null, '', '#' + (i + 1));
  }
  function scale() {
    var s = Math.min(innerWidth / %(w)d, innerHeight / %(h)d);
    document.documentElement.style.setProperty('--s', s);
  }
  function start() {
    fit();
    if (!deck) { return; }
    document.documentElement.classList.add('js');
    scale();
    show((parseInt(location.hash.slice(1), 10) || 1) - 1);
    addEventListener('resize', scale);
    addEventListener('keydown', function (e) {
      var next = {ArrowRight: 1, ArrowDown: 1, PageDown: 1, ' ': 1,
                  ArrowLeft: -1, ArrowUp: -1, PageUp: -1}[e.key];
      if (next) { show(i + next); e.preventDefault(); }
      else if (e.key === 'Home') { show(0); } else if (e.key === 'End') { show(slides.length - 1); }
      else if (e.key === 'n' || e.key === 'N') {
        document.documentElement.classList.toggle('notes');   // the speaker notes
      }
    });
    document.getElementById('prev').onclick = function () { show(i - 1); };
    document.getElementById('next').onclick = function () { show(i + 1); };
    window.tokenflowDeck = {show: show, current: function () { return i; }, count: slides.length};
  }
  // fit once the fonts (and the inline images) are in
  addEventListener('load', function () { document.fonts.ready.then(start); });
})();
"""


# The slides are the book's text and figures: CC BY 4.0 (LICENSE-text), named on every slide.
LICENCE = "CC BY 4.0"


def _page(
    title: str, lang: str, body_class: str, body: str, css: str, handout: bool = False
) -> str:
    style = STYLE % {"w": WIDTH, "h": HEIGHT, "blue": HIDDEN_BLUE, "font": FONT_FAMILY,
                     "body_px": MIN_TEXT_PX}
    style += KIT_STYLE % {"blue": HIDDEN_BLUE}
    if handout:
        style += HANDOUT_STYLE % {"zoom": f"{HANDOUT_ZOOM:.7g}", "h": A4_PRINT_HEIGHT - 4}
    return (f'<!doctype html>\n<html lang="{lang}">\n<head>\n<meta charset="utf-8">\n'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">\n'
            f'<link rel="icon" href="data:,">\n<title>{html.escape(title)}</title>\n'
            f"<style>\n{css}{style}</style>\n</head>\n<body class=\"{body_class}\">\n{body}\n"
            f"<script>{SCRIPT % {'w': WIDTH, 'h': HEIGHT}}</script>\n</body>\n</html>\n")


def _slide_html(deck: Deck, k: int, slide: Slide) -> str:
    heading = (f"<h1>{slide.title}</h1>" if slide.kind == "title" else f"<h2>{slide.title}</h2>")
    notes = f'<aside class="notes">{slide.notes}</aside>' if slide.notes else ""
    return (f'<section class="slide" data-kind="{slide.kind}" data-chapter="{deck.number}" '
            f'id="s{deck.number}-{k + 1}">{heading}<div class="body">{slide.body}</div>{notes}'
            f"<footer><span>tokenflow · {deck.page.split('/')[-1]} · {LICENCE}</span>"
            f"<span>{k + 1} / {len(deck.slides)}</span></footer></section>")


def deck_html(deck: Deck, lang: str, css: str) -> str:
    """One deck as a standalone HTML file (``lang``: the HTML language tag)."""
    nav = ('<nav class="deck-nav"><button id="prev" aria-label="previous slide">&#8249;</button>'
           '<button id="next" aria-label="next slide">&#8250;</button></nav>')
    slides = "\n".join(_slide_html(deck, k, s) for k, s in enumerate(deck.slides))
    return _page(plain(deck.title), lang, "deck", f"{slides}\n{nav}", css)


def handout_html(decks: list[Deck], lang: str, css: str,
                 prompts: dict[str, list[str]] | None = None, edition: str = "en") -> str:
    """The handout on A4 (print it): the diagram slide and the cheat sheet (one page each),
    then every deck, :data:`PER_SHEET` slides to a sheet, a chapter starting a sheet; after a
    chapter's slides its "predict, then run" prompts (``prompts``: deck number -> inline HTML)
    and ruled lines for notes, on its last sheet when that holds one slide, else on a sheet
    of their own. ``lang`` is the HTML language tag, ``edition`` the book's (``en``,
    ``zh_CN``). Each ``.sheet`` is one printed page."""
    diagram = diagram_deck(edition)
    whole = _slide_html(diagram, 0, diagram_slide(edition))
    sheets = [f'<div class="sheet" data-chapter="kit">{whole}'
              f'<div class="lines"></div></div>', cheat_sheet(edition)]
    w = KIT_WORDS[edition]
    for deck in decks:
        chapter = []
        for start in range(0, len(deck.slides), PER_SHEET):
            part = deck.slides[start:start + PER_SHEET]
            chapter.append("".join(_slide_html(deck, start + k, s) for k, s in enumerate(part)))
        asks = (prompts or {}).get(deck.number, [])
        block = (f'<div class="prompts"><h3>{html.escape(w["prompts"])}</h3>'
                 + ("".join(f"<p>{a}</p>" for a in asks) or f"<p>{w['no_prompts']}</p>")
                 + f'</div><div class="lines" aria-label="{html.escape(w["notes"])}"></div>')
        if len(deck.slides) % PER_SHEET:
            chapter[-1] += block
        else:
            chapter.append(block)
        sheets += [f'<div class="sheet" data-chapter="{deck.number}">{c}</div>' for c in chapter]
    return _page("tokenflow handout", lang, "handout", "\n".join(sheets), css, handout=True)


def index_html(decks: list[Deck], lang: str, css: str) -> str:
    """A list of the decks and the handout."""
    items = ('<li><a href="diagram.html">diagram.html</a></li>'
             + "".join(f'<li><a href="{d.number}.html">{d.title}</a> ({len(d.slides)})</li>'
                       for d in decks))
    body = (f'<section class="slide" data-kind="index"><h2>tokenflow</h2><div class="body">'
            f'<ul class="decks">{items}</ul><p><a href="handout.html">handout.html</a> (A4),'
            f' <a href="cheatsheet.html">cheatsheet.html</a> (A4)</p>'
            f"</div></section>")
    return _page("tokenflow slides", lang, "index", body, css)


def _all_text(decks: list[Deck]) -> str:
    text = "".join(d.title + "".join(s.title + s.body + s.notes for s in d.slides)
                   for d in decks)
    return re.sub(r"data:[^\"')]+", "", text)


def build(root: Path = ROOT, out: Path | None = None, lang: str = "en") -> list[Path]:
    """Write the decks, the handout and the index of edition ``lang`` (``en`` or ``zh_CN``)
    into ``out`` (default: where the book puts them); return the paths written.

    Raises:
        ValueError: for an unknown ``lang`` or a notebook :func:`chapter_deck` refuses.
    """
    if lang not in EDITIONS:
        raise ValueError(f"lang must be one of {sorted(EDITIONS)}, got {lang!r}")
    folder, tag = EDITIONS[lang]
    out = out or root / "_build" / "html" / folder / "slides"
    decks = [chapter_deck(nb, root, lang) for nb in chapters(root)]
    prompts = {nb.stem[:2]: exercise_prompts(nb, root, lang) for nb in chapters(root)}
    kit = diagram_deck(lang)
    css = font_css(_all_text(decks + [kit]) + cheat_sheet(lang)
                   + "".join(KIT_WORDS[lang].values()) + "".join(sum(prompts.values(), [])))
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    written = []
    for deck in decks:
        written.append(out / f"{deck.number}.html")
        written[-1].write_text(deck_html(deck, tag, css), encoding="utf-8")
    sheet = _page(plain(KIT_WORDS[lang]["sheet"]), tag, "handout", cheat_sheet(lang), css,
                  handout=True)
    for name, text in (("handout.html", handout_html(decks, tag, css, prompts, lang)),
                       ("index.html", index_html(decks, tag, css)),
                       ("diagram.html", deck_html(kit, tag, css)),
                       ("cheatsheet.html", sheet)):
        written.append(out / name)
        written[-1].write_text(text, encoding="utf-8")
    return written


# --- the workshop kit: the diagram, the cheat sheet, prompts, speaker notes ------------------
# Words of the kit that are not the book's prose (which comes from the catalogs), per edition.
KIT_WORDS = {
    "en": {
        "diagram": "The token flow: one forward pass and the decode loop",
        "diagram_notes": ("Start every session here. Follow one token from left to right: its "
                          "id [B,S] is looked up, the hidden state [B,S,H] passes every block "
                          "(attention reads the KV cache, then a dense FFN or K of E experts), "
                          "the LM head turns the last one into V logits, sampling picks the "
                          "next id, and decode feeds it back. Ask which box the chapter opens."),
        "part_enter": "The token enters a block: lookup, attention, the KV cache",
        "part_ffn": "The FFN of a block: dense, or K of E experts",
        "part_out": "After the last block: logits, sampling, the next token",
        "part_ffn_notes": ("FFN type? is a property of the layer: a dense FFN, or the router "
                           "picks K of E experts, dispatch sends each token's hidden state "
                           "there and combine sums the answers with the router's weights. "
                           "Ask what travels: the id, or the hidden state?"),
        "part_out_notes": ("Every block hands back [B,S,H]; after the last one the LM head "
                           "scores all V entries, sampling picks one id and the decode loop "
                           "feeds it back as the next token id. Ask how many logits there are "
                           "for DeepSeek-V3."),
        "sheet": "tokenflow cheat sheet: one token through an LLM",
        "line": "The line, with shapes",
        "letters": ("B batch (sequences together), S sequence length, H hidden_size, "
                    "V vocab_size, E num_experts, K num_experts_per_tok (top-k), L layers."),
        "seed": "Three real-model numbers in their places",
        "formulas": "Formulas (each example computed by tokenflow.analysis)",
        "prompts": "Predict, then run",
        "notes": "Notes",
        "title_notes": "Ask the question first and collect guesses; then run the notebook top "
                       "to bottom. In the room: ",
        "figure_notes": "Before showing it, ask what the figure will show. ",
        "table_notes": "Ask for one number of the table before showing it.",
        "table_rows": "Rows {first} to {last} of {rows}: the table is split to stay readable.",
        "table_columns": ("Columns shown here: {columns}; the table's other columns are on "
                          "the next or previous slide, with the same rows."),
        "list_sep": ", ",
        "numbers_notes": "Ask the room for each number before revealing it: the notebook's "
                         "last section computes every one.",
        "no_prompts": "(this chapter's exercises are for homework)",
    },
    "zh_CN": {
        "diagram": "词元的流动：一次前向和解码循环",
        "diagram_notes": ("每节课都从这里开始。从左到右跟着一个词元走：它的 id [B,S] "
                          "被查表，隐藏状态 [B,S,H] 经过每一个块（注意力读取 KV 缓存，"
                          "然后是稠密 FFN 或 E 个专家中的 K 个），LM 头把最后的隐藏状态"
                          "变成 V 个 logits，采样选出下一个 id，解码时再把它送回来。"
                          "问大家：这一章从哪个方框讲起？"),
        "part_enter": "词元进入一个块：查表、注意力、KV 缓存",
        "part_ffn": "块中的 FFN：稠密，或 E 个专家中的 K 个",
        "part_out": "最后一个块之后：logits、采样、下一个词元",
        "part_ffn_notes": ("FFN 类型是层的属性：要么是稠密 FFN，要么由路由器从 E 个专家中选出"
                           " K 个，"
                           "分发把每个词元的隐藏状态送过去，合并再按路由权重把结果加起来。"
                           "问大家：传输的是 id，还是隐藏状态？"),
        "part_out_notes": ("每个块都交回 [B,S,H]；最后一个块之后，LM 头给全部 V 个条目打分，"
                           "采样选出一个 id，解码循环把它作为下一个词元 id 送回来。"
                           "问大家：DeepSeek-V3 有多少个 logits？"),
        "sheet": "tokenflow 速查表：一个词元穿过 LLM",
        "line": "整条路径和形状",
        "letters": ("B 批大小（一起处理的序列数），S 序列长度，H hidden_size，V vocab_size，"
                    "E num_experts，K num_experts_per_tok，L 层数。"),
        "seed": "三个真实模型的数字各在其位",
        "formulas": "公式（每个例子都由 tokenflow.analysis 算出）",
        "prompts": "先预测，再运行",
        "notes": "笔记",
        "title_notes": "先提出问题、收集大家的猜测，再从头到尾运行笔记本。课上做的练习：",
        "figure_notes": "展示之前，先问大家图上会是什么。",
        "table_notes": "展示之前，先让大家猜表中的一个数。",
        "table_rows": "第 {first} 到 {last} 行，共 {rows} 行：表格拆开放，才看得清。",
        "table_columns": "这一页显示的列：{columns}；表格的其余列在前一页或后一页，行相同。",
        "list_sep": "、",
        "numbers_notes": "每个数公布之前都先让大家猜：它们都由笔记本最后一节算出。",
        "no_prompts": "（本章练习留作课后作业）",
    },
}
# The diagram on a 1280 x 720 slide: each node of data/token_flow.mmd at (column, row) of a
# 7 x 3 grid, read left to right (top: the KV cache and the MoE path, middle: the forward
# pass, bottom: from the last block back to the next token).
DIAGRAM_GRID = {
    "kv_cache": (3, 0), "router": (4, 0), "dispatch": (5, 0), "expert_compute": (6, 0),
    "token_id": (0, 1), "embedding": (1, 1), "hidden": (2, 1), "attention": (3, 1),
    "ffn_type": (4, 1), "dense_ffn": (5, 1), "combine": (6, 1),
    "next_token": (0, 2), "sampling": (1, 2), "logits": (2, 2), "lm_head": (3, 2),
    "final": (4, 2), "updated": (5, 2),
}
DIAGRAM_BOX = (1160, 540, 156, 116)   # the drawing's width, height; a box's width, height
# a label's first line, its other lines and the arrows': the cheat sheet draws the 1,160 px wide
# drawing 718 px wide on A4, so 18 px is 8.4 pt on paper (8 pt at least)
DIAGRAM_FONT_PX = (19, 18)
DIAGRAM_COLUMNS = 13                   # a label line's width (a Chinese character counts 2)


def _wrap(text: str, width: int) -> list[str]:
    """``text`` in lines of at most ``width`` columns (:func:`_columns`), broken at spaces, or
    between any two characters where a part has no space (Chinese)."""
    lines, line = [], ""
    for piece in re.findall(r"\s+|[\u2e80-\u9fff]|[^\s\u2e80-\u9fff]+", text):
        if line and not piece.isspace() and _columns(line + piece) > width:
            lines.append(line.rstrip())
            line = ""
        line += "" if (piece.isspace() and not line) else piece
    return lines + [line.rstrip()] if line.strip() else lines


def _tr(lang: str):
    """tokenflow.viz.lang's lookup in edition ``lang`` (the one catalog of the viz words)."""
    from tokenflow.viz import lang as viz_lang
    def tr(text: str) -> str:
        before = viz_lang.language()
        viz_lang._state["lang"] = "zh" if lang == "zh_CN" else "en"
        try:
            return viz_lang.tr(text)
        finally:
            viz_lang._state["lang"] = before
    return tr


# The diagram projected: three slides, each a part of the line on a 4 x 2 grid, every text at
# the slides' body size (DIAGRAM_PART_FONT_PX); the whole diagram on one slide (DIAGRAM_GRID,
# smaller text) is for the handout and the cheat sheet, read from paper.
DIAGRAM_PARTS = (
    ("part_enter", {"token_id": (0, 0), "embedding": (1, 0), "hidden": (2, 0),
                    "attention": (3, 0), "kv_cache": (3, 1), "ffn_type": (2, 1)}),
    ("part_ffn", {"ffn_type": (0, 0), "dense_ffn": (1, 0), "updated": (3, 0),
                  "router": (0, 1), "dispatch": (1, 1), "expert_compute": (2, 1),
                  "combine": (3, 1)}),
    ("part_out", {"hidden": (0, 0), "updated": (1, 0), "final": (2, 0), "lm_head": (3, 0),
                  "token_id": (0, 1), "next_token": (1, 1), "sampling": (2, 1),
                  "logits": (3, 1)}),
)
DIAGRAM_PART_BOX = (1160, 500, 240, 130)
DIAGRAM_PART_FONT_PX = MIN_TEXT_PX     # every label and arrow text of a projected part
DIAGRAM_PART_COLUMNS = 18


def diagram_svg(lang: str = "en", grid: dict | None = None) -> str:
    """The token-flow diagram (``tokenflow.viz.load_diagram``) as an inline SVG laid out for a
    landscape slide, its labels in edition ``lang``: the whole of it (:data:`DIAGRAM_GRID`,
    7 x 3, for paper), or the nodes of ``grid`` (one of :data:`DIAGRAM_PARTS`, 4 x 2, every
    text at :data:`DIAGRAM_PART_FONT_PX`) with the arrows between them.

    Raises:
        ValueError: if the diagram has a node :data:`DIAGRAM_GRID` does not place.
    """
    from tokenflow.analysis.trace import COLORS
    from tokenflow.viz import load_diagram
    d, tr = load_diagram(), _tr(lang)
    missing = sorted(set(d.nodes) - set(DIAGRAM_GRID))
    if missing:
        raise ValueError(f"DIAGRAM_GRID places no {missing}: add them")
    whole = grid is None
    grid = DIAGRAM_GRID if whole else grid
    if whole:
        (W, H, bw, bh), (big, small), columns = DIAGRAM_BOX, DIAGRAM_FONT_PX, DIAGRAM_COLUMNS
        cols, rows, margin = 7, 3, 0
    else:
        W, H, bw, bh = DIAGRAM_PART_BOX
        big = small = DIAGRAM_PART_FONT_PX
        columns, cols, rows, margin = DIAGRAM_PART_COLUMNS, 4, 2, 40
    step = big + 4                      # between a label's lines
    # one marker id per part: the parts share a page, and a marker in a hidden slide is not drawn
    arrow = "arrow" if whole else f"arrow-{next(iter(grid))}"
    def centre(node):
        c, r = grid[node]
        return (margin + bw / 2 + c * (W - 2 * margin - bw) / (cols - 1),
                bh / 2 + r * (H - bh) / (rows - 1))
    fills = {"hidden": COLORS["hidden"], "moe": COLORS.get("moe", "#e0b000"),
             "token": COLORS.get("token", "#2e9e44")}
    out = [f'<svg class="diagram" viewBox="0 0 {W} {H}" xmlns="http://www.w3.org/2000/svg" '
           f'role="img" aria-label="{html.escape(tr("MoE experts"))}">',
           f'<defs><marker id="{arrow}" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" '
           'markerHeight="7" orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" '
           'fill="#444"/></marker></defs>']
    for e in d.edges:
        if e.src not in grid or e.dst not in grid:
            continue
        (x1, y1), (x2, y2) = centre(e.src), centre(e.dst)
        if {e.src, e.dst} == {"attention", "kv_cache"}:      # two arrows, side by side
            dx = -22 if e.src == "kv_cache" else 22
            x1, x2 = x1 + dx, x2 + dx
        # from the edge of one box to the edge of the other
        def clip(x, y, tx, ty):
            vx, vy = tx - x, ty - y
            k = min(bw / 2 / abs(vx) if vx else 1e9, bh / 2 / abs(vy) if vy else 1e9)
            return x + vx * k, y + vy * k
        anchor = "middle"
        if whole and e.src == "updated" and e.dst == "hidden":     # next block: under the row
            path = (f"M{x1 - bw / 2:.0f},{y1:.0f} C{x1 - bw:.0f},{y1 - 60:.0f} "
                    f"{x2 + 40:.0f},{y2 + 110:.0f} {x2 + 20:.0f},{y2 + bh / 2:.0f}")
            lx, ly = (x1 + x2) / 2 + 10, y2 + 88
        else:
            (sx, sy), (tx, ty) = clip(x1, y1, x2, y2), clip(x2, y2, x1, y1)
            path = f"M{sx:.0f},{sy:.0f} L{tx:.0f},{ty:.0f}"
            lx, ly = (sx + tx) / 2, (sy + ty) / 2
            if y1 == y2:          # along a row: above it (the top row: below it)
                gap = bh / 2 + 16 + (0 if whole else small / 2)
                ly = y1 + (gap if grid[e.src][1] == 0 else -gap)
            elif x1 == x2:        # down a column: beside the arrow (left, but write KV)
                anchor, lx = (("start", lx + 8) if e.src == "attention" and
                              e.dst == "kv_cache" or whole and e.src != "kv_cache"
                              else ("end", lx - 8))
        dash = ' stroke-dasharray="6 5"' if e.dotted else ""
        out.append(f'<path d="{path}" fill="none" stroke="#444" stroke-width="2"{dash} '
                   f'marker-end="url(#{arrow})"/>')
        if e.label:
            label = html.escape(tr(e.label))
            out.append(f'<text class="edge" x="{lx:.0f}" y="{ly:.0f}" font-size="{small}" '
                       f'text-anchor="{anchor}" dominant-baseline="middle" paint-order="stroke" '
                       f'stroke="#fff" stroke-width="5">{label}</text>')
    for node, label in d.nodes.items():
        if node not in grid:
            continue
        x, y = centre(node)
        fill = fills.get(d.node_class.get(node, ""), "#8b949e")
        ink = "#000" if d.node_class.get(node) == "moe" else "#fff"
        lines = [part for t in label.split("<br/>") for part in _wrap(tr(t), columns)]
        out.append(f'<rect x="{x - bw / 2:.0f}" y="{y - bh / 2:.0f}" width="{bw}" '
                   f'height="{bh}" rx="10" fill="{fill}"/>')
        top = y - (len(lines) - 1) * step / 2
        for k, line in enumerate(lines):
            size, weight = (big, 600) if k == 0 else (small, 400)
            out.append(f'<text x="{x:.0f}" y="{top + k * step:.0f}" font-size="{size}" '
                       f'font-weight="{weight}" fill="{ink}" text-anchor="middle" '
                       f'dominant-baseline="middle">{html.escape(line)}</text>')
    out.append("</svg>")
    return "".join(out)


def diagram_slide(lang: str = "en") -> Slide:
    """The whole diagram on one slide (:func:`diagram_svg`), for the handout."""
    words = KIT_WORDS[lang]
    return Slide("diagram", html.escape(words["diagram"]),
                 f'<div class="diagram">{diagram_svg(lang)}</div>',
                 html.escape(words["diagram_notes"]))


def diagram_deck(lang: str = "en") -> Deck:
    """The deck to project, ``slides/diagram.html``: the diagram in :data:`DIAGRAM_PARTS`,
    one slide each, every text at body size, each with its speaker notes."""
    words = KIT_WORDS[lang]
    deck = Deck("diagram", "notebooks/00_token_flow", html.escape(words["diagram"]))
    n = len(DIAGRAM_PARTS)
    for k, (key, grid) in enumerate(DIAGRAM_PARTS, 1):
        notes = words["diagram_notes"] if k == 1 else words[f"{key}_notes"]
        deck.slides.append(Slide("diagram", html.escape(f"{words[key]} ({k}/{n})"),
                                 f'<div class="diagram">{diagram_svg(lang, grid)}</div>',
                                 html.escape(notes)))
    return deck


PREDICT = re.compile(r"\*\*\d+\. Predict, then (?:run|compute)[^*]*\*\*")


def exercise_prompts(notebook: Path, root: Path = ROOT, lang: str = "en") -> list[str]:
    """The chapter's "predict, then run" exercises (the paragraphs that start ``**N. Predict,
    then run.**``), as inline HTML in edition ``lang`` (translated through the catalog)."""
    prose = Prose(read_catalog(root, lang, f"notebooks/{notebook.stem}"))
    cells = json.loads(notebook.read_text(encoding="utf-8"))["cells"]
    return [prose.inline(text) for cell in cells if cell["cell_type"] == "markdown"
            for kind, _, text in prose.blocks(_source(cell))
            if kind == "paragraph" and PREDICT.match(text)]


def cheat_sheet(lang: str = "en") -> str:
    """The one-page A4 cheat sheet of edition ``lang`` (HTML): the line with its shapes, the
    three real-model numbers where they sit on it, and the four formulas, each with an example
    computed by tokenflow.analysis from the bundled configs (src/tokenflow/data/models.json).

    Raises:
        ValueError: if no bundled config routes to 384 experts (the sheet's 6 of 384).
    """
    from tokenflow.analysis.costmodel import (kv_cache_bytes_per_token, moe_a2a_bytes,
                                              reference_config, reference_models)
    from tokenflow.analysis.roofline import (arithmetic_intensity, flops_per_token, hardware,
                                             ridge_point)
    w, zh = KIT_WORDS[lang], lang == "zh_CN"
    gpt3, ds, llama = (reference_config(n) for n in ("GPT-3-175B", "DeepSeek-V3", "Llama-3-8B"))
    routed = [n for n in reference_models() if n not in ("GPT-3-175B",)
              and getattr(_config_or_none(n), "num_experts", None) == 384]
    if not routed:
        raise ValueError("no bundled config has num_experts = 384 (the sheet's 6 of 384)")
    moe = reference_config(routed[0])
    kv = kv_cache_bytes_per_token(llama, 2)
    fl = flops_per_token(llama, 4096)
    ai_decode = arithmetic_intensity(llama, new_tokens=1, cached_tokens=4095)
    ai_prefill = arithmetic_intensity(llama, new_tokens=2048)
    ridge = ridge_point(hardware("H800"))
    a2a = moe_a2a_bytes(1, ds.num_experts_per_tok, ds.hidden_size, 2)
    c = llama
    line = ("token ids <b>[B,S]</b> → lookup → hidden state <b>[B,S,H]</b> → L blocks: "
            "attention (reads, writes the KV cache) + FFN or MoE (top-k of E experts), "
            "<b>[B,S,H]</b> → final hidden state <b>[B,1,H]</b> → LM head W [V,H] → "
            "<b>[B,1,V]</b> logits → sample (temperature, top-k, top-p) → next id <b>[B]</b>; "
            "decode feeds it back as [B,1].")
    if zh:
        line = ("词元 id <b>[B,S]</b> → 查表 → 隐藏状态 <b>[B,S,H]</b> → L 个块：注意力（读、写 KV "
                "缓存）+ FFN 或 MoE（E 个专家中的 K 个），<b>[B,S,H]</b> → 最终隐藏状态 "
                "<b>[B,1,H]</b> → LM 头 W [V,H] → <b>[B,1,V]</b> logits → "
                "采样（温度、top-k、top-p）→ 下一个 id <b>[B]</b>；解码时以 [B,1] 送回。")
    seed = [
        (f"H = {gpt3.hidden_size:,}", f"GPT-3 的 hidden_size：隐藏状态 [B, S, H]，H = "
         f"{gpt3.hidden_size:,}" if zh else
         f"GPT-3's hidden_size: the hidden state [B, S, H], H = {gpt3.hidden_size:,}"),
        (f"V = {ds.vocab_size:,}", f"DeepSeek-V3 的 vocab_size：logits [B, V]，V = "
         f"{ds.vocab_size:,}" if zh else
         f"DeepSeek-V3's vocab_size: the logits [B, V], V = {ds.vocab_size:,}"),
        (f"{moe.num_experts_per_tok} of {moe.num_experts}" if not zh else
         f"{moe.num_experts} 选 {moe.num_experts_per_tok}",
         f"{routed[0]} 的路由专家：每个词元 K = {moe.num_experts_per_tok}，E = {moe.num_experts}"
         f"（其配置仅来自未经核实的第三方副本；DeepSeek-V3 为 {ds.num_experts} 选 "
         f"{ds.num_experts_per_tok}）"
         if zh else f"{routed[0]}'s routed experts: K = {moe.num_experts_per_tok} per token "
         f"of E = {moe.num_experts} (its config known only from unverified third-party copies; "
         f"DeepSeek-V3 routes {ds.num_experts_per_tok} of {ds.num_experts})"),
    ]
    kvf = (f"2 × L × num_key_value_heads × head_dim × bytes = 2 × {c.num_hidden_layers} × "
           f"{c.num_key_value_heads} × {c.head_dim} × 2 = {kv:,} B")
    formulas = [
        ("每个词元的 KV 字节" if zh else "KV bytes per token",
         kvf + ("（Llama-3-8B，bf16）" if zh else " (Llama-3-8B, bf16)")),
        ("每个词元的 FLOP" if zh else "FLOPs per token",
         ("≈ 2 × 激活参数 + 注意力读上下文：" if zh else
          "≈ 2 × active parameters + attention over the context: ")
         + f"{fl / 1e9:.1f} GFLOP" + ("（Llama-3-8B，上下文 4,096 时解码）" if zh else
                                      " (Llama-3-8B, a decode step at context 4,096)")),
        ("算术强度" if zh else "Arithmetic intensity",
         ("FLOP / 搬运的字节：" if zh else "FLOPs / bytes moved: ")
         + (f"解码（1 条序列）{ai_decode:.1f}，2,048 个词元的预填充 {ai_prefill:,.0f}；"
            f"H800 的拐点（bf16）{ridge:.0f}：解码受内存限制" if zh else
            f"decode (1 sequence) {ai_decode:.1f}, a 2,048-token prefill {ai_prefill:,.0f}; "
            f"the H800's ridge (bf16) {ridge:.0f}: decode is memory-bound")),
        ("all-to-all 字节" if zh else "All-to-all bytes",
         f"tokens × K × H × bytes = 1 × {ds.num_experts_per_tok} × {ds.hidden_size:,} × 2 = "
         f"{a2a:,} B" + ("：DeepSeek-V3 一个词元每个 MoE 层的分发量，合并再送回同样多" if zh else
                         ": DeepSeek-V3, one token, one MoE layer, dispatch; combine sends as "
                         "much back")),
    ]
    rows = "".join(f"<tr><th>{html.escape(a)}</th><td>{html.escape(b)}</td></tr>"
                   for a, b in seed)
    frows = "".join(f"<tr><th>{html.escape(a)}</th><td>{html.escape(b)}</td></tr>"
                    for a, b in formulas)
    return (f'<div class="sheet cheatsheet" data-chapter="kit"><h1>{html.escape(w["sheet"])}'
            f'</h1><h2>{html.escape(w["line"])}</h2><p class="line">{line}</p>'
            f'<p>{html.escape(w["letters"])}</p><h2>{html.escape(w["seed"])}</h2>'
            f'<table>{rows}</table><h2>{html.escape(w["formulas"])}</h2><table>{frows}</table>'
            f'<div class="diagram">{diagram_svg(lang)}</div></div>')


def _config_or_none(name: str):
    from tokenflow.analysis.costmodel import reference_config
    try:
        return reference_config(name)
    except (ValueError, KeyError):
        return None


def speaker_notes(deck: Deck, prompts: list[str], lang: str = "en") -> None:
    """Give every slide of ``deck`` its speaker notes (HTML; in place): the title slide the
    chapter's "predict, then run" prompts, a figure its caption and a question, a table or a
    numbers slide a question for the room."""
    w = KIT_WORDS[lang]
    for s in deck.slides:
        if s.notes:
            continue
        if s.kind == "title":
            s.notes = html.escape(w["title_notes"]) + (" ".join(prompts) or w["no_prompts"])
        elif s.kind == "figure":
            cap = re.search(r"<figcaption>(.*?)</figcaption>", s.body, re.S)
            s.notes = html.escape(w["figure_notes"]) + (cap.group(1) if cap else "")
        else:
            s.notes = html.escape(w[f"{s.kind}_notes"] if f"{s.kind}_notes" in w
                                  else w["table_notes"])
        if s.part:
            first, last, rows, shown = s.part
            if (first, last) != (1, rows):
                s.notes += " " + html.escape(w["table_rows"].format(first=first, last=last,
                                                                    rows=rows))
            if shown:
                s.notes += " " + html.escape(w["table_columns"].format(
                    columns=w["list_sep"].join(shown)))


KIT_STYLE = """
.slide .diagram { flex: 1 1 auto; min-height: 0; display: flex; }
.slide .diagram svg { width: 100%%; height: 100%%; }
.slide aside.notes { display: none; }
html.js.notes .slide.active aside.notes { display: block; position: fixed; left: 0; right: 0;
  bottom: 0; max-height: 40vh; overflow: auto; background: #fffbe6; border-top: 2px solid
  #e0b000; padding: 8px 16px; font-size: 18px; z-index: 3; }
.handout .prompts { width: 718px; font-size: 12.5px; line-height: 1.35; margin: 0; }
.handout .prompts h3 { font-size: 14px; margin: 0 0 4px; color: %(blue)s; }
.handout .prompts p { margin: 0 0 4px; }
.handout .lines { width: 718px; flex: 1 1 auto; min-height: 60px;
  background: repeating-linear-gradient(#fff 0 25px, #d0d7de 25px 26px); }
.cheatsheet { width: 718px; font-size: 13px; line-height: 1.4; color: #1f2328; }
.cheatsheet h1 { font-size: 22px; color: %(blue)s; margin: 0 0 6px; }
.cheatsheet h2 { font-size: 15px; color: %(blue)s; margin: 10px 0 4px;
  border-bottom: 2px solid %(blue)s; }
.cheatsheet p { margin: 0 0 4px; }
.cheatsheet p.line { font-size: 14px; }
.cheatsheet table { border-collapse: collapse; width: 100%%; }
.cheatsheet th { text-align: left; white-space: nowrap; padding: 2px 10px 2px 0;
  vertical-align: top; }
.cheatsheet td { padding: 2px 0; }
.cheatsheet .diagram { margin-top: 10px; }
.cheatsheet .diagram svg { width: 100%%; height: auto; }
@media print { .handout .sheet.cheatsheet { display: block; } }
"""


# --- printing the handout --------------------------------------------------------------------
def print_handout(page, html_path: Path, pdf_path: Path | None) -> dict:
    """Lay out ``html_path`` (a handout.html) in print media at the printable width of A4 with
    the Playwright ``page`` (Chromium) and print it to ``pdf_path`` (None: no PDF). Returns
    ``{"pages": PDF pages or None, "sheets": {chapter: sheets}}``; the page stays open, in
    print media."""
    page.emulate_media(media="print")
    page.set_viewport_size({"width": A4_PRINT_WIDTH, "height": A4_PRINT_HEIGHT})
    page.goto(html_path.resolve().as_uri(), wait_until="load")
    page.wait_for_function("() => document.documentElement.dataset.fitted === 'yes'")
    sheets = page.evaluate("""() => { const n = {};
        for (const s of document.querySelectorAll('.sheet'))
          n[s.dataset.chapter] = (n[s.dataset.chapter] || 0) + 1;
        return n; }""")
    if pdf_path is None:
        return {"pages": None, "sheets": sheets}
    pdf = page.pdf(prefer_css_page_size=True, print_background=True)
    pdf_path.parent.mkdir(parents=True, exist_ok=True)
    pdf_path.write_bytes(pdf)
    return {"pages": pdf_page_count(pdf), "sheets": sheets}


def pdf_page_count(pdf: bytes) -> int:
    """Pages of a PDF that Chromium wrote (its ``/Type /Page`` objects)."""
    return len(re.findall(rb"/Type\s*/Page[^s]", pdf))


def _chromium(playwright_executable: str | None = None) -> str | None:
    """scripts/chromium.py's :func:`find_chromium`, the lookup the browser tests use."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("tokenflow_chromium",
                                                  ROOT / "scripts" / "chromium.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.find_chromium(playwright_executable)


def handout(root: Path = ROOT, out: Path | None = None) -> list[Path]:
    """Print every built edition's ``slides/handout.html`` to ``out`` (default _build/handout/):
    ``tokenflow-handout.pdf``, ``tokenflow-handout-zh.pdf``. Raises FileNotFoundError when no
    edition is built (``make book``)."""
    from playwright.sync_api import sync_playwright
    out = out or root / "_build" / "handout"
    jobs = [(root / "_build" / "html" / folder / "slides" / "handout.html",
             out / f"tokenflow-handout{'-' + folder if folder else ''}.pdf")
            for folder, _ in EDITIONS.values()]
    missing = [h for h, _ in jobs if not h.is_file()]
    if missing:
        raise FileNotFoundError(
            f"no {', '.join(map(str, missing))}: run `make book` first (it builds both editions)"
        )
    written = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=_chromium(p.chromium.executable_path),
                                    args=["--no-sandbox"])
        page = browser.new_page()
        for html_path, pdf_path in jobs:
            start = time.perf_counter()
            r = print_handout(page, html_path, pdf_path)
            print(f"{pdf_path}: {r['pages']} A4 pages ({time.perf_counter() - start:.1f} s)")
            written.append(pdf_path)
        browser.close()
    return written


# --- Sphinx extension ------------------------------------------------------------------------
def _build_finished(app, exception) -> None:
    if exception or app.builder.name != "html":
        return
    start = time.perf_counter()
    lang = app.config.language or "en"
    written = build(Path(app.srcdir), Path(app.outdir) / "slides", lang)
    print(f"slides ({lang}): {len(written)} files in {Path(app.outdir) / 'slides'} "
          f"({time.perf_counter() - start:.1f} s)")


def setup(app):
    app.connect("build-finished", _build_finished)
    return {"parallel_read_safe": True, "parallel_write_safe": True}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=["build", "handout"])
    parser.add_argument("--lang", default="en", choices=sorted(EDITIONS), help="build: the edition")
    parser.add_argument(
        "--out", type=Path, help="build: folder for the decks; handout: for the PDFs"
    )
    args = parser.parse_args(argv)
    try:
        if args.command == "build":
            for path in build(ROOT, args.out, args.lang):
                print(path)
        else:
            handout(ROOT, args.out)
    except (ValueError, FileNotFoundError) as exc:
        print(f"slides {args.command}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
