"""Figure setup shared by every chapter: the notebook defaults (seed, threads, inline format)
and the font the figures draw with.

Part of :mod:`tokenflow.viz`, the only package that draws; nothing below it imports it.
"""
from __future__ import annotations

import matplotlib

__all__ = ["cjk_font", "setup_notebook"]


def cjk_font() -> str | None:
    """Name of an installed font that can draw Chinese characters, or None.

    Looks for common CJK fonts (Noto Sans CJK, WenQuanYi, SimHei...). Without one,
    matplotlib draws Chinese labels as boxes; the chapters then also print the tokens.
    """
    from matplotlib import font_manager
    wanted = ("Noto Sans CJK SC", "Noto Sans CJK JP", "Noto Sans SC", "WenQuanYi Zen Hei",
              "WenQuanYi Micro Hei", "SimHei", "Microsoft YaHei", "PingFang SC",
              "Source Han Sans SC", "AR PL UMing CN", "Droid Sans Fallback")
    have = {f.name for f in font_manager.fontManager.ttflist}
    for name in wanted:
        if name in have:
            return name
    return None


def setup_notebook(seed: int = 0, threads: int = 1) -> None:
    """Make a chapter deterministic and readable: seed torch, fix the thread count (so
    floating-point sums run in the same order every time), set print precision and a
    CJK-capable font if one is installed. Call it in each chapter's first code cell.
    """
    import torch
    torch.manual_seed(seed)
    torch.set_num_threads(threads)
    torch.set_printoptions(precision=4, sci_mode=False)
    font = cjk_font()
    if font:
        matplotlib.rcParams["font.sans-serif"] = [font] + matplotlib.rcParams["font.sans-serif"]
    matplotlib.rcParams["axes.unicode_minus"] = False
    # Figures: PNG at 2x resolution shown at 120 px per inch, so matplotlib's 10 pt text is
    # ~17 px on the page (body size) and sharp on high-DPI screens. PNG, not SVG: nbval skips
    # image/png but compares image/svg+xml, whose bytes vary with fonts and versions.
    matplotlib.rcParams["figure.dpi"] = 120
    matplotlib.rcParams["savefig.dpi"] = "figure"
    _inline_retina()
    import warnings
    warnings.filterwarnings("ignore", message="Glyph .* missing from font")


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
