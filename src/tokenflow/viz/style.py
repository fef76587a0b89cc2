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

__all__ = ["setup_notebook", "use_book_font"]

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


def _inline_retina() -> None:
    """In a Jupyter kernel, have the inline backend send PNGs at twice ``figure.dpi`` with
    their display size in the metadata (``'retina'``); outside a kernel, do nothing."""
    try:
        from IPython import get_ipython
        from matplotlib_inline.backend_inline import set_matplotlib_formats
    except ImportError:
        return
    if get_ipython() is not None:
        set_matplotlib_formats("retina")
