"""The whole book as one PDF per edition, printed from the built HTML: `make pdf`.

    python scripts/book_pdf.py            # after `make book`: both editions
    python scripts/book_pdf.py --lang en  # one edition

Writes ``_build/html/tokenflow.pdf`` (English) and ``_build/html/zh/tokenflow.pdf`` (Chinese),
next to each edition's ``index.html``, so the book's front page links both with the same
relative link and ``make dist`` packs them. Every page of _toc.yml, in order, is served from
127.0.0.1 and opened in headless Chromium (Playwright; the Chromium scripts/chromium.py finds)
in print media at A4 width; once its fonts (the book's web fonts included), MathJax
and mermaid diagrams are ready, it is checked that nothing is cut or sticks out of the A4
column (:data:`PRINT_JS`, the browser test's check) and printed to A4 (12 mm top and bottom,
10 mm sides). The pages are joined into one file (pypdf) with an outline entry per page; the
licence footer of the pages is printed once, at the end of the front page.

What a printed page shows is the HTML book's print layout (_static/tokenflow.css
``@media print``): each explorer in its first state (the precomputed HTML of its first setting,
its controls hidden), solutions folded, no sidebar or footer. Both editions print their Chinese
and emoji with the book's web fonts (subsets of Noto Sans CJK SC and Noto Color Emoji), so no
glyph depends on the fonts of the machine that prints; each page is checked for a Chinese
character its PDF lacks.
The offline-widget explorers need the normal HTML build's pages: a single-page build
(``singlehtml``) would not draw them. Exit status 1, naming the pages, when a page does not fit
or lacks a glyph.
"""
from __future__ import annotations

import argparse
import functools
import html
import http.server
import importlib.util
import io
import re
import sys
import threading
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
HTML = ROOT / "_build" / "html"
NAME = "tokenflow.pdf"
EDITIONS = {"en": "", "zh_CN": "zh"}            # edition -> folder under _build/html
# Printed on A4 with 10 mm side margins, the page is 190 mm = 718 CSS px wide.
A4_WIDTH_PX = 718
MARGINS = {"top": "12mm", "bottom": "12mm", "left": "10mm", "right": "10mm"}
# In print media nothing may stick out of the A4 width or be cut by its box: every element of
# the article except MathJax's inner parts and inline math, whose glyphs overhang by a pixel or
# two (a display equation's <mjx-math> is checked). ``scope``: the part of the page checked.
# Also counts the explorer controls still visible (none may print).
PRINT_JS = """(W, scope = '.bd-article') => {
  const out = [];
  for (const e of document.querySelectorAll(scope + ' *')) {
    if ((e.closest('mjx-container') && !e.matches('mjx-container[display="true"] > mjx-math'))
        || e.matches('span.math') || !e.checkVisibility()) continue;
    const cs = getComputedStyle(e), r = e.getBoundingClientRect();
    const cut = cs.display !== 'inline' && e.scrollWidth > e.clientWidth + 1
                && cs.overflowX !== 'visible';
    if (cut || r.right > W + 1)
      out.push(`${e.tagName.toLowerCase()}.${String(e.className.baseVal ?? e.className)
                 .slice(0, 30)}: ${cut ? 'cut' : 'sticks out'} (${Math.round(r.right)} px)`);
  }
  return {problems: out.slice(0, 10), count: out.length,
          controls: [...document.querySelectorAll('.tf-controls')].filter(
              c => c.checkVisibility()).length};
}"""
# The licence footer (_config.yml extra_footer) is left out of print with the rest of the page
# chrome; on the PDF's first page it is printed at the end of the article instead.
LICENCE_JS = """() => {
  const footer = document.querySelector('.extra_footer');
  const article = document.querySelector('.bd-article');
  if (!footer || !article) return false;
  const copy = document.createElement('div');
  copy.className = 'tf-pdf-licence';
  copy.style.cssText = 'margin-top: 2em; font-size: 0.85em; border-top: 1px solid #ccc;';
  copy.innerHTML = footer.innerHTML;
  article.appendChild(copy);
  return true;
}"""
# Chinese characters (the ranges of the Chinese edition's web font, build_fonts.WEB_RANGES)
CJK = re.compile(r"[\u2e80-\u9fff\uf900-\ufaff\ufe30-\ufe4f\uff00-\uffef]")
# The text the printed page shows (hidden explorer outputs and folded solutions left out).
TEXT_JS = "() => (document.querySelector('.bd-article') || document.body).innerText"
HAS_WEB_FONT_JS = "() => !!document.querySelector('link[href*=\"tokenflow-zh-font.css\"]')"
# Ready to print: web fonts loaded, MathJax typeset, every mermaid diagram drawn.
READY_JS = """async () => {
  await document.fonts.ready;
  if (window.MathJax && MathJax.startup && MathJax.startup.promise) await MathJax.startup.promise;
  const t0 = Date.now();
  while ([...document.querySelectorAll('pre.tokenflow-mermaid')].some(p => !p.querySelector('svg'))
         && Date.now() - t0 < 15000) await new Promise(r => setTimeout(r, 100));
  await document.fonts.ready;
}"""


def toc_pages(root: Path = ROOT) -> list[str]:
    """Every file of _toc.yml in reading order (root first), without suffix."""
    toc = yaml.safe_load((root / "_toc.yml").read_text(encoding="utf-8"))
    files = [toc["root"]]
    for part in toc.get("parts", []):
        files += [c["file"] for c in part.get("chapters", [])]
    return files


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


def _chromium(playwright_executable: str) -> str:
    spec = importlib.util.spec_from_file_location("tokenflow_chromium",
                                                  ROOT / "scripts" / "chromium.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    exe = module.find_chromium(playwright_executable)
    if exe is None:
        raise FileNotFoundError("no Chromium: `make chromium` finds or installs one")
    return exe


def print_edition(browser, html_dir: Path, out: Path, pages: list[str]) -> dict:
    """Print ``pages`` of the edition built in ``html_dir`` into one PDF ``out``; return
    ``{"pages": {page: A4 pages}, "problems": [...]}``. Every page of both editions links the
    book's web fonts (scripts/tokenflow_i18n.py), so the PDF carries every glyph whatever the
    machine; a page without them, or a Chinese character the page shows but the PDF's text
    lacks (a missing glyph), is a problem."""
    from pypdf import PdfReader, PdfWriter
    handler = functools.partial(_Quiet, directory=str(html_dir))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{httpd.server_address[1]}/"
    ctx = browser.new_context(viewport={"width": A4_WIDTH_PX, "height": 1000})
    page = ctx.new_page()
    page.emulate_media(media="print")
    writer, counts, problems = PdfWriter(), {}, []
    try:
        for name in pages:
            page.goto(base + name + ".html", wait_until="load")
            page.evaluate(READY_JS)
            if not page.evaluate(HAS_WEB_FONT_JS):
                problems.append(f"{name}: the page does not link the book's web fonts")
            shown = set(CJK.findall(page.evaluate(TEXT_JS)))
            if name == pages[0] and not page.evaluate(LICENCE_JS):
                problems.append(f"{name}: no licence footer to print")
            checked = page.evaluate(PRINT_JS, A4_WIDTH_PX)
            problems += [f"{name}: {p}" for p in checked["problems"]]
            if checked["controls"]:
                problems.append(f"{name}: {checked['controls']} explorer controls printed")
            pdf = page.pdf(format="A4", print_background=True, margin=MARGINS)
            reader = PdfReader(io.BytesIO(pdf))
            counts[name] = len(reader.pages)
            missing = shown - set("".join(p.extract_text() or "" for p in reader.pages))
            if missing:
                problems.append(f"{name}: no glyph in the PDF for {''.join(sorted(missing))}")
            title = page.title().split(" — ")[0].split(" | ")[0].strip() or name
            writer.append(reader, outline_item=title)
    finally:
        ctx.close()
        httpd.shutdown()
        httpd.server_close()
    writer.add_metadata({"/Title": page_title(html_dir), "/Author": "the tokenflow authors",
                         "/Subject": "CC BY 4.0 (text and figures); code MIT"})
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("wb") as f:
        writer.write(f)
    return {"pages": counts, "problems": problems}


def page_title(html_dir: Path) -> str:
    """The edition's title, from its front page's <title> (after the page name)."""
    intro = html_dir / "book" / "intro.html"
    found = re.search(r"<title>(.*?)</title>", intro.read_text(encoding="utf-8"), re.S)
    text = html.unescape(found.group(1)) if found else "tokenflow"
    return text.split(" — ")[-1].strip()


def build(langs: list[str], html_root: Path = HTML) -> list[Path]:
    """Print every edition in ``langs``; return the PDFs written. Raises FileNotFoundError when
    an edition is not built, RuntimeError naming the pages that do not fit A4."""
    from playwright.sync_api import sync_playwright
    pages = toc_pages()
    written, problems = [], []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=_chromium(p.chromium.executable_path),
                                    args=["--no-sandbox"])
        try:
            for lang in langs:
                html_dir = html_root / EDITIONS[lang]
                if not (html_dir / f"{pages[0]}.html").is_file():
                    raise FileNotFoundError(f"no {html_dir / pages[0]}.html: run `make book`")
                out = html_dir / NAME
                result = print_edition(browser, html_dir, out, pages)
                problems += [f"{lang} {p}" for p in result["problems"]]
                total = sum(result["pages"].values())
                print(f"{out}: {len(pages)} pages of the book, {total} A4 pages")
                written.append(out)
        finally:
            browser.close()
    if problems:
        raise RuntimeError("does not fit A4:\n" + "\n".join(problems))
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lang", choices=sorted(EDITIONS), action="append",
                        help="an edition (default: both)")
    args = parser.parse_args(argv)
    try:
        build(args.lang or list(EDITIONS))
    except (FileNotFoundError, RuntimeError) as exc:
        print(f"pdf: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
