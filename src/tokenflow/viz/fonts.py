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

__all__ = ["FONT_DIR", "FAMILY", "FALLBACK_FAMILY", "FONT_FILES", "font_path", "use_book_font",
           "book_font_rc"]

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
