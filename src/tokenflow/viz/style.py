"""Figure setup shared by every chapter: the notebook defaults (seed, threads, inline format)
and the font the figures draw with.

The font is the one the book ships (:mod:`tokenflow.viz.fonts`: Noto Sans CJK SC subsets, Latin
and Chinese alike), registered with matplotlib and made the only family when this module is
imported, i.e. with ``import tokenflow.viz``: no figure looks at the system's fonts, so a
chapter re-run on a machine without a Chinese font still shows 北京, and the figures' bytes do
not depend on what the host has installed.

Part of :mod:`tokenflow.viz`, the only package that draws; nothing below it imports it.
"""
from __future__ import annotations

import matplotlib

from .fonts import use_book_font

_IMPORTED = set(globals())          # the names above are imported, not defined here

use_book_font()


def setup_notebook(seed: int = 0, threads: int = 1) -> None:
    """Make a chapter deterministic and readable: seed torch, fix the thread count (so
    floating-point sums run in the same order every time), set print precision and the
    book's bundled font (:func:`~tokenflow.viz.fonts.use_book_font`, again, in case a cell
    reset matplotlib's rcParams). Call it in each chapter's first code cell.
    """
    import torch
    torch.manual_seed(seed)
    torch.set_num_threads(threads)
    torch.set_printoptions(precision=4, sci_mode=False)
    use_book_font()
    matplotlib.rcParams["axes.unicode_minus"] = False
    # Figures: PNG at 2x resolution shown at 120 px per inch, so matplotlib's 10 pt text is
    # ~17 px on the page (body size) and sharp on high-DPI screens. PNG, not SVG: nbval skips
    # image/png but compares image/svg+xml, whose bytes vary with fonts and versions.
    matplotlib.rcParams["figure.dpi"] = 120
    matplotlib.rcParams["savefig.dpi"] = "figure"
    _inline_retina()


PNG_COLORS = 256
"""Colours a stored figure keeps (:func:`compact_png`): the book's figures are flat fills, lines
and antialiased text, which 256 colours draw without visible change at a third of the bytes."""


def compact_png(png: bytes, colors: int = PNG_COLORS) -> bytes:
    """``png`` (a figure matplotlib wrote) as a palette PNG of at most ``colors`` colours, same
    width and height, no dithering (flat fills stay flat). Median-cut quantisation (Pillow) is
    deterministic, so the same figure gives the same bytes on every machine. A chapter's
    stored figures take about 40% of their RGBA size.

    Raises:
        ValueError: if ``colors`` is not in 2..256 or ``png`` is not a PNG.
    """
    import io

    from PIL import Image
    if isinstance(colors, bool) or not isinstance(colors, int) or not 2 <= colors <= 256:
        raise ValueError(f"colors must be an int in 2..256, got {colors!r}")
    if not isinstance(png, (bytes, bytearray)) or png[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError("png must be the bytes of a PNG image")
    with Image.open(io.BytesIO(png)) as im:
        rgb = im.convert("RGB")
    small = rgb.quantize(colors=colors, method=Image.Quantize.MEDIANCUT,
                         dither=Image.Dither.NONE)
    out = io.BytesIO()
    small.save(out, format="PNG", optimize=True)
    return out.getvalue()


def _compact_retina_figure(fig):
    """IPython's retina PNG of ``fig`` (2x pixels, display size in the metadata), compacted
    by :func:`compact_png`; ``None`` for an empty figure, as IPython returns."""
    from base64 import b64encode

    from IPython.core.pylabtools import retina_figure
    out = retina_figure(fig, base64=False)
    if out is None:
        return None
    png, metadata = out
    return b64encode(compact_png(png)).decode("ascii"), metadata


def _inline_retina() -> None:
    """In a Jupyter kernel, have the inline backend send PNGs at twice ``figure.dpi`` with
    their display size in the metadata (``'retina'``), compacted by :func:`compact_png`;
    outside a kernel, do nothing."""
    try:
        from IPython import get_ipython
        from matplotlib.figure import Figure
        from matplotlib_inline.backend_inline import set_matplotlib_formats
    except ImportError:
        return
    shell = get_ipython()
    if shell is not None:
        set_matplotlib_formats("retina")
        shell.display_formatter.formatters["image/png"].for_type(Figure, _compact_retina_figure)


# --- figure text: size and contrast -------------------------------------------------------------
COLUMN_WIDTH_IN = 6.5
"""The book column's width in inches at ``figure.dpi`` 120: about 784 px at a 1280 px window
(_static/tokenflow.css), so a figure at most this wide is shown at its natural size and its
10 pt text at ~17 px, the body size."""
MIN_FONT_PT = 10.0
"""The smallest font size a figure's text is given (body size at :data:`COLUMN_WIDTH_IN`)."""


def column_figsize(width: float, height: float) -> tuple[float, float]:
    """``(width, height)`` in inches fitted to the book column: the width capped at
    :data:`COLUMN_WIDTH_IN`, the height kept (text keeps its size; the axes get narrower)."""
    return (min(float(width), COLUMN_WIDTH_IN), float(height))


def _luminance(color) -> float:
    """WCAG 2 relative luminance of a matplotlib colour (on white when it has an alpha)."""
    from matplotlib.colors import to_rgba
    r, g, b, a = to_rgba(color)

    def lin(c):
        c = a * c + (1 - a)
        return c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4
    return 0.2126 * lin(r) + 0.7152 * lin(g) + 0.0722 * lin(b)


def contrast(fg, bg) -> float:
    """WCAG 2 contrast ratio of two colours (1 to 21; AA asks 4.5 for body text)."""
    hi, lo = sorted((_luminance(fg), _luminance(bg)), reverse=True)
    return (hi + 0.05) / (lo + 0.05)


def text_on(fill, alpha: float = 1.0) -> str:
    """``"black"`` or ``"white"``, whichever contrasts more with ``fill`` (drawn with ``alpha``
    on white): the colour for text on a box of the book's colours."""
    from matplotlib.colors import to_rgba
    r, g, b, _ = to_rgba(fill)
    bg = (r, g, b, alpha)
    return "black" if contrast("black", bg) >= contrast("white", bg) else "white"


def series_style(i: int) -> dict:
    """Line style of the ``i``-th series of a line chart in the book's colours
    (``tokenflow.COLORS``: blue, green, yellow, then a dark grey), each series with its own
    marker, so lines of the same colour stay apart: ``{"color", "marker"}`` for ``ax.plot``."""
    from tokenflow.analysis.trace import COLORS
    colours = (COLORS["hidden"], COLORS["token"], COLORS["moe"], "#555555")
    markers = ("o", "s", "^", "D", "v", "P", "X", "*")
    return {"color": colours[i % len(colours)], "marker": markers[i % len(markers)]}


# what this module defines (every public name after the imports)
__all__ = [n for n in globals() if not n.startswith("_") and n not in _IMPORTED]
