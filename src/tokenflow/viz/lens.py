"""Chapter 06: the logit lens. What each layer's hidden state would predict, as a heatmap,
a top-k table and an explorer.

Part of :mod:`tokenflow.viz`, the only package that draws; nothing below it imports it.
"""
from __future__ import annotations

import matplotlib.pyplot as plt

from .style import column_figsize, MIN_FONT_PT, text_on
from tokenflow.analysis.trace import COLORS

_IMPORTED = set(globals())          # the names above are imported, not defined here


def _depth_name(depth: int) -> str:
    """What the lens reads at ``depth``: ``embedding`` (0) or ``after block l`` (``l+1``)."""
    return "embedding" if depth == 0 else f"after block {depth - 1}"


# --------------------------------------------------------------------- chapter 06 (F6)
def _check_lens(lens, position: int, batch: int) -> None:
    """ValueError unless ``lens`` is ``[L+1, B, S, V]`` with ``position`` in ``[-S, S)`` and
    ``batch`` in ``[0, B)``: the one check every function here makes."""
    if getattr(lens, "dim", lambda: 0)() != 4:
        raise ValueError(f"lens must be a [L+1, B, S, V] tensor, got "
                         f"{getattr(lens, 'shape', lens)}")
    _, B, S, _ = lens.shape
    if not -S <= position < S:
        raise ValueError(f"position must be in [{-S}, {S - 1}], got {position}")
    if not 0 <= batch < B:
        raise ValueError(f"batch must be in [0, {B - 1}], got {batch}")


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
    _check_lens(lens, -1, batch)
    if len(tokens) != lens.shape[2]:
        raise ValueError(f"tokens must have {lens.shape[2]} entries, got {len(tokens)}")
    probs = lens[:, batch].float().softmax(-1)                         # [L+1, S, V]
    top_p, top_i = probs.max(-1)                                       # [L+1, S]
    depth_labels = [_depth_name(d) for d in range(lens.shape[0])]
    cmap = LinearSegmentedColormap.from_list("tokenflow_lens", ["#ffffff", COLORS["hidden"]])
    fig, ax = plt.subplots(figsize=column_figsize(1.25 * len(tokens) + 2.6,
                                                  0.55 * lens.shape[0] + 1.5))
    im = ax.imshow(top_p.numpy(), cmap=cmap, vmin=0, vmax=1, aspect="auto")
    for (d, s), p in zip([(d, s) for d in range(top_p.shape[0]) for s in range(top_p.shape[1])],
                         top_p.flatten().tolist()):
        ax.text(s, d, f"{tokenizer.id_to_token(int(top_i[d, s]))}\n{p:.2f}", ha="center",
                va="center", fontsize=MIN_FONT_PT, color=text_on(cmap(p)))
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
    _check_lens(lens, position, batch)
    n_depth, _, S, _ = lens.shape
    if not 0 <= depth < n_depth:
        raise ValueError(f"depth must be in [0, {n_depth - 1}], got {depth}")
    logits = lens[depth, batch, position]                              # [V]
    p = logits.float().softmax(-1)
    lines = [f"depth {depth} ({_depth_name(depth)}), position {position % S}: top {k}"]
    for r, i in enumerate(p.topk(k).indices.tolist(), 1):
        lines.append(f"  {r}. {pad(tokenizer.id_to_token(i), 10)} {float(p[i]):.4f}")
    for t in token_ids:
        lines.append(f"  {pad(tokenizer.id_to_token(t), 10)} rank {int(token_rank(logits, t)):>4}"
                     f"  p {float(p[t]):.4f}")
    return "\n".join(lines)


def logit_lens_explorer(lens, tokenizer, tokens: list[str], token_ids=(), k: int = 5,
                        live: bool = True):
    """:func:`logit_lens_topk` of ``lens [L+1, B, S, V]`` (batch row 0) at one depth and
    position, behind a depth and a position control, starting at the last of each
    (:func:`tokenflow.viz.explore`)."""
    from .static import explore
    n_depth = lens.shape[0]
    names = [f"{i} {t}" for i, t in enumerate(tokens)]

    def show(**kw):
        return logit_lens_topk(lens, tokenizer, kw["depth"], names.index(kw["position"]),
                               token_ids, k=k)
    return explore(show, {"depth": list(range(n_depth)), "position": names}, live=live,
                   title="logit lens: top tokens at one depth and position",
                   default={"depth": n_depth - 1, "position": names[-1]}, live_below=True)


def logit_lens_static(*args, **kw):
    """:func:`logit_lens_explorer` precomputed (``live=False``): works without a kernel."""
    return logit_lens_explorer(*args, live=False, **kw)


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
    _check_lens(lens, position, batch)
    n_depth, B, S, V = lens.shape
    rows = []
    for depth in range(n_depth):
        x = lens[depth, batch, position]                                  # [V]
        p = x.float().softmax(-1)
        row = [depth, _depth_name(depth),
               tokenizer.id_to_token(int(x.argmax()))]
        for t in token_ids:
            row += [int(token_rank(x, t)), prob_text(p[t])]
        rows.append(row)
    names = [tokenizer.id_to_token(t) for t in token_ids]
    cols = ["depth", "reads", "top token"] + [c for n in names for c in (f"rank {n}", f"p({n})")]
    return Table(rows, cols, align="<<<" + ">" * 2 * len(names), title=title)


def logit_lens_summary(lens, tokenizer, token_id: int, position: int = -1,
                       batch: int = 0) -> str:
    """One sentence on how the logit lens reads ``token_id`` at ``(batch, position)``: the
    depth from which it ranks first at every deeper depth too
    (:func:`tokenflow.analysis.logit_lens.answer_depth`) and what that depth reads, or that the
    last depth does not rank it first; its probability at each depth (4 decimals, joined by
    ``->``); and the block that raises it most, with the probabilities before and after.

    Args:
        lens: ``[L+1, B, S, V]`` from :func:`tokenflow.analysis.logit_lens.logit_lens`.
        tokenizer: anything with ``id_to_token``. token_id: a vocabulary id.

    Raises:
        ValueError: if ``lens`` is not 4-D, ``position`` / ``batch`` is out of range, or
            ``token_id`` is not in ``[0, V)``.
    """
    from tokenflow.analysis.logit_lens import answer_depth
    _check_lens(lens, position, batch)
    if not 0 <= token_id < lens.shape[3]:
        raise ValueError(f"token_id must be in [0, {lens.shape[3] - 1}], got {token_id}")
    name = tokenizer.id_to_token(token_id)
    p = lens[:, batch, position].float().softmax(-1)[:, token_id]      # [L+1]
    first = answer_depth(lens, token_id, batch=batch, position=position)
    lead = (f"{name} is not the top token at the last depth" if first is None else
            f"{name} is the top token from depth {first} ({_depth_name(first)}) on, at every "
            f"deeper layer too")
    text = f"{lead}; its probability goes {' -> '.join(f'{float(v):.4f}' for v in p)}."
    if len(p) > 1:
        jump = int((p[1:] - p[:-1]).argmax())                          # the block adding most
        text += (f" The largest step is block {jump} ({float(p[jump]):.4f} -> "
                 f"{float(p[jump + 1]):.4f}).")
    return text


def logit_lens_compare(lens, other, tokenizer, token_id: int, names, position: int = -1,
                       batch: int = 0):
    """Two logit lenses read at the same ``(batch, position)``, depth by depth, as a
    :class:`tokenflow.viz.Table`: the depth, what it reads, whether the two readings (the
    ``V`` scores) are exactly equal, and the probability of ``token_id`` in each
    (:func:`tokenflow.viz.prob_text`). The title names the two inputs and the position.

    Args:
        lens, other: ``[L+1, B, S, V]`` from :func:`tokenflow.analysis.logit_lens.logit_lens`
            of two inputs (``S`` may differ; ``L+1`` and ``V`` may not).
        tokenizer: anything with ``id_to_token``. token_id: a vocabulary id.
        names: the two inputs' names, e.g. the two prompts.

    Raises:
        ValueError: on lenses of different depth or vocabulary, ``names`` not two entries, or
            ``position`` / ``batch`` out of range for either lens.
    """
    from .fmt import Table
    from .moe import prob_text
    _check_lens(lens, position, batch)
    _check_lens(other, position, batch)
    if (lens.shape[0], lens.shape[3]) != (other.shape[0], other.shape[3]):
        raise ValueError(f"lens and other must have the same L+1 and V, got "
                         f"{list(lens.shape)} and {list(other.shape)}")
    if len(names) != 2:
        raise ValueError(f"names must name the two inputs, got {names!r}")
    t = tokenizer.id_to_token(token_id)
    rows = []
    for depth in range(lens.shape[0]):
        a, b = lens[depth, batch, position], other[depth, batch, position]     # [V]
        rows.append((depth, _depth_name(depth), bool(a.equal(b)),
                     prob_text(a.softmax(-1)[token_id]), prob_text(b.softmax(-1)[token_id])))
    where = "last position" if position == -1 else f"position {position}"
    return Table(rows, ["depth", "reads", "identical readings", f"p({t}) {names[0]}",
                        f"p({t}) {names[1]}"], align="<<<>>",
                 title=f"{names[0]} vs {names[1]}, {where}")


def logit_lens_answers(lens, tokenizer, tokens: list[str], batch: int = 0):
    """Per position, the token the last depth of the logit lens ranks first (what the model
    predicts after ``tokens[s]``) and the depth from which it ranks first at every deeper
    depth (:func:`tokenflow.analysis.logit_lens.answer_depth`), as a
    :class:`tokenflow.viz.Table` (position, token, final top, top from depth).

    Args:
        lens: ``[L+1, B, S, V]`` from :func:`tokenflow.analysis.logit_lens.logit_lens`.
        tokens: the ``S`` input token strings.

    Raises:
        ValueError: if ``lens`` is not 4-D, ``batch`` is out of range or ``tokens`` has not
            ``S`` entries.
    """
    from tokenflow.analysis.logit_lens import answer_depth

    from .fmt import Table
    _check_lens(lens, -1, batch)
    if len(tokens) != lens.shape[2]:
        raise ValueError(f"tokens must have {lens.shape[2]} entries, got {len(tokens)}")
    top = lens[-1, batch].argmax(-1).tolist()                          # [S]
    return Table([(s, t, tokenizer.id_to_token(top[s]),
                   answer_depth(lens, top[s], batch=batch, position=s))
                  for s, t in enumerate(tokens)],
                 ["position", "token", "final top", "top from depth"], align="><<>")


# what this module defines (every public name after the imports)
__all__ = [n for n in globals() if not n.startswith("_") and n not in _IMPORTED]
