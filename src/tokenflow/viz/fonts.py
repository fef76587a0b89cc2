"""The font every figure of the book draws with, shipped inside the package.

``TokenflowSans-{Regular,Bold}.ttf`` in ``tokenflow/data/fonts/`` are subsets of Noto Sans CJK
SC (SIL Open Font License 1.1, ``OFL.txt`` beside them; rebuilt by ``scripts/build_fonts.py``):
Latin, Greek, arrows, maths and every Chinese character the corpus, the tokenizer and the
notebooks contain. ``TokenflowSansFallback-{Regular,Bold}.ttf`` hold the few characters Noto
Sans CJK lacks (Latin Extended-A of the byte-level alphabet, U+FFFD), from DejaVu Sans
(``LICENSE_DEJAVU``); matplotlib falls back to them glyph by glyph. :func:`use_book_font` registers
them with matplotlib and makes them the only font family the figures use, so a figure looks the same
on every machine, with or without a Chinese system font, and its SVG / PNG output does not depend on
what the host has installed.

Importing :mod:`tokenflow.viz` (its ``style`` module) calls it, and so does ``setup_notebook``.
"""
from __future__ import annotations

from pathlib import Path

_IMPORTED = set(globals())          # the names above are imported, not defined here

FONT_DIR = Path(__file__).resolve().parents[1] / "data" / "fonts"
"""Folder of the bundled fonts and their licence (``OFL.txt``)."""
FAMILY = "Tokenflow Sans"
"""Family name of the bundled figure font (as matplotlib's font manager lists it)."""
FALLBACK_FAMILY = "Tokenflow Sans Fallback"
"""Family of the DejaVu Sans subset with the glyphs :data:`FAMILY` lacks."""
FONT_FILES = ("TokenflowSans-Regular.ttf", "TokenflowSans-Bold.ttf",
              "TokenflowSansFallback-Regular.ttf", "TokenflowSansFallback-Bold.ttf")
"""The figure font's files in :data:`FONT_DIR`: regular and bold, then their fallback."""

_registered = False


def font_path(weight: str = "regular", fallback: bool = False) -> Path:
    """Path of the bundled figure font (``fallback``: of its DejaVu fallback), ``weight``
    ``"regular"`` or ``"bold"``.

    Raises:
        ValueError: if ``weight`` is neither.
        FileNotFoundError: if the package was installed without its font files.
    """
    files = {"regular": FONT_FILES[0], "bold": FONT_FILES[1]}
    if weight not in files:
        raise ValueError(f"weight must be 'regular' or 'bold', got {weight!r}")
    path = FONT_DIR / (files[weight].replace("Sans-", "SansFallback-") if fallback
                       else files[weight])
    if not path.is_file():
        raise FileNotFoundError(f"the book's font {path} is missing (rebuild it with "
                                "scripts/build_fonts.py, or reinstall the package)")
    return path


def book_font_rc() -> dict:
    """The matplotlib rcParams that make figures use only the bundled font: every generic
    family points at :data:`FAMILY` then :data:`FALLBACK_FAMILY` (per-glyph fallback),
    mathtext takes its letters from :data:`FAMILY` too, and SVG output
    draws text as paths (``svg.fonttype = "path"``), so an SVG figure shows the same glyphs in
    a browser that has no Chinese font."""
    return {
        "font.family": [FAMILY, FALLBACK_FAMILY],
        "font.sans-serif": [FAMILY, FALLBACK_FAMILY],
        "font.serif": [FAMILY, FALLBACK_FAMILY],
        "font.monospace": [FAMILY, FALLBACK_FAMILY],
        "font.cursive": [FAMILY, FALLBACK_FAMILY],
        "font.fantasy": [FAMILY, FALLBACK_FAMILY],
        "mathtext.fontset": "custom",
        "mathtext.rm": FAMILY,
        "mathtext.it": f"{FAMILY}:italic",
        "mathtext.bf": f"{FAMILY}:bold",
        "mathtext.sf": FAMILY,
        "mathtext.tt": FAMILY,
        "mathtext.cal": FAMILY,
        "mathtext.fallback": None,
        "svg.fonttype": "path",
        "pdf.fonttype": 42,
        "ps.fonttype": 42,
    }


def use_book_font() -> str:
    """Register the bundled fonts with matplotlib's font manager (once) and set
    :func:`book_font_rc` in ``matplotlib.rcParams``. Returns :data:`FAMILY`.

    Raises:
        FileNotFoundError: if a font file is missing (see :func:`font_path`).
    """
    global _registered
    import matplotlib
    from matplotlib import font_manager
    if not _registered:
        for weight in ("regular", "bold"):
            for fallback in (False, True):
                font_manager.fontManager.addfont(str(font_path(weight, fallback)))
        _registered = True
    matplotlib.rcParams.update(book_font_rc())
    return FAMILY


# --- the web fonts: the book's pages and JupyterLab --------------------------------------------
WEB_FAMILY = "Tokenflow CJK"
"""CSS family of the book's web fonts: Chinese (a Noto Sans CJK SC subset) and, under the same
name with its own ``unicode-range``, the few emoji the pages show (a Noto Color Emoji subset)."""
WEB_FONTS = (("TokenflowCJK-zh.woff2", "U+2E80-9FFF, U+F900-FAFF, U+FE30-FE4F, U+FF00-FFEF"),
             ("TokenflowEmoji.woff2", "U+1F000-1FAFF"))
"""The web fonts' files in :data:`FONT_DIR` with the code points each serves (the ranges of
``scripts/build_fonts.py``'s ``WEB_RANGES`` and ``EMOJI_RANGES``)."""


def web_font_css(copied_to: str | None = None, target: str = "book") -> str:
    """A stylesheet that draws every Chinese character and emoji of the book with the fonts the
    package ships, on a machine without any CJK or emoji font: one ``@font-face`` per file of
    :data:`WEB_FONTS`, the woff2 inline as a ``data:`` URL (Chromium refuses fonts from
    ``file://`` URLs; ``copied_to``, a relative folder, adds the copied file as a second
    source), then :data:`WEB_FAMILY` put first in the page's font families (only the code
    points of its ``unicode-range`` use it; Latin keeps the page's font).

    ``target`` ``"book"``: the families of the book's theme (pydata-sphinx-theme's
    ``--pst-font-family-*``); ``"lab"``: JupyterLab's (``--jp-*-font-family``, markdown, outputs,
    code and interface).

    Raises:
        ValueError: if ``target`` is neither.
        FileNotFoundError: if a font file is missing (scripts/build_fonts.py makes them).
    """
    import base64
    if target not in ("book", "lab"):
        raise ValueError(f"target must be 'book' or 'lab', got {target!r}")
    family = f'"{WEB_FAMILY}"'
    css = [f"/* {WEB_FAMILY}: subsets of Noto Sans CJK SC and Noto Color Emoji, SIL Open Font "
           f"License 1.1 (OFL.txt); scripts/build_fonts.py */\n"]
    for name, ranges in WEB_FONTS:
        path = FONT_DIR / name
        if not path.is_file():
            raise FileNotFoundError(f"web font {path} is missing (scripts/build_fonts.py makes it)")
        data = base64.b64encode(path.read_bytes()).decode()
        src = f'url(data:font/woff2;base64,{data}) format("woff2")'
        if copied_to:
            src += f',\n       url({copied_to}/{name}) format("woff2")'
        css.append(f"@font-face {{ font-family: {family}; font-style: normal; "
                   f"font-weight: 400 700; font-display: swap; unicode-range: {ranges};\n"
                   f"  src: {src}; }}\n")
    if target == "book":
        css.append(f"html {{ --pst-font-family-base: {family}, "
                   f"var(--pst-font-family-base-system);\n"
                   f"  --pst-font-family-heading: {family}, var(--pst-font-family-base-system);\n"
                   f"  --pst-font-family-monospace: var(--pst-font-family-monospace-system), "
                   f"{family}; }}\n")
        # MathJax sets its own family on the text of \text{...} (inline style): CJK first
        css.append(f"mjx-utext {{ font-family: {family}, MJXZERO, serif !important; }}\n")
    else:
        # JupyterLab's defaults (@jupyterlab/theme-light-extension variables.css), the web font
        # first; a var() cannot refer to the value it replaces.
        sans = ("system-ui, -apple-system, blinkmacsystemfont, 'Segoe UI', helvetica, arial, "
                "sans-serif, 'Apple Color Emoji', 'Segoe UI Emoji', 'Segoe UI Symbol'")
        mono = "menlo, consolas, 'DejaVu Sans Mono', monospace"
        lab = {"--jp-ui-font-family": f"{family}, {sans}",
               "--jp-content-font-family": f"{family}, {sans}",
               "--jp-code-font-family-default": f"{mono}, {family}",
               "--jp-code-font-family": f"{mono}, {family}"}
        css.append("body { " + "".join(f"{k}: {v} !important; " for k, v in lab.items()) + "}\n")
        # form controls do not inherit the page's font (the browser's own style sheet sets
        # theirs), so a widget's dropdown options would fall back to a system font
        css.append("select, option, input, button, textarea { font-family: "
                   f"{family}, {sans} !important; }}\n")
    return "".join(css)


def write_lab_css(path: str | Path) -> Path:
    """Write :func:`web_font_css` for JupyterLab to ``path`` (a ``custom/custom.css`` of a
    Jupyter config folder, loaded by ``jupyter lab --LabApp.custom_css=True``: the notebooks'
    markdown, their stored outputs, trusted or not, and the code show Chinese and emoji without
    any system font). ``make lab`` does this; returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(web_font_css(target="lab"), encoding="utf-8")
    return path


# what this module defines (every public name after the imports)
__all__ = [n for n in globals() if not n.startswith("_") and n not in _IMPORTED]


if __name__ == "__main__":
    import sys
    if len(sys.argv) != 3 or sys.argv[1] != "--lab-css":
        sys.exit("usage: python -m tokenflow.viz.fonts --lab-css PATH/custom/custom.css")
    print(write_lab_css(sys.argv[2]))
