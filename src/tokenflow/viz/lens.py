"""Chapter 06: the logit lens. What each layer's hidden state would predict, as a heatmap,
a top-k table and an explorer.

Part of :mod:`tokenflow.viz`, the only package that draws; nothing below it imports it.
"""
from __future__ import annotations

import ipywidgets as widgets
import matplotlib.pyplot as plt

from tokenflow.analysis.trace import COLORS

__all__ = ["logit_lens_heatmap", "logit_lens_topk", "logit_lens_explorer", "logit_lens_static",
           "logit_lens_by_depth"]


# --------------------------------------------------------------------- chapter 06 (F6)
def logit_lens_heatmap(lens, tokenizer, tokens: list[str], batch: int = 0, title: str = ""):
    """The logit lens as a grid: one row per depth (embedding, after block 0, ...), one column
    per position; each cell names the top token read at that depth and position, shaded by
    its probability (the book's hidden-state blue). Column ``s`` predicts the token after
    ``tokens[s]``.

    Args:
        lens: ``[L+1, B, S, V]`` from :func:`tokenflow.analysis.logit_lens.logit_lens`.
        tokenizer: a :class:`~tokenflow.tokenizer.Tokenizer` (``id_to_token``).
        tokens: the ``S`` input token strings. batch: which row of the batch.

    Returns:
        the ``matplotlib.figure.Figure``.

    Raises:
        ValueError: if ``lens`` is not 4-D or ``tokens`` has not ``S`` entries.
    """
    from matplotlib.colors import LinearSegmentedColormap
    if getattr(lens, "dim", lambda: 0)() != 4:
        raise ValueError(f"lens must be a [L+1, B, S, V] tensor, got {getattr(lens, 'shape', lens)}")
    if len(tokens) != lens.shape[2]:
        raise ValueError(f"tokens must have {lens.shape[2]} entries, got {len(tokens)}")
    probs = lens[:, batch].float().softmax(-1)                         # [L+1, S, V]
    top_p, top_i = probs.max(-1)                                       # [L+1, S]
    depth_labels = ["embedding"] + [f"after block {i}" for i in range(lens.shape[0] - 1)]
    cmap = LinearSegmentedColormap.from_list("tokenflow_lens", ["#ffffff", COLORS["hidden"]])
    fig, ax = plt.subplots(figsize=(1.25 * len(tokens) + 2.6, 0.55 * lens.shape[0] + 1.5))
    im = ax.imshow(top_p.numpy(), cmap=cmap, vmin=0, vmax=1, aspect="auto")
    for (d, s), p in zip([(d, s) for d in range(top_p.shape[0]) for s in range(top_p.shape[1])],
                         top_p.flatten().tolist()):
        ax.text(s, d, f"{tokenizer.id_to_token(int(top_i[d, s]))}\n{p:.2f}", ha="center",
                va="center", fontsize=9, color="white" if p > 0.6 else "black")
    ax.set_xticks(range(len(tokens)), [f"{t} ->" for t in tokens])
    ax.set_yticks(range(len(depth_labels)), depth_labels)
    ax.set_xlabel("position (input token -> the token it predicts)")
    fig.colorbar(im, ax=ax, fraction=0.03, pad=0.01, label="probability of the top token")
    if title:
        ax.set_title(title)
    fig.tight_layout()
    return fig


# --------------------------------------------------------------------- chapter 06 (F6)
def logit_lens_topk(lens, tokenizer, depth: int, position: int, token_ids=(), k: int = 5,
                    batch: int = 0) -> str:
    """Text: the ``k`` most likely tokens read by the logit lens at ``depth`` (0 =
    embedding, ``l`` = after block ``l-1``) and ``position``, then the rank and probability
    of each of ``token_ids``.

    Args:
        lens: ``[L+1, B, S, V]`` from :func:`tokenflow.analysis.logit_lens.logit_lens`.

    Raises:
        ValueError: if ``depth`` or ``position`` is out of range.
    """
    from tokenflow.analysis.logit_lens import token_rank

    from .fmt import pad
    n_depth, _, S, _ = lens.shape
    if not 0 <= depth < n_depth:
        raise ValueError(f"depth must be in [0, {n_depth - 1}], got {depth}")
    if not -S <= position < S:
        raise ValueError(f"position must be in [{-S}, {S - 1}], got {position}")
    logits = lens[depth, batch, position]                              # [V]
    p = logits.float().softmax(-1)
    name = "embedding" if depth == 0 else f"after block {depth - 1}"
    lines = [f"depth {depth} ({name}), position {position % S}: top {k}"]
    for r, i in enumerate(p.topk(k).indices.tolist(), 1):
        lines.append(f"  {r}. {pad(tokenizer.id_to_token(i), 10)} {float(p[i]):.4f}")
    for t in token_ids:
        lines.append(f"  {pad(tokenizer.id_to_token(t), 10)} rank {int(token_rank(logits, t)):>4}"
                     f"  p {float(p[t]):.4f}")
    return "\n".join(lines)


def logit_lens_explorer(lens, tokenizer, tokens: list[str], token_ids=()):
    """Sliders for the depth and a dropdown for the position: prints
    :func:`logit_lens_topk`. Returns an ``ipywidgets.interactive``."""
    n_depth = lens.shape[0]

    def show(depth, position):
        print(logit_lens_topk(lens, tokenizer, depth, position, token_ids))
    options = [(f"{i} {t}", i) for i, t in enumerate(tokens)]
    return widgets.interactive(
        show,
        depth=widgets.IntSlider(value=n_depth - 1, min=0, max=n_depth - 1, description="depth",
                                continuous_update=False),
        position=widgets.Dropdown(options=options, value=len(tokens) - 1, description="position"))


def logit_lens_static(lens, tokenizer, tokens: list[str], token_ids=(), k: int = 5):
    """:func:`logit_lens_explorer` without a kernel: :func:`logit_lens_topk` for every depth
    and position of ``lens [L+1, B, S, V]`` (batch row 0). Shows the last depth and position
    first."""
    from .static import precomputed_explorer
    n_depth = lens.shape[0]
    names = [f"{i} {t}" for i, t in enumerate(tokens)]

    def show(**kw):
        return logit_lens_topk(lens, tokenizer, kw["depth"], names.index(kw["position"]),
                               token_ids, k=k)
    return precomputed_explorer(show, {"depth": list(range(n_depth)), "position": names},
                                title="logit lens: top tokens at one depth and position",
                                default={"depth": n_depth - 1, "position": names[-1]},
                                live_below=True)


def logit_lens_by_depth(lens, tokenizer, token_ids, position: int = -1, batch: int = 0,
                        title: str | None = None):
    """One row per depth of the logit lens at ``(batch, position)``: depth, what it reads
    (``embedding`` or ``after block l``), the top token, and the rank and probability of each
    of ``token_ids`` (:func:`tokenflow.viz.prob_text`). Returns a :class:`tokenflow.viz.Table`.

    Args:
        lens: ``[L+1, B, S, V]`` from :func:`tokenflow.analysis.logit_lens.logit_lens`.

    Raises:
        ValueError: ``position`` or ``batch`` out of range, or an unknown token id.
    """
    from tokenflow.analysis.logit_lens import token_rank

    from .fmt import Table
    from .moe import prob_text
    n_depth, B, S, V = lens.shape
    if not -S <= position < S:
        raise ValueError(f"position must be in [{-S}, {S - 1}], got {position}")
    if not 0 <= batch < B:
        raise ValueError(f"batch must be in [0, {B - 1}], got {batch}")
    rows = []
    for depth in range(n_depth):
        x = lens[depth, batch, position]                                  # [V]
        p = x.float().softmax(-1)
        row = [depth, "embedding" if depth == 0 else f"after block {depth - 1}",
               tokenizer.id_to_token(int(x.argmax()))]
        for t in token_ids:
            row += [int(token_rank(x, t)), prob_text(p[t])]
        rows.append(row)
    names = [tokenizer.id_to_token(t) for t in token_ids]
    cols = ["depth", "reads", "top token"] + [c for n in names for c in (f"rank {n}", f"p({n})")]
    return Table(rows, cols, align="<<<" + ">" * 2 * len(names), title=title)
