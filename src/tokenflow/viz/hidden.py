"""Chapter 01 (and 00): the hidden state. Top-k bars, hidden-state heatmaps, the residual
stream, shape flows, and the tables and explorers of hidden-state sizes.

Part of :mod:`tokenflow.viz`, the only package that draws; nothing below it imports it.
"""
from __future__ import annotations

import matplotlib.pyplot as plt
from .style import COLUMN_WIDTH_IN, column_figsize, MIN_FONT_PT, text_on
from matplotlib.patches import FancyBboxPatch

from tokenflow.analysis.trace import COLORS

_IMPORTED = set(globals())          # the names above are imported, not defined here


# --------------------------------------------------------------------- chapter 00
def topk_bar(tokens: list[str], values: list[float], highlight: int = 0,
             ylabel: str = "logit", title: str = ""):
    """Bar chart of candidate tokens; bar ``highlight`` in green (the chosen token)."""
    fig, ax = plt.subplots(figsize=column_figsize(6, 3))
    colors = [COLORS["token"] if i == highlight else COLORS["hidden"] for i in range(len(values))]
    ax.bar(range(len(values)), values, color=colors)
    ax.set_xticks(range(len(values)), tokens)
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title)
    fig.tight_layout()
    return fig


# --------------------------------------------------------------------- chapters 01-02 (F2)
def _hidden_cmap():
    """Diverging colour map for signed hidden-state values: grey (< 0), white (0), the
    book's hidden-state blue (> 0)."""
    from matplotlib.colors import LinearSegmentedColormap
    return LinearSegmentedColormap.from_list("tokenflow_hidden",
                                             ["#4d4d4d", "#ffffff", COLORS["hidden"]])


def _as_2d(t, name: str):
    import torch
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != 2:
        raise ValueError(f"{name} must be 2-D, got shape {list(t.shape)}")
    return t.detach().float().cpu()


def hidden_state_heatmap(hidden, row_labels: list[str], title: str = "",
                         col_label: str = "feature (hidden dimension H)"):
    """Heatmap of a hidden-state table ``hidden [S,H]``: one row per token, one column per
    feature. Signed values: grey < 0 < blue (the book's hidden-state colour).

    Args:
        hidden: ``[S,H]`` tensor (e.g. ``hidden_states_l0[0]``).
        row_labels: ``S`` labels (token strings).
        title: figure title.

    Returns:
        the ``matplotlib.figure.Figure``.

    Raises:
        ValueError: if ``hidden`` is not 2-D or ``row_labels`` has not ``S`` entries.
    """
    h = _as_2d(hidden, "hidden")
    if len(row_labels) != h.shape[0]:
        raise ValueError(f"row_labels must have {h.shape[0]} entries, got {len(row_labels)}")
    lim = float(h.abs().max()) or 1.0
    fig, ax = plt.subplots(figsize=column_figsize(9, 0.45 * h.shape[0] + 1.6))
    im = ax.imshow(h.numpy(), aspect="auto", cmap=_hidden_cmap(), vmin=-lim, vmax=lim,
                   interpolation="nearest")
    ax.set_yticks(range(h.shape[0]), row_labels)
    ax.set_xlabel(f"{col_label}, {h.shape[1]} columns")
    ax.set_ylabel("token (row)")
    for side in ax.spines.values():
        side.set_edgecolor(COLORS["hidden"])
    fig.colorbar(im, ax=ax, fraction=0.03, pad=0.01, label="value")
    if title:
        ax.set_title(title)
    fig.tight_layout()
    return fig


def residual_stream_plot(hidden_states, token_index: int, tokens: list[str],
                         layer: int | None = None):
    """One token's hidden state after the embedding and after each block (the residual
    stream), as rows of a heatmap, next to each row's RMS (root mean square) size.

    Args:
        hidden_states: list of ``L+1`` tensors ``[B,S,H]`` (``Trace(keep_tensors=True)
            .hidden_states``: embedding output, then each block's output); batch row 0 is drawn.
        token_index: which position ``s`` to follow, ``0 <= s < S``.
        tokens: the ``S`` token strings (for the title).
        layer: row to highlight (0 = embedding, ``l`` = after block ``l-1``), or None.

    Returns:
        the ``matplotlib.figure.Figure``.

    Raises:
        ValueError: on an empty list, out-of-range ``token_index`` or ``layer``.
    """
    import torch
    if not hidden_states:
        raise ValueError("hidden_states must be a non-empty list of [B,S,H] tensors")
    S = hidden_states[0].shape[1]
    if not 0 <= token_index < S:
        raise ValueError(f"token_index must be in [0, {S}), got {token_index}")
    n = len(hidden_states)
    if layer is not None and not 0 <= layer < n:
        raise ValueError(f"layer must be in [0, {n}), got {layer}")
    rows = torch.stack([h[0, token_index].detach().float() for h in hidden_states])  # [L+1, H]
    labels = ["embedding (l0)"] + [f"after block {i}" for i in range(n - 1)]
    lim = float(rows.abs().max()) or 1.0
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=column_figsize(9, 0.5 * n + 1.8),
                                  gridspec_kw=dict(width_ratios=[4, 1]))
    ax.imshow(rows.numpy(), aspect="auto", cmap=_hidden_cmap(), vmin=-lim, vmax=lim,
              interpolation="nearest")
    ax.set_yticks(range(n), labels)
    ax.set_xlabel(f"feature (H = {rows.shape[1]})")
    ax.set_title(f"hidden state of token {token_index} '{tokens[token_index]}' layer by layer")
    rms = rows.pow(2).mean(-1).sqrt()
    colors = [COLORS["hidden"] if layer is None or i == layer else "#b8c9e6" for i in range(n)]
    ax2.barh(range(n), rms.numpy(), color=colors)
    ax2.set_ylim(n - 0.5, -0.5)
    ax2.set_yticks([])
    ax2.set_xlabel("RMS")
    if layer is not None:
        ax.add_patch(plt.Rectangle((-0.5, layer - 0.5), rows.shape[1], 1, fill=False,
                                   ec=COLORS["hidden"], lw=2.5, clip_on=False))
    fig.tight_layout()
    return fig


def shape_flow(steps: list[tuple[str, str]], title: str = "", per_row: int = 4):
    """Boxes joined by arrows, e.g. the steps of one attention call with their shapes.
    ``steps`` is a list of ``(text, kind)``, ``kind`` one of ``COLORS`` (``"hidden"``,
    ``"moe"``, ``"token"``) or ``"cache"`` (drawn as a light-blue store). At most
    ``per_row`` boxes per row, and no more than fit the book column (3) with 10 pt text; longer
    chains continue on the next row, left to right, joined by an elbow arrow.

    Raises:
        ValueError: on an empty list, an unknown ``kind`` or ``per_row < 1``.
    """
    if not steps:
        raise ValueError("steps must be a non-empty list of (text, kind)")
    if isinstance(per_row, bool) or not isinstance(per_row, int) or per_row < 1:
        raise ValueError(f"per_row must be an int >= 1, got {per_row!r}")
    fills = dict(COLORS, cache="#cfe0f7")
    for _, kind in steps:
        if kind not in fills:
            raise ValueError(f"kind must be one of {sorted(fills)}, got {kind!r}")
    w, h, gap, vgap = 1.6, 1.0, 0.45, 0.55
    # inches per data unit at least 0.8 (10 pt text fits a box), the figure <= the column
    fit = int((COLUMN_WIDTH_IN / (1.1 * 0.8) - 0.4 + gap) // (w + gap))
    ncols = max(1, min(per_row, len(steps), fit))
    nrows = -(-len(steps) // ncols)
    width = ncols * (w + gap) - gap + 0.4
    height = nrows * (h + vgap) - vgap + 0.5
    scale = min(1.0, COLUMN_WIDTH_IN / (width * 1.1))       # inches per data unit
    fig, ax = plt.subplots(figsize=column_figsize(width * 1.1 * scale,
                                                  height * 1.1 * scale + 0.35))

    def pos(i):
        r, c = divmod(i, ncols)
        return c * (w + gap), -r * (h + vgap)
    for i, (text, kind) in enumerate(steps):
        x, y = pos(i)
        ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.03", fc=fills[kind],
                                    ec="black", alpha=0.9))
        ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=MIN_FONT_PT,
                color=text_on(fills[kind], 0.9))
        if not i:
            continue
        px, py = pos(i - 1)
        arrow = dict(arrowstyle="->", lw=1.4)
        if py == y:                                         # same row: straight arrow
            ax.annotate("", xy=(x, y + h / 2), xytext=(px + w, py + h / 2), arrowprops=arrow)
        else:                                               # next row: elbow back to the left
            mid = py - vgap / 2
            ax.plot([px + w / 2, px + w / 2, x + w / 2], [py, mid, mid], color="black", lw=1.4)
            ax.annotate("", xy=(x + w / 2, y + h), xytext=(x + w / 2, mid - 0.01),
                        arrowprops=arrow)
    ax.set_xlim(-0.2, width - 0.2)
    ax.set_ylim(-(nrows - 1) * (h + vgap) - 0.2, h + 0.25)
    ax.axis("off")
    if title:
        ax.set_title(title, fontsize=11)
    fig.tight_layout()
    return fig


# --------------------------------------------------------------------- chapters 01-02 (F2)
def tensor_table(t, row_labels: list[str], col_labels: list[str] | None = None,
                 max_cols: int = 8, decimals: int = 4):
    """A 2-D tensor ``t [R,C]`` as a :class:`tokenflow.viz.Table` with labelled rows (HTML in
    the book, aligned text in ``print``), values rounded to ``decimals`` (stable for nbval;
    ``-0.0`` shows as ``0.0``). Only the first ``max_cols`` columns are shown, then a ``...``
    column, and the title counts the hidden columns.

    Args:
        t: ``[R,C]`` tensor (e.g. a hidden-state table ``[S,H]``, or attention weights
            ``[n_heads, S_k]``).
        row_labels: ``R`` labels. col_labels: ``C`` labels (default ``f0, f1, ...``).

    Raises:
        ValueError: if ``t`` is not 2-D or a label list has the wrong length.
    """
    import torch

    from .fmt import Table
    if not isinstance(t, torch.Tensor) or t.dim() != 2:
        raise ValueError(f"t must be a 2-D torch.Tensor, got "
                         f"{list(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__}")
    R, C = t.shape
    if len(row_labels) != R:
        raise ValueError(f"row_labels must have {R} entries, got {len(row_labels)}")
    if col_labels is None:
        col_labels = [f"f{j}" for j in range(C)]
    if len(col_labels) != C:
        raise ValueError(f"col_labels must have {C} entries, got {len(col_labels)}")
    if isinstance(max_cols, bool) or not isinstance(max_cols, int) or max_cols < 1:
        raise ValueError(f"max_cols must be an int >= 1, got {max_cols!r}")
    k = min(C, max_cols)
    more = C > k
    vals = t.detach().float().cpu()
    rows = [[str(row_labels[i])] + [float(v) for v in vals[i, :k]] + (["..."] if more else [])
            for i in range(R)]
    headers = [""] + [str(c) for c in col_labels[:k]] + (["..."] if more else [])
    title = f"{R} x {C}: first {k} columns shown, {C - k} more columns not shown" if more else None
    return Table(rows, headers, title=title, digits=decimals,
                 align="<" + ">" * k + ("<" if more else ""))


def hidden_state_sizes(batch_size: int, seq_len: int, hidden_size: int,
                       vocab_size: int) -> list[dict]:
    """Shapes and sizes of the tensors of chapter 1, built as PyTorch ``meta`` tensors
    (shape and dtype only, nothing allocated), so real-scale sizes cost no memory.

    Rows: ``input_ids [B,S]`` (int64), ``embedding_table [V,H]``, ``hidden_states_l0
    [B,S,H]`` (prefill) and ``decode hidden [B,1,H]``.

    Returns:
        list of dicts with ``name``, ``shape`` (list), ``elements`` (int) and bytes per dtype:
        ``int64`` for the ids, ``bf16`` and ``fp32`` for the floating tensors (bytes =
        elements * bytes per element, read from the meta tensors' ``nbytes``).

    Raises:
        ValueError: if any argument is not an int >= 1 (naming it).
    """
    import torch
    for name, v in (("batch_size", batch_size), ("seq_len", seq_len),
                    ("hidden_size", hidden_size), ("vocab_size", vocab_size)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be an int >= 1, got {v!r}")
    B, S, H, V = batch_size, seq_len, hidden_size, vocab_size
    rows = []
    ids = torch.empty(B, S, dtype=torch.long, device="meta")
    rows.append(dict(name="input_ids", shape=list(ids.shape), elements=ids.numel(),
                     int64=ids.nbytes))
    for name, shape in (("embedding_table", (V, H)), ("hidden_states_l0", (B, S, H)),
                        ("decode hidden", (B, 1, H))):
        t16 = torch.empty(shape, dtype=torch.bfloat16, device="meta")
        t32 = torch.empty(shape, dtype=torch.float32, device="meta")
        rows.append(dict(name=name, shape=list(t16.shape), elements=t16.numel(),
                         bf16=t16.nbytes, fp32=t32.nbytes))
    return rows


def size_table(rows: list[dict]):
    """:func:`hidden_state_sizes` rows as a :class:`tokenflow.viz.Table`: shape, element
    count and bytes per dtype in binary units (``-`` where a dtype does not apply)."""
    from .fmt import Table, format_bytes
    body = [[r["name"], str(r["shape"]), r["elements"],
             *[format_bytes(r[k]) if k in r else "-" for k in ("int64", "bf16", "fp32")]]
            for r in rows]
    return Table(body, ["tensor", "shape", "elements", "int64", "bf16", "fp32"],
                 align="<<>>>>")


def hidden_size_explorer(hidden_size: int, vocab_size: int, batch=(1, 4, 8, 16),
                         seq_len=(1, 512, 4096, 8192), default=None, live: bool = True):
    """:func:`size_table` of :func:`hidden_state_sizes` for one ``B`` and ``S`` of the given
    values, at fixed ``H`` and ``V``, behind a control per letter (:func:`tokenflow.viz.explore`:
    ``ipywidgets`` with ``live=True``, else precomputed; ``default``: the values shown first)."""
    from .static import explore
    return explore(
        lambda B, S: size_table(hidden_state_sizes(B, S, hidden_size, vocab_size)),
        {"B": list(batch), "S": list(seq_len)}, default=default, live=live,
        title=f"tensor sizes for H = {hidden_size:,}, V = {vocab_size:,}", live_below=True)


def hidden_size_static(*args, **kw):
    """:func:`hidden_size_explorer` precomputed (``live=False``): works without a kernel."""
    return hidden_size_explorer(*args, live=False, **kw)


def residual_stream_summary(hidden_states, token_index: int, tokens: list[str],
                            layer: int, n_features: int = 6) -> str:
    """Text for one token's hidden state at one depth: its first ``n_features`` values and
    RMS (rounded to 4 decimals), and how far it moved from the previous depth.

    Args:
        hidden_states: ``L+1`` tensors ``[B,S,H]`` (``Trace.hidden_states``); batch row 0.
        token_index: position ``s``. tokens: the ``S`` token strings.
        layer: 0 = embedding output, ``l`` = output of block ``l-1``.

    Raises:
        ValueError: if ``token_index`` or ``layer`` is out of range.
    """
    n = len(hidden_states)
    if isinstance(layer, bool) or not isinstance(layer, int) or not 0 <= layer < n:
        raise ValueError(f"layer must be an int in [0, {n}), got {layer!r}")
    S = hidden_states[0].shape[1]
    if not 0 <= token_index < S:
        raise ValueError(f"token_index must be in [0, {S}), got {token_index!r}")
    h = hidden_states[layer][0, token_index].float()
    where = "embedding output" if layer == 0 else f"output of block {layer - 1}"
    vals = ", ".join(f"{v:.4f}" for v in h[:n_features].tolist())
    lines = [f"token {token_index} '{tokens[token_index]}', {where}: shape {list(h.shape)}",
             f"  first {n_features} features: [{vals}, ...]",
             f"  RMS {float(h.pow(2).mean().sqrt()):.4f}"]
    if layer > 0:
        prev = hidden_states[layer - 1][0, token_index].float()
        lines.append(f"  block {layer - 1} added a vector of RMS "
                     f"{float((h - prev).pow(2).mean().sqrt()):.4f}")
    return "\n".join(lines)


def residual_stream_table(hidden_states, token_index: int, tokens: list[str],
                          n_features: int = 4):
    """One token's hidden state at every depth as a :class:`tokenflow.viz.Table`: its first
    ``n_features`` values, its RMS and the RMS of what the block before it added (the same
    numbers as :func:`residual_stream_summary`, 3 decimals).

    Raises:
        ValueError: if ``token_index`` is out of range.
    """
    from .fmt import Table
    S = hidden_states[0].shape[1]
    if not -S <= token_index < S:
        raise ValueError(f"token_index must be in [{-S}, {S}), got {token_index!r}")
    rows, prev = [], None
    for depth, hs in enumerate(hidden_states):
        h = hs[0, token_index].float()
        rms = lambda v: float(v.pow(2).mean().sqrt())                        # noqa: E731
        rows.append([depth, "embedding" if depth == 0 else f"block {depth - 1}",
                     *[float(v) for v in h[:n_features]], rms(h),
                     None if prev is None else rms(h - prev)])
        prev = h
    feats = [f"f{j}" for j in range(n_features)]
    return Table(rows, ["depth", "output of", *feats, "RMS", "RMS added"], digits=3,
                 title=f"token {token_index % S} {tokens[token_index]!r}: [H = "
                       f"{hidden_states[0].shape[-1]}], first {n_features} features")


def residual_stream_explorer(hidden_states, tokens: list[str], token_index: int = -1,
                             live: bool = True):
    """:func:`tokenflow.viz.residual_stream_plot` of one token (every depth is a row of the
    figure) behind a token selector, starting at ``token_index``
    (:func:`tokenflow.viz.explore`; the precomputed figures are PNG)."""
    from .static import explore
    options = [f"{i} {t}" for i, t in enumerate(tokens)]
    return explore(
        lambda token: residual_stream_plot(hidden_states, options.index(token), tokens),
        {"token": options}, default={"token": options[token_index]}, live=live,
        live_below=True)


def residual_stream_static(*args, **kw):
    """:func:`residual_stream_explorer` precomputed (``live=False``): works without a kernel."""
    return residual_stream_explorer(*args, live=False, **kw)


# what this module defines (every public name after the imports)
__all__ = [n for n in globals() if not n.startswith("_") and n not in _IMPORTED]
