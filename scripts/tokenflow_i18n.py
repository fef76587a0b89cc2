"""Sphinx extension: the two editions of the book (English and 中文) and the switch between them.

The Chinese edition is the same sources built with ``language=zh_CN`` and the catalogs in
``locale/zh_CN/LC_MESSAGES/<page>.po`` (see scripts/i18n.py and locale/TRANSLATING.md). This
extension adds what Sphinx's own translation step does not cover:

* a language switch in the article header of every page, a plain relative link to the same page
  in the other edition (English at the site root, Chinese under ``zh/``), so it works on
  ``file://`` pages and offline; plus ``<link rel="alternate" hreflang>`` in the page head;
* the part captions of the table of contents: sphinx-external-toc inserts the toctrees (transform
  priority 100) after Sphinx's ``Locale`` transform (priority 20), so their captions are
  translated here, from the root page's catalog, where the gettext builder extracts them;
* per-edition config values that are not messages (``html_title``, the search box placeholder
  ``html_theme_options.search_bar_text``, the licence footer ``html_theme_options.extra_footer``),
  from ``tokenflow_editions`` in _config.yml;
* the book's web fonts, in both editions (the English pages show Chinese examples and an
  emoji): ``src/tokenflow/data/fonts/TokenflowCJK-zh.woff2`` (a subset of Noto Sans CJK SC with
  only the glyphs the pages use) and ``TokenflowEmoji.woff2`` (Noto Color Emoji, the pages'
  emoji), see scripts/build_fonts.py, are copied to ``_static/fonts/`` and declared by
  ``_static/tokenflow-zh-font.css``, inline as ``data:`` URLs (Chromium refuses web fonts from
  ``file://`` URLs), with a ``unicode-range`` of CJK and emoji only: a browser without any
  Chinese or emoji font draws the characters, Latin keeps the theme's font.

* the chapter pages of the Chinese edition come from the Chinese notebooks
  ``notebooks/zh/NN_*.ipynb`` (scripts/zh_notebooks.py: the English notebook with its catalog's
  prose and outputs run in Chinese), read in place of ``notebooks/NN_*.ipynb`` at
  ``source-read``, so the page keeps its name and links (those out of ``notebooks/`` are one
  folder deeper in ``notebooks/zh/`` and moved back); where there is none, the English
  notebook and the catalog, as for every other page.

Loaded by _config.yml (``sphinx: local_extensions: {tokenflow_i18n: scripts/}``).
"""
from __future__ import annotations

import html
import shutil
from pathlib import Path

from sphinx import addnodes
from sphinx.locale import init as init_locale
from sphinx.transforms import SphinxTransform
from sphinx.util.i18n import docname_to_domain

TEMPLATES = str(Path(__file__).with_name("templates"))
SWITCH_TEMPLATE = "tokenflow-language-switch.html"      # the links alone
HEADER_END_TEMPLATE = "tokenflow-header-end.html"      # the links + the theme's buttons, one row
BUTTONS_TEMPLATE = "article-header-buttons.html"       # sphinx-book-theme's header buttons
FONT_DIR = Path("src", "tokenflow", "data", "fonts")                # under srcdir
WEB_FONT = FONT_DIR / "TokenflowCJK-zh.woff2"
WEB_FONT_CSS = "tokenflow-zh-font.css"


def _fonts():
    """tokenflow.viz.fonts, loaded from its file (importing tokenflow.viz would import torch)."""
    import importlib.util
    import sys
    if "tokenflow_web_fonts" not in sys.modules:
        path = Path(__file__).resolve().parents[1] / "src" / "tokenflow" / "viz" / "fonts.py"
        if not path.is_file():           # a copy of the book without src/: the installed package
            spec = importlib.util.find_spec("tokenflow")
            path = Path(spec.submodule_search_locations[0]) / "viz" / "fonts.py"
        spec = importlib.util.spec_from_file_location("tokenflow_web_fonts", path)
        sys.modules["tokenflow_web_fonts"] = module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    return sys.modules["tokenflow_web_fonts"]


WEB_FONTS = _fonts().WEB_FONTS
DEFAULT_EDITIONS = {
    "en": {"label": "English", "path": ""},
    "zh_CN": {"label": "中文", "path": "zh"},
}


def _editions(config) -> dict:
    return config.tokenflow_editions or DEFAULT_EDITIONS


def _current(config) -> str:
    """The edition key of this build: ``config.language`` (Sphinx's default is ``en``)."""
    lang = config.language or "en"
    editions = _editions(config)
    if lang not in editions:
        raise ValueError(f"language={lang!r} is not one of tokenflow_editions {sorted(editions)}")
    return lang


def edition_url(pagename: str, from_path: str, to_path: str) -> str:
    """Relative URL from page ``pagename`` of the edition at ``from_path`` to the same page of the
    edition at ``to_path`` (paths relative to the site root, ``""`` for the root edition).

    >>> edition_url("notebooks/00_token_flow", "", "zh")
    '../zh/notebooks/00_token_flow.html'
    >>> edition_url("intro", "zh", "")
    '../intro.html'
    """
    up = "../" * (pagename.count("/") + (from_path.count("/") + 1 if from_path else 0))
    prefix = f"{to_path}/" if to_path else ""
    return f"{up}{prefix}{pagename}.html"


def _apply_edition_config(app, config) -> None:
    """config-inited: edition title, search text and footer, and the switch in the article
    header."""
    edition = _editions(config)[_current(config)]
    if edition.get("html_title"):
        config.html_title = edition["html_title"]
    options = dict(config.html_theme_options or {})
    for key in ("search_bar_text", "extra_footer"):
        if edition.get(key):
            options[key] = edition[key]
    end = options.get("article_header_end", [BUTTONS_TEMPLATE])
    if isinstance(end, str):
        end = [item.strip() for item in end.split(",") if item.strip()]
    if HEADER_END_TEMPLATE not in end and SWITCH_TEMPLATE not in end:
        # the theme's buttons, wrapped in one row with the switch; else the switch goes first
        end = ([HEADER_END_TEMPLATE if item == BUTTONS_TEMPLATE else item for item in end]
               if BUTTONS_TEMPLATE in end else [SWITCH_TEMPLATE, *end])
    options["article_header_end"] = end
    config.html_theme_options = options
    if TEMPLATES not in config.templates_path:
        config.templates_path = [*config.templates_path, TEMPLATES]


def _add_switch(app, pagename, templatename, context, doctree) -> None:
    """html-page-context: links to this page in every other edition."""
    editions = _editions(app.config)
    here = _current(app.config)
    links = []
    for key, edition in editions.items():
        if key == here:
            continue
        url = edition_url(pagename, editions[here].get("path", ""), edition.get("path", ""))
        hreflang = key.replace("_", "-")
        links.append({"url": url, "label": edition["label"], "hreflang": hreflang})
        context["metatags"] = context.get("metatags", "") + (
            f'<link rel="alternate" hreflang="{hreflang}" href="{html.escape(url)}" />\n'
        )
    context["tokenflow_editions"] = links


class TranslateTocCaptions(SphinxTransform):
    """Translate the captions of the toctrees that sphinx-external-toc inserted (priority 100)."""

    default_priority = 101

    def apply(self, **kwargs) -> None:
        if _current(self.config) == "en" or not self.config.locale_dirs:
            return
        domain = docname_to_domain(self.env.docname, self.config.gettext_compact)
        dirs = [str(Path(self.env.srcdir, d)) for d in self.config.locale_dirs]
        catalog, has_catalog = init_locale(dirs, self.config.language, domain)
        if not has_catalog:
            return
        for toctree in self.document.findall(addnodes.toctree):
            if toctree.get("caption"):
                toctree["caption"] = catalog.gettext(toctree["caption"])


def _web_font_sources(app) -> list[Path]:
    paths = [Path(app.srcdir, FONT_DIR, name) for name, _ in WEB_FONTS]
    for path in paths:
        if not path.is_file():
            raise FileNotFoundError(f"the book's web font {path} is missing "
                                    "(scripts/build_fonts.py makes it)")
    return paths


def web_font_css() -> str:
    """The stylesheet that gives both editions their Chinese characters and emoji
    (:func:`tokenflow.viz.fonts.web_font_css`: inline woff2, the copied files as a second
    source, first in the theme's text and heading families, last in its monospace family)."""
    return _fonts().web_font_css(copied_to="fonts", target="book")


def _add_web_font(app) -> None:
    """builder-inited: every HTML page of both editions links :data:`WEB_FONT_CSS` (the English
    edition shows Chinese examples on every page)."""
    if app.builder.format == "html":
        _web_font_sources(app)
        app.add_css_file(WEB_FONT_CSS)


def _write_web_font(app, exception) -> None:
    """build-finished: write the stylesheet and copy the fonts and their licence to _static/."""
    if exception or app.builder.format != "html":
        return
    static = Path(app.outdir, "_static")
    (static / "fonts").mkdir(parents=True, exist_ok=True)
    for src in _web_font_sources(app):
        shutil.copyfile(src, static / "fonts" / src.name)
    shutil.copyfile(Path(app.srcdir, FONT_DIR, "OFL.txt"), static / "fonts" / "OFL.txt")
    (static / WEB_FONT_CSS).write_text(web_font_css(), encoding="utf-8")


ZH_NOTEBOOKS = Path("notebooks", "zh")   # under srcdir


def _chinese_notebook(app, docname: str, source: list) -> None:
    """In the zh_CN build, the text of ``notebooks/zh/<name>.ipynb`` for the page
    ``notebooks/<name>`` (see the module docstring)."""
    if _current(app.config) == "en" or Path(docname).parent != Path("notebooks"):
        return
    path = Path(app.srcdir) / ZH_NOTEBOOKS / f"{Path(docname).name}.ipynb"
    if path.is_file():
        app.env.note_dependency(str(path))
        source[0] = _links_from_notebooks(path.read_text(encoding="utf-8"), path.parent,
                                          path.parent.parent)


def _links_from_notebooks(text: str, written_in: Path, page_in: Path) -> str:
    """The notebook JSON ``text`` with its markdown cells' links rebased from the folder
    ``written_in`` (notebooks/zh/) to ``page_in`` (notebooks/, where the page lives); a link
    that reaches nothing from ``written_in`` (a notebook written before the links were moved)
    stays as it is."""
    import json
    import sys
    sys.path.insert(0, str(Path(__file__).parent))
    from zh_notebooks import LINK, rebase_links

    def move(m):
        target = m.group(2).partition("#")[0]
        if target and not (Path(written_in) / target).exists():
            return m.group(0)
        return rebase_links(m.group(0), written_in, page_in)

    nb = json.loads(text)
    for cell in nb["cells"]:
        if cell["cell_type"] == "markdown":
            cell["source"] = LINK.sub(move, "".join(cell["source"]))
    return json.dumps(nb, ensure_ascii=False)


def setup(app):
    app.add_config_value("tokenflow_editions", DEFAULT_EDITIONS, "html", types=[dict])
    app.connect("config-inited", _apply_edition_config)
    app.connect("html-page-context", _add_switch)
    app.connect("source-read", _chinese_notebook)
    app.add_transform(TranslateTocCaptions)
    app.connect("builder-inited", _add_web_font)
    app.connect("build-finished", _write_web_font)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
