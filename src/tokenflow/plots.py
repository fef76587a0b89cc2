"""Matplotlib figures shared by the chapters, in the book's colour code.

Blue = hidden-state main flow, yellow = MoE routing / expert parallelism, green = the
generated token and the decode loop (``tokenflow.trace.COLORS``). Every function returns the
``matplotlib.figure.Figure`` it drew, so notebooks can show or save it.
"""
from __future__ import annotations

import matplotlib

import matplotlib.pyplot as plt
from matplotlib.patches import FancyBboxPatch

from .trace import COLORS

__all__ = ["setup_notebook", "cjk_font", "token_flow_diagram", "topk_bar"]


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
    matplotlib.rcParams["figure.dpi"] = 100
    import warnings
    warnings.filterwarnings("ignore", message="Glyph .* missing from font")


# --------------------------------------------------------------------- chapter 00
_FLOW = [("token id", "token"), ("embedding\nlookup", "hidden"), ("hidden state\n[B,S,H]", "hidden"),
         ("attention\nread/write KV", "hidden"), ("FFN or MoE\nroute top-k", "moe"),
         ("final hidden\nstate [H]", "hidden"), ("LM head\n[H] -> [V]", "hidden"),
         ("vocab logits\n[V]", "hidden"), ("sampling", "token"), ("next\ntoken id", "token")]


def token_flow_diagram(labels: list[str] | None = None):
    """The seed's line ``token id -> ... -> next token id`` as coloured boxes.

    ``labels`` may replace the box texts (same length as the default, 10 boxes) to annotate
    them with real shapes. The decode loop arrow (green) goes from the last box to the first.
    """
    items = list(_FLOW)
    if labels is not None:
        if len(labels) != len(items):
            raise ValueError(f"labels must have {len(items)} entries, got {len(labels)}")
        items = [(lab, kind) for lab, (_, kind) in zip(labels, items)]
    fig, ax = plt.subplots(figsize=(14, 3.0))
    w, gap = 1.15, 0.28
    for i, (text, kind) in enumerate(items):
        x = i * (w + gap)
        ax.add_patch(FancyBboxPatch((x, 0), w, 1, boxstyle="round,pad=0.03",
                                    fc=COLORS[kind], ec="black", alpha=0.85))
        ax.text(x + w / 2, 0.5, text, ha="center", va="center", fontsize=8.5,
                color="white" if kind != "moe" else "black")
        if i:
            ax.annotate("", xy=(x, 0.5), xytext=(x - gap, 0.5),
                        arrowprops=dict(arrowstyle="->", lw=1.4))
    end = (len(items) - 1) * (w + gap) + w / 2
    ax.annotate("", xy=(w / 2, -0.05), xytext=(end, -0.05),
                arrowprops=dict(arrowstyle="->", lw=1.6, color=COLORS["token"],
                                connectionstyle="arc3,rad=-0.15"))
    ax.text(end / 2, -1.15, "decode loop: the new token goes back in (green)", ha="center",
            fontsize=9, color=COLORS["token"])
    ax.set_xlim(-0.2, len(items) * (w + gap))
    ax.set_ylim(-1.4, 1.2)
    ax.axis("off")
    fig.tight_layout()
    return fig


def topk_bar(tokens: list[str], values: list[float], highlight: int = 0,
             ylabel: str = "logit", title: str = ""):
    """Bar chart of candidate tokens; bar ``highlight`` in green (the chosen token)."""
    fig, ax = plt.subplots(figsize=(6, 3))
    colors = [COLORS["token"] if i == highlight else COLORS["hidden"] for i in range(len(values))]
    ax.bar(range(len(values)), values, color=colors)
    ax.set_xticks(range(len(values)), tokens)
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title)
    fig.tight_layout()
    return fig


# --------------------------------------------------------------------- chapters 01-02 (F2)
# --------------------------------------------------------------------- chapter 03 (F3)
# --------------------------------------------------------------------- chapter 04 (F4)
