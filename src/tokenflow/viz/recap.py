"""The recap's figure (chapter 9): the whole line as a column of boxes, each with its number for
the tiny model and for DeepSeek-V3 beside it, and the decode loop closing it.

    from tokenflow.viz import line_figure
"""
from __future__ import annotations

from .style import column_figsize, MIN_FONT_PT, text_on
from tokenflow.analysis.trace import COLORS

_IMPORTED = set(globals())          # the names above are imported, not defined here

_KINDS = ("hidden", "moe", "token")


def line_figure(stages: list, title: str = "", loop_label: str = "decode loop: next token"):
    """Draw ``stages`` top to bottom, joined by arrows, with an arrow from the last back to the
    first (the decode loop). Each stage is ``(name, kind, tiny, real)``: ``kind`` one of
    ``"hidden"`` (blue, the main flow), ``"moe"`` (yellow), ``"token"`` (green), the colours of
    ``tokenflow.COLORS``; ``tiny`` and ``real`` the texts printed beside the box (the tiny
    model's number, then DeepSeek-V3's). Returns the matplotlib Figure.

    Raises:
        ValueError: ``stages`` empty, a stage not a 4-tuple, or an unknown ``kind``.
    """
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

    if not stages:
        raise ValueError("stages must not be empty")
    for s in stages:
        if len(s) != 4:
            raise ValueError(f"each stage must be (name, kind, tiny, real), got {s!r}")
        if s[1] not in _KINDS:
            raise ValueError(f"kind must be one of {_KINDS}, got {s[1]!r}")
    n = len(stages)
    # one row per stage, top to bottom: the box, then the tiny model's and DeepSeek-V3's number
    # (a column layout that keeps 10 pt text at the book column's width and on a phone)
    fig, ax = plt.subplots(figsize=column_figsize(6.5, 0.62 * n + 1.3))
    w, h, step = 2.3, 0.46, 0.62
    x_tiny, x_real = w + 0.35, w + 2.35
    top = (n - 1) * step
    ax.text(x_tiny, top + 0.45, "tiny", ha="left", va="bottom", fontsize=MIN_FONT_PT,
            style="italic")
    ax.text(x_real, top + 0.45, "DeepSeek-V3", ha="left", va="bottom", fontsize=MIN_FONT_PT,
            style="italic", color="#444444")
    for i, (name, kind, tiny, real) in enumerate(stages):
        y = top - i * step
        ax.add_patch(FancyBboxPatch((0, y - h / 2), w, h, boxstyle="round,pad=0.04",
                                    fc=COLORS[kind], ec="black", lw=0.8, alpha=0.9))
        ax.text(w / 2, y, name.replace("\n", "  "), ha="center", va="center",
                fontsize=MIN_FONT_PT, color=text_on(COLORS[kind], 0.9))
        ax.text(x_tiny, y, tiny, ha="left", va="center", fontsize=MIN_FONT_PT)
        ax.text(x_real, y, real, ha="left", va="center", fontsize=MIN_FONT_PT, color="#444444")
        if i:
            ax.add_patch(FancyArrowPatch((w / 2, y + step - h / 2 - 0.04),
                                         (w / 2, y + h / 2 + 0.04),
                                         arrowstyle="-|>", mutation_scale=10, color="black"))
    ax.add_patch(FancyArrowPatch((-0.06, top - (n - 1) * step), (-0.06, top),
                                 connectionstyle="arc3,rad=-0.35", arrowstyle="-|>",
                                 mutation_scale=10, color=COLORS["token"], lw=1.4))
    ax.text(0, -0.5, "\u21ba " + loop_label, ha="left", va="top", fontsize=MIN_FONT_PT,
            color="#1e6b2e")
    ax.set_xlim(-0.9, x_real + 2.0)
    ax.set_ylim(-0.95, top + 0.8)
    ax.axis("off")
    if title:
        ax.set_title(title, fontsize=11)
    fig.tight_layout()
    return fig


# what this module defines (every public name after the imports)
__all__ = [n for n in globals() if not n.startswith("_") and n not in _IMPORTED]
