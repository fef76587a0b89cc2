"""The HTML book builds strictly from the stored notebook outputs, and works offline.

Builds the book once (``jupyter-book build -W -n --keep-going``) into a temporary folder and
checks the pages: every _toc.yml entry is there, widget pages load require.js and the
html-manager from local files that exist (no CDN), and chapter 0 shows the predicted token.
"""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest
import yaml

from helpers import load_script

ROOT = Path(__file__).resolve().parents[1]
CHAPTER0 = "notebooks/00_token_flow"
WIDGET_STATE_MIME = "application/vnd.jupyter.widget-state+json"
# Widget modules that embed-amd.js bundles; anything else would be fetched from a CDN.
BUNDLED_WIDGET_MODULES = {
    "@jupyter-widgets/base",
    "@jupyter-widgets/controls",
    "@jupyter-widgets/output",
}
CDN_HOSTS = ("cdnjs", "jsdelivr", "unpkg")
CDN_WIDGET_JS = re.compile(
    r"(?:cdnjs|jsdelivr|unpkg)[^\"'\s<>]*(?:require(?:\.min)?\.js|html-manager|embed-amd)", re.I
)


@pytest.fixture(scope="module")
def html_dir(book_html_dir) -> Path:
    """The book built once per test run (conftest.py's ``book_html_dir``)."""
    return book_html_dir


class _Tags(HTMLParser):
    """Collects <script> (src, attributes, inline body) and <link href> of a page."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.scripts: list[dict] = []
        self.links: list[dict] = []
        self._open: dict | None = None

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "script":
            self._open = {"attrs": attrs, "body": ""}
            self.scripts.append(self._open)
        elif tag == "link":
            self.links.append(attrs)

    def handle_data(self, data):
        if self._open is not None:
            self._open["body"] += data

    def handle_endtag(self, tag):
        if tag == "script":
            self._open = None


def _parse(page: Path) -> _Tags:
    tags = _Tags()
    tags.feed(page.read_text(encoding="utf-8"))
    return tags


def _resolve(page: Path, url: str) -> Path:
    """The local file a relative URL on `page` points at (query and fragment dropped)."""
    return (page.parent / unquote(urlsplit(url).path)).resolve()


def _is_remote(url: str) -> bool:
    return bool(urlsplit(url).scheme) or url.startswith("//")


def _toc_files(toc: dict) -> list[str]:
    files = [toc["root"]]

    def walk(entries):
        for entry in entries or []:
            if "file" in entry:
                files.append(entry["file"])
            walk(entry.get("sections"))
            walk(entry.get("chapters"))

    walk(toc.get("parts"))
    walk(toc.get("chapters"))
    walk(toc.get("sections"))
    return files


def _pages(html_dir: Path) -> list[Path]:
    return sorted(
        p for p in html_dir.rglob("*.html") if "_static" not in p.relative_to(html_dir).parts
    )


def test_index_and_every_toc_page_exist(html_dir):
    assert (html_dir / "index.html").is_file()
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text(encoding="utf-8"))
    files = _toc_files(toc)
    assert CHAPTER0 in files
    missing = [f for f in files if not (html_dir / f"{Path(f).with_suffix('')}.html").is_file()]
    assert not missing, f"pages listed in _toc.yml but not built: {missing}"


def test_offline_widget_js_is_in_the_output(html_dir):
    widgets = html_dir / "_static" / "tokenflow-widgets"
    for name in ("require.js", "embed-amd.js"):
        assert (widgets / name).stat().st_size > 10_000, (
            f"{name} missing or empty in the HTML output"
        )
    assert "define(" in (widgets / "embed-amd.js").read_text(encoding="utf-8")[:200_000]


def test_chapter0_scripts_are_local_and_exist(html_dir):
    page = html_dir / f"{CHAPTER0}.html"
    tags = _parse(page)
    srcs = [s["attrs"]["src"] for s in tags.scripts if s["attrs"].get("src")]
    assert srcs, "chapter 0 has no <script src>"
    remote = [u for u in srcs if _is_remote(u)]
    assert not remote, f"chapter 0 loads scripts from the network: {remote}"
    missing = [u for u in srcs if not _resolve(page, u).is_file()]
    assert not missing, f"chapter 0 references scripts missing from the output: {missing}"


def test_widget_pages_load_local_require_and_html_manager(html_dir):
    for page in _pages(html_dir):
        tags = _parse(page)
        states = [s for s in tags.scripts if s["attrs"].get("type") == WIDGET_STATE_MIME]
        if not states:
            continue
        srcs = [s["attrs"]["src"] for s in tags.scripts if s["attrs"].get("src")]
        names = [Path(urlsplit(u).path).name for u in srcs]
        assert "require.js" in names and "embed-amd.js" in names, (
            f"{page.name}: widget JS not loaded"
        )
        assert names.index("require.js") < names.index("embed-amd.js"), (
            f"{page.name}: require.js must load first"
        )
        for u in srcs:
            if Path(urlsplit(u).path).name in ("require.js", "embed-amd.js"):
                assert not _is_remote(u), f"{page.name}: {u} is not local"
                assert _resolve(page, u).is_file(), f"{page.name}: {u} does not exist in the output"
        for s in tags.scripts:
            cdn = s["attrs"].get("data-jupyter-widgets-cdn")
            assert cdn is None or not _is_remote(cdn), f"{page.name}: widget CDN {cdn}"
        for state in states:
            models = json.loads(state["body"])["state"].values()
            modules = {m["model_module"] for m in models}
            assert modules <= BUNDLED_WIDGET_MODULES, (
                f"{page.name}: widget modules {modules - BUNDLED_WIDGET_MODULES} are not bundled "
                "in embed-amd.js and would be fetched from a CDN"
            )


def test_no_page_uses_a_cdn_for_scripts_or_styles(html_dir):
    for page in _pages(html_dir):
        text = page.read_text(encoding="utf-8")
        assert not CDN_WIDGET_JS.search(text), (
            f"{page.name} references require.js/html-manager on a CDN"
        )
        tags = _parse(page)
        for s in tags.scripts:
            src = s["attrs"].get("src")
            if src:
                assert not _is_remote(src), f"{page.relative_to(html_dir)}: <script src={src}>"
        for link in tags.links:
            rel = link.get("rel") or ""
            href = link.get("href") or ""
            if rel in ("stylesheet", "preload", "modulepreload"):
                assert not _is_remote(href), (
                    f"{page.relative_to(html_dir)}: <link rel={rel} href={href}>"
                )
                assert not any(h in href for h in CDN_HOSTS)


def test_chapter0_shows_the_predicted_token(html_dir):
    text = (html_dir / f"{CHAPTER0}.html").read_text(encoding="utf-8")
    assert "都" in text


def test_diagram_pages_draw_mermaid_from_a_local_file(html_dir):
    """Chapters 00 and 06 show the token-flow diagram (src/tokenflow/data/token_flow.mmd) as a
    <pre class="mermaid"> drawn by the vendored mermaid.min.js, which loads before require.js."""
    for chapter in (CHAPTER0, "notebooks/06_big_picture"):
        page = html_dir / f"{chapter}.html"
        text = page.read_text(encoding="utf-8")
        assert '<pre class="mermaid tokenflow-mermaid">' in text, f"{chapter}: no diagram"
        assert "route top-k" in text and "project vocab" in text
        srcs = [s["attrs"]["src"] for s in _parse(page).scripts if s["attrs"].get("src")]
        names = [Path(urlsplit(u).path).name for u in srcs]
        assert "mermaid.min.js" in names, f"{chapter}: mermaid.min.js not loaded"
        url = srcs[names.index("mermaid.min.js")]
        assert not _is_remote(url) and _resolve(page, url).stat().st_size > 1_000_000
        if "require.js" in names:
            assert names.index("mermaid.min.js") < names.index("require.js")


LICENCE_LINKS = ("https://creativecommons.org/licenses/by/4.0/", "https://opensource.org/license/mit")


def _footer(page: Path) -> str:
    """The theme's extra footer of a built page (sphinx-book-theme: ``<div class="extra_footer">``),
    or "" when the page has none."""
    found = re.search(r'<div class="extra_footer">(.*?)</div>', page.read_text(encoding="utf-8"),
                      re.S)
    return found.group(1) if found else ""


def test_every_page_names_the_licences_in_its_footer(html_dir):
    """Text and figures CC BY 4.0 (LICENSE-text), code MIT (LICENSE), fonts their own: the
    footer of every page says so and links both licences."""
    pages = [p for p in _pages(html_dir) if "zh" not in p.relative_to(html_dir).parts[:1]]
    decks = [p for p in pages if p.relative_to(html_dir).parts[0] == "slides"]
    assert pages and decks
    counted = 0
    for deck in decks:                      # scripts/slides.py: a standalone page per deck
        text = deck.read_text(encoding="utf-8")
        slides = len(re.findall(r'<section class="slide" data-kind="(?!index")', text))
        assert text.count("· CC BY 4.0</span>") == slides, deck.name
        counted += slides
    assert counted
    for page in pages:
        if page in decks or 'http-equiv="Refresh"' in page.read_text(encoding="utf-8"):
            continue                        # a deck, or the root's redirect
        footer = _footer(page)
        name = page.relative_to(html_dir)
        assert "Text and figures" in footer and "CC BY 4.0" in footer, f"{name}: {footer!r}"
        assert "MIT licence" in footer and "Open Font License" in footer, f"{name}: {footer!r}"
        for url in LICENCE_LINKS:
            assert f'href="{url}"' in footer, f"{name}: no link to {url}"


def test_front_page_and_workshop_link_the_book_pdf(html_dir):
    """`make pdf` (scripts/book_pdf.py) writes each edition's whole book next to its pages; the
    front page and the workshop page link it (the Chinese edition: tests/test_i18n.py)."""
    book_pdf = load_script("book_pdf")
    for name in ("book/intro", "book/workshop"):
        page = html_dir / f"{name}.html"
        hrefs = re.findall(r'<p class="tf-pdf"><a href="([^"]+)"', page.read_text(encoding="utf-8"))
        assert len(hrefs) == 1, f"{name}: {hrefs}"
        assert _resolve(page, hrefs[0]) == (html_dir / book_pdf.NAME).resolve(), hrefs[0]
