"""The recap's figure (chapter 9): the whole line as one row of boxes, each annotated with its
number for the tiny model and for DeepSeek-V3, and the decode loop closing it.

    from tokenflow.viz import line_figure
"""
from __future__ import annotations

from tokenflow.analysis.trace import COLORS

__all__ = ["line_figure"]

_KINDS = ("hidden", "moe", "token")


def line_figure(stages: list, title: str = "", loop_label: str = "decode loop: next token"):
    """Draw ``stages`` left to right, joined by arrows, with an arrow from the last back to the
    first (the decode loop). Each stage is ``(name, kind, tiny, real)``: ``kind`` one of
    ``"hidden"`` (blue, the main flow), ``"moe"`` (yellow), ``"token"`` (green), the colours of
    ``tokenflow.COLORS``; ``tiny`` and ``real`` the texts printed under the box (the tiny
    model's number above DeepSeek-V3's). Returns the matplotlib Figure.

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
    fig, ax = plt.subplots(figsize=(max(1.9 * n, 6), 3.3))
    w, h, y = 1.5, 0.7, 1.6
    for i, (name, kind, tiny, real) in enumerate(stages):
        x = i * 1.9
        ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.05",
                                    fc=COLORS[kind], ec="black", lw=0.8, alpha=0.9))
        ax.text(x + w / 2, y + h / 2, name, ha="center", va="center", fontsize=8.5,
                color="black", wrap=True)
        ax.text(x + w / 2, y - 0.25, tiny, ha="center", va="top", fontsize=7.5)
        ax.text(x + w / 2, y - 0.75, real, ha="center", va="top", fontsize=7.5, color="#444444")
        if i:
            ax.add_patch(FancyArrowPatch((x - 0.4 + 0.02, y + h / 2), (x - 0.02, y + h / 2),
                                         arrowstyle="-|>", mutation_scale=10, color="black"))
    last = (n - 1) * 1.9 + w / 2
    ax.add_patch(FancyArrowPatch((last, y + h + 0.08), (w / 2, y + h + 0.08),
                                 connectionstyle="arc3,rad=0.18", arrowstyle="-|>",
                                 mutation_scale=10, color=COLORS["token"], lw=1.4))
    ax.text(last / 2 + w / 4, y + h + 0.62, loop_label, ha="center", fontsize=8,
            color=COLORS["token"])
    ax.text(-0.1, y - 0.25, "tiny", ha="right", va="top", fontsize=7.5, style="italic")
    ax.text(-0.1, y - 0.75, "DeepSeek-V3", ha="right", va="top", fontsize=7.5, style="italic",
            color="#444444")
    ax.set_xlim(-1.3, (n - 1) * 1.9 + w + 0.2)
    ax.set_ylim(0.3, y + h + 1.0)
    ax.axis("off")
    if title:
        ax.set_title(title, fontsize=10)
    fig.tight_layout()
    return fig
