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
from .viz.fmt import say  # re-exported: the helper lives in viz/fmt.py

__all__ = ["say", "setup_notebook", "cjk_font", "topk_bar",
           "hidden_state_heatmap", "residual_stream_plot", "attention_context_plot",
           "attention_head_heatmap", "shape_flow", "kv_cache_growth_plot",
           "vocab_scores", "temperature_curves", "sampling_bars", "frequency_bars", "sampling_panel",
           "moe_flow_diagram", "routing_heatmap", "dispatch_combine_diagram", "expert_load_bar",
           "traffic_heatmap", "routing_load_plot", "moe_comm_bars", "logit_lens_heatmap"]


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


# --------------------------------------------------------------------- chapter 00
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
    fig, ax = plt.subplots(figsize=(9, 0.45 * h.shape[0] + 1.6))
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
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(9, 0.5 * n + 1.8),
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


def attention_context_plot(attention_weights: dict, tokens: list[str], query_index: int = -1,
                           batch_index: int = 0):
    """What one query token reads: for every layer, a heatmap ``[n_heads, S_k]`` of its
    attention weights over the key tokens (values written in the cells).

    Args:
        attention_weights: ``{layer: [B, n_heads, S_q, S_k]}`` (``Trace(keep_tensors=True)
            .attention_weights``).
        tokens: ``S_k`` labels of the key positions.
        query_index: row ``S_q`` to show (default -1: the last token).
        batch_index: which sequence of the batch.

    Returns:
        the ``matplotlib.figure.Figure`` (one panel per layer).

    Raises:
        ValueError: if the dict is empty or ``tokens`` does not match ``S_k``.
    """
    if not attention_weights:
        raise ValueError("attention_weights must be a non-empty {layer: tensor} dict")
    layers = sorted(attention_weights)
    first = attention_weights[layers[0]]
    nh, Sk = first.shape[1], first.shape[-1]
    if len(tokens) != Sk:
        raise ValueError(f"tokens must have S_k={Sk} entries, got {len(tokens)}")
    ncols = min(3, len(layers))                   # at most 3 panels per row: <= 9 inches wide
    nrows = -(-len(layers) // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(3.0 * ncols, (0.5 * nh + 1.5) * nrows + 0.4),
                             squeeze=False)
    for ax in axes.flat[len(layers):]:
        ax.remove()
    for ax, l in zip(axes.flat, layers):
        w = attention_weights[l][batch_index, :, query_index].detach().float()   # [nh, Sk]
        ax.imshow(w.numpy(), cmap="Blues", vmin=0, vmax=1, aspect="auto")
        for h in range(nh):
            for k in range(Sk):
                v = float(w[h, k])
                ax.text(k, h, f"{v:.2f}", ha="center", va="center", fontsize=9,
                        color="white" if v > 0.6 else "black")
        ax.set_xticks(range(Sk), tokens)
        ax.set_yticks(range(nh), [f"head {h}" for h in range(nh)])
        ax.set_title(f"layer {l}")
    q = tokens[query_index] if -Sk <= query_index < Sk else str(query_index)
    fig.suptitle(f"attention weights of the query '{q}' over the context (rows sum to 1)")
    fig.tight_layout()
    return fig


def attention_head_heatmap(weights, q_labels: list[str], k_labels: list[str], title: str = ""):
    """Full attention matrix of one head, ``weights [S_q, S_k]``: row = query token, column =
    key token, value written in each cell; masked (future or padding) cells are exactly 0
    and drawn hatched.

    Raises:
        ValueError: if ``weights`` is not 2-D or the labels do not match its shape.
    """
    w = _as_2d(weights, "weights")
    if len(q_labels) != w.shape[0] or len(k_labels) != w.shape[1]:
        raise ValueError(f"q_labels/k_labels must have {w.shape[0]}/{w.shape[1]} entries, got "
                         f"{len(q_labels)}/{len(k_labels)}")
    fig, ax = plt.subplots(figsize=(min(9.0, 0.8 * w.shape[1] + 2.2),
                                    0.55 * w.shape[0] + 1.4))
    ax.imshow(w.numpy(), cmap="Blues", vmin=0, vmax=1, aspect="auto")
    for i in range(w.shape[0]):
        for j in range(w.shape[1]):
            v = float(w[i, j])
            if v == 0.0:
                ax.add_patch(plt.Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, hatch="//",
                                           ec="#bbbbbb", lw=0))
            else:
                ax.text(j, i, f"{v:.2f}", ha="center", va="center", fontsize=9,
                        color="white" if v > 0.6 else "black")
    ax.set_xticks(range(w.shape[1]), k_labels)
    ax.set_yticks(range(w.shape[0]), q_labels)
    ax.set_xlabel("key (what is read)")
    ax.set_ylabel("query (who reads)")
    if title:
        ax.set_title(title)
    fig.tight_layout()
    return fig


def shape_flow(steps: list[tuple[str, str]], title: str = "", per_row: int = 4):
    """Boxes joined by arrows, e.g. the steps of one attention call with their shapes.
    ``steps`` is a list of ``(text, kind)``, ``kind`` one of ``COLORS`` (``"hidden"``,
    ``"moe"``, ``"token"``) or ``"cache"`` (drawn as a light-blue store). At most
    ``per_row`` boxes per row (the figure stays <= 9 inches wide, text 9.5 pt); longer
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
    ncols = min(per_row, len(steps))
    nrows = -(-len(steps) // ncols)
    width = ncols * (w + gap) - gap + 0.4
    height = nrows * (h + vgap) - vgap + 0.5
    scale = min(1.0, 9.0 / (width * 1.1))                   # inches per data unit, <= 9 in
    fig, ax = plt.subplots(figsize=(width * 1.1 * scale, height * 1.1 * scale + 0.35))

    def pos(i):
        r, c = divmod(i, ncols)
        return c * (w + gap), -r * (h + vgap)
    for i, (text, kind) in enumerate(steps):
        x, y = pos(i)
        ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.03", fc=fills[kind],
                                    ec="black", alpha=0.9))
        ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=9.5,
                color="white" if kind in ("hidden", "token") else "black")
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


def kv_cache_growth_plot(config, max_len: int, kv_heads: list[int],
                         bytes_per_element: float = 2, title: str = ""):
    """KV-cache bytes of one sequence against its length, one line per K/V head count
    (the config's own count in blue, others grey), from
    :func:`tokenflow.costmodel.kv_cache_bytes_per_token`. Bytes grow linearly in the length.

    Args:
        config: a :class:`~tokenflow.config.ModelConfig`.
        max_len: longest sequence drawn (tokens, >= 1).
        kv_heads: K/V head counts to compare (each must divide ``num_attention_heads``).
        bytes_per_element: 2 for bf16/fp16, 4 for fp32.

    Raises:
        ValueError: on ``max_len < 1`` or a head count that does not divide the query heads.
    """
    from .costmodel import kv_cache_bytes_per_token
    if not isinstance(max_len, int) or max_len < 1:
        raise ValueError(f"max_len must be an int >= 1, got {max_len!r}")
    if not kv_heads:
        raise ValueError("kv_heads must be a non-empty list of ints")
    fig, ax = plt.subplots(figsize=(6.5, 3.4))
    xs = [1, max_len]
    styles = iter(["--", ":", "-.", (0, (5, 1, 1, 1))] * len(kv_heads))
    for n in kv_heads:
        if not isinstance(n, int) or n < 1 or config.num_attention_heads % n:
            raise ValueError(f"kv_heads entries must divide num_attention_heads="
                             f"{config.num_attention_heads}, got {n!r}")
        per = kv_cache_bytes_per_token(config.replace(num_key_value_heads=n), bytes_per_element)
        own = n == config.num_key_value_heads
        kind = "MHA" if n == config.num_attention_heads else ("MQA" if n == 1 else "GQA")
        ax.plot(xs, [per * x / 2**20 for x in xs], lw=2.5 if own else 1.5,
                color=COLORS["hidden"] if own else "#777777",
                linestyle="-" if own else next(styles),
                label=f"{n} KV heads ({kind}): {per:,} B/token")
    ax.set_xlabel("tokens in the sequence")
    ax.set_ylabel("KV cache (MiB)")
    ax.legend(fontsize=9)
    ax.set_title(title or f"KV cache of one sequence, {config.name}")
    fig.tight_layout()
    return fig


# --------------------------------------------------------------------- chapter 03 (F3)
def _f3_2d(t, name: str):
    """``t`` (tensor or nested list) as a 2-D float CPU tensor, or ValueError naming it."""
    import torch
    t = t.detach() if isinstance(t, torch.Tensor) else torch.tensor(t)
    if t.dim() != 2:
        raise ValueError(f"{name} must be 2-D, got shape {list(t.shape)}")
    return t.float().cpu()


def _moe_cmap():
    """White -> the book's MoE yellow, for router weights and expert loads."""
    from matplotlib.colors import LinearSegmentedColormap
    return LinearSegmentedColormap.from_list("tokenflow_moe", ["#ffffff", COLORS["moe"]])


def moe_flow_diagram():
    """The seed note's two views of an MoE layer as two rows of boxes: the algorithm
    view (hidden state -> router -> top-k experts -> expert FFN -> weighted combine -> updated
    hidden state) and the system view with experts on other devices (local hidden states ->
    all-to-all dispatch -> remote expert compute -> all-to-all combine -> back at the token
    positions). Blue = hidden-state flow, yellow = routing / expert parallelism. 9.5 inches
    wide, labels at 9.5 pt, so it stays readable when a page scales it down."""
    rows = [("algorithm view (one device)",
             [("hidden state\n[T, H]", "hidden"), ("router / gate\n路由", "moe"),
              ("top-k experts\nK of E", "moe"), ("expert FFN\n专家", "moe"),
              ("weighted\ncombine", "moe"), ("updated hidden\nstate [T, H]", "hidden")]),
            ("system view (experts on W devices)",
             [("local hidden\nstates [T_r, H]", "hidden"), ("all-to-all\ndispatch", "moe"),
              ("remote expert\ncompute", "moe"), ("all-to-all\ncombine", "moe"),
              ("back at the token\npositions [T_r, H]", "hidden")])]
    fig, ax = plt.subplots(figsize=(9.5, 3.9))
    w, gap = 1.32, 0.3                                  # data units ~ inches across
    for r, (label, boxes) in enumerate(rows):
        y = 1.75 * (1 - r)
        ax.text(0.0, y + 1.12, label, fontsize=11, fontweight="bold")
        for i, (text, kind) in enumerate(boxes):
            x = i * (w + gap)
            ax.add_patch(FancyBboxPatch((x, y), w, 0.95, boxstyle="round,pad=0.03",
                                        fc=COLORS[kind], ec="black", alpha=0.88))
            ax.text(x + w / 2, y + 0.475, text, ha="center", va="center", fontsize=9.5,
                    color="white" if kind == "hidden" else "black")
            if i:
                ax.annotate("", xy=(x - 0.03, y + 0.475), xytext=(x - gap + 0.03, y + 0.475),
                            arrowprops=dict(arrowstyle="->", lw=1.4))
    ax.set_xlim(-0.08, 6 * w + 5 * gap + 0.08)
    ax.set_ylim(-0.15, 3.1)
    ax.axis("off")
    fig.tight_layout()
    return fig


def routing_heatmap(indices, weights, num_experts: int, row_labels: list[str],
                    title: str = ""):
    """Which experts each token goes to: a ``[T, E]`` grid, a cell coloured (yellow) and
    labelled with the router weight where expert ``e`` is one of token ``t``'s top-k, blank
    elsewhere.

    Args:
        indices, weights: ``[T, K]`` router choices and weights.
        num_experts: E (columns).
        row_labels: ``T`` labels (token strings).

    Raises:
        ValueError: shape mismatch or an index outside ``[0, num_experts)``.
    """
    import torch
    idx, w = _f3_2d(indices, "indices").long(), _f3_2d(weights, "weights")
    if idx.shape != w.shape:
        raise ValueError(f"weights must have the shape of indices {list(idx.shape)}, "
                         f"got {list(w.shape)}")
    if len(row_labels) != idx.shape[0]:
        raise ValueError(f"row_labels must have {idx.shape[0]} entries, got {len(row_labels)}")
    if idx.numel() and (int(idx.min()) < 0 or int(idx.max()) >= num_experts):
        raise ValueError(f"indices must be in [0, num_experts={num_experts})")
    T = idx.shape[0]
    grid = torch.zeros(T, num_experts).scatter_(1, idx, w)              # [T, E]
    fig, ax = plt.subplots(figsize=(min(0.62 * num_experts + 2.2, 9.5), 0.5 * T + 1.5))
    ax.imshow(grid.numpy(), cmap=_moe_cmap(), vmin=0, vmax=max(float(w.max()), 1e-9),
              aspect="auto")
    for t in range(T):
        for k in range(idx.shape[1]):
            ax.text(int(idx[t, k]), t, f"{float(w[t, k]):.2f}", ha="center", va="center",
                    fontsize=9)
    ax.set_xticks(range(num_experts), [f"e{e}" for e in range(num_experts)])
    ax.set_yticks(range(T), row_labels)
    ax.set_xticks([e - 0.5 for e in range(1, num_experts)], minor=True)
    ax.set_yticks([t - 0.5 for t in range(1, T)], minor=True)
    ax.grid(which="minor", color="#dddddd", lw=0.8)
    ax.tick_params(which="minor", length=0)
    ax.set_xlabel("routed expert (专家)")
    ax.set_ylabel("token")
    ax.set_title(title or "router weights of the chosen experts (blank = not chosen)")
    fig.tight_layout()
    return fig


def dispatch_combine_diagram(indices, weights, num_experts: int, row_labels: list[str]):
    """Dispatch and combine drawn as lines: tokens on the left (blue), the ``T*K`` copies of
    their hidden states grouped by expert in the middle (yellow: what each expert receives, as
    one block), the tokens again on the right; line width on the combine side ~ router weight.

    Raises:
        ValueError: as :func:`routing_heatmap`.
    """
    idx, w = _f3_2d(indices, "indices").long(), _f3_2d(weights, "weights")
    if idx.shape != w.shape or len(row_labels) != idx.shape[0]:
        raise ValueError("indices, weights and row_labels must describe the same T tokens")
    if idx.numel() and (int(idx.min()) < 0 or int(idx.max()) >= num_experts):
        raise ValueError(f"indices must be in [0, num_experts={num_experts})")
    T, K = idx.shape
    pairs = sorted(((int(idx[t, k]), t, float(w[t, k])) for t in range(T) for k in range(K)))
    P = len(pairs)
    fig, ax = plt.subplots(figsize=(9, 0.36 * P + 1.6))

    def y_tok(t):
        return (P - 1) * (1 - (t + 0.5) / T)

    wmax = max((p[2] for p in pairs), default=1.0) or 1.0
    for side, x in (("in", 0.0), ("out", 2.0)):
        for t in range(T):
            ax.add_patch(FancyBboxPatch((x - 0.28, y_tok(t) - 0.3), 0.56, 0.6,
                                        boxstyle="round,pad=0.02", fc=COLORS["hidden"],
                                        ec="black"))
            ax.text(x, y_tok(t), row_labels[t], ha="center", va="center", color="white",
                    fontsize=9)
    prev = None
    for i, (e, t, wt) in enumerate(pairs):
        y = P - 1 - i
        if e != prev:
            n = sum(1 for p in pairs if p[0] == e)
            ax.add_patch(plt.Rectangle((0.72, y - n + 0.55), 0.56, n - 0.1, fc=COLORS["moe"],
                                       ec="black", alpha=0.35))
            ax.text(0.75, y - (n - 1) / 2, f"expert {e}\n{n} row{'s' if n > 1 else ''}",
                    va="center", fontsize=9)
            prev = e
        ax.text(1.14, y, row_labels[t], ha="center", va="center", fontsize=9)
        ax.plot([0.28, 0.72], [y_tok(t), y], color=COLORS["moe"], lw=1.2)
        ax.plot([1.28, 1.72], [y, y_tok(t)], color=COLORS["moe"], lw=0.6 + 3.0 * wt / wmax)
    for x, text in ((0.0, "tokens\n[T, H]"), (1.0, "dispatch: rows\ngrouped by expert"
                                                    f"\n[T*K, H] = [{P}, H]"),
                    (2.0, "combine: weighted\nsum back [T, H]")):
        ax.text(x, P + 0.2, text, ha="center", va="bottom", fontsize=9)
    ax.set_xlim(-0.5, 2.5)
    ax.set_ylim(-1, P + 1.6)
    ax.axis("off")
    fig.tight_layout()
    return fig


def expert_load_bar(counts, capacity: int | None = None, title: str = "", ax=None):
    """Tokens per expert as yellow bars; with ``capacity`` a dashed line at the capacity and
    the part above it (what a capacity-limited MoE would drop) hatched.

    Args:
        counts: ``[E]`` (tensor or list) pairs per expert.
        capacity: rows an expert accepts (:func:`tokenflow.moe.expert_capacity`), or None.
        ax: draw into this axes instead of a new figure.

    Returns:
        the ``matplotlib.figure.Figure``.
    """
    counts = [int(c) for c in (counts.tolist() if hasattr(counts, "tolist") else counts)]
    if not counts:
        raise ValueError("counts must have at least one expert")
    if ax is None:
        fig, ax = plt.subplots(figsize=(min(0.3 * len(counts) + 3, 9.5), 3))
    else:
        fig = ax.figure
    E = len(counts)
    ax.bar(range(E), counts, color=COLORS["moe"], ec="black", lw=0.3)
    mean = sum(counts) / E
    ax.axhline(mean, color="#555555", lw=1, label=f"mean {mean:.4g}")
    if capacity is not None:
        over = [max(c - capacity, 0) for c in counts]
        ax.bar(range(E), over, bottom=[min(c, capacity) for c in counts], color="none",
               ec="#b03a2e", hatch="///", lw=0.5)
        ax.axhline(capacity, color="#b03a2e", ls="--", lw=1.2, label=f"capacity {capacity}")
    ax.set_xlabel("expert")
    ax.set_ylabel("(token, expert) pairs")
    if E <= 32:
        ax.set_xticks(range(E))
    ax.legend(fontsize=9, loc="upper right")
    ax.set_title(title or "load per expert", fontsize=10)
    fig.tight_layout()
    return fig


def traffic_heatmap(traffic, title: str = "", ax=None):
    """The all-to-all as a ``[W, W]`` grid: rows dispatched from rank ``i`` (row) to rank ``j``
    (column), in yellow; the diagonal (outlined) stays on its rank and costs no communication.
    Combine sends the same rows back (the transpose).

    Returns:
        the ``matplotlib.figure.Figure``.
    """
    m = _f3_2d(traffic, "traffic")
    W = m.shape[0]
    if m.shape != (W, W):
        raise ValueError(f"traffic must be square [W, W], got {list(m.shape)}")
    if ax is None:
        fig, ax = plt.subplots(figsize=(min(0.8 * W + 2.4, 9.5), min(0.7 * W + 1.6, 9.0)))
    else:
        fig = ax.figure
    ax.imshow(m.numpy(), cmap=_moe_cmap(), vmin=0, vmax=max(float(m.max()), 1.0))
    for i in range(W):
        for j in range(W):
            ax.text(j, i, f"{int(m[i, j])}", ha="center", va="center", fontsize=9,
                    fontweight="bold" if i == j else "normal")
        ax.add_patch(plt.Rectangle((i - 0.5, i - 0.5), 1, 1, fill=False, ec=COLORS["hidden"],
                                   lw=2))
    ax.set_xticks(range(W), [f"to {j}" for j in range(W)])
    ax.set_yticks(range(W), [f"from {i}" for i in range(W)])
    ax.set_title(title or "dispatched rows (diagonal: local)", fontsize=10)
    fig.tight_layout()
    return fig


def routing_load_plot(result: dict, title: str = ""):
    """Two panels for :func:`tokenflow.expert_parallel.simulate_routing` output: load per
    expert with its capacity, and the rank-to-rank traffic."""
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(9.5, 3.6),
                                 gridspec_kw=dict(width_ratios=[2.2, 1]))
    expert_load_bar(result["counts"], result["capacity"], ax=a1,
                    title=f"load per expert, imbalance max/mean {result['imbalance']:.2f}")
    traffic_heatmap(result["traffic"], ax=a2,
                    title=f"pairs rank -> rank ({len(result['traffic'])} ranks)")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig


def moe_comm_bars(labels: list[str], dispatch_bytes: list[float], combine_bytes: list[float],
                  title: str = "", unit: str = "KiB"):
    """Stacked bars of all-to-all bytes (dispatch + combine) per item, e.g. per model or per
    rank. ``unit``: ``"B"``, ``"KiB"`` or ``"MiB"``.

    Raises:
        ValueError: on lists of different lengths or an unknown unit.
    """
    scale = {"B": 1, "KiB": 2**10, "MiB": 2**20}
    if unit not in scale:
        raise ValueError(f"unit must be one of {sorted(scale)}, got {unit!r}")
    if not (len(labels) == len(dispatch_bytes) == len(combine_bytes)) or not labels:
        raise ValueError("labels, dispatch_bytes and combine_bytes must have the same length > 0")
    d = [v / scale[unit] for v in dispatch_bytes]
    c = [v / scale[unit] for v in combine_bytes]
    fig, ax = plt.subplots(figsize=(min(1.6 * len(labels) + 3, 9.5), 3.2))
    ax.bar(labels, d, color=COLORS["moe"], ec="black", lw=0.4, label="dispatch (out)")
    ax.bar(labels, c, bottom=d, color="#f3dc7a", ec="black", lw=0.4, hatch="..",
           label="combine (back)")
    for i, (a, b) in enumerate(zip(d, c)):
        ax.text(i, a + b, f"{a + b:,.1f}", ha="center", va="bottom", fontsize=9)
    ax.set_ylim(0, 1.18 * max(a + b for a, b in zip(d, c)) or 1.0)
    ax.set_ylabel(unit)
    ax.legend(fontsize=9)
    ax.set_title(title or "all-to-all bytes")
    fig.tight_layout()
    return fig


# --------------------------------------------------------------------- chapter 04 (F4)
_REMOVED = "#c8c8c8"        # grey: a token the filters removed


def vocab_scores(logits, labels: dict[int, str], chosen: int | None = None,
                 title: str = ""):
    """All ``V`` logits of one position, sorted from best to worst, one bar per vocabulary
    entry (blue); the tokens in ``labels`` (``{token_id: text}``) are named and ``chosen`` is
    green. Shows that the LM head scores every vocabulary entry, not a few candidates.

    Args:
        logits: ``[V]`` tensor of one position's scores.
        labels: token ids to annotate with their text.
        chosen: token id drawn in green (e.g. the argmax).

    Raises:
        ValueError: if ``logits`` is not 1-D.
    """
    import torch
    if not isinstance(logits, torch.Tensor) or logits.dim() != 1:
        raise ValueError("logits must be a 1-D tensor [V]")
    vals, order = logits.detach().float().sort(descending=True)
    order = order.tolist()
    V = len(order)
    colors = [COLORS["token"] if i == chosen else COLORS["hidden"] for i in order]
    fig, ax = plt.subplots(figsize=(9, 3.2))
    ax.vlines(range(V), 0, vals.tolist(), colors=colors, lw=max(0.5, 400 / V))   # one bar each
    rank = {tid: r for r, tid in enumerate(order)}
    hi, lo = float(vals[0]), float(vals[-1])
    for n, (tid, text) in enumerate(sorted(labels.items(), key=lambda kv: rank[kv[0]])):
        r = rank[tid]                                   # labels in a column, top right of the peak
        ax.annotate(f"#{r + 1} {text}  {float(vals[r]):.2f}", xy=(r, float(vals[r])),
                    xytext=(V * 0.08, hi - (n + 0.1) * (hi - lo) * 0.13),
                    fontsize=9, va="center", arrowprops=dict(arrowstyle="-", lw=0.6, color="0.4"),
                    color=COLORS["token"] if tid == chosen else "black")
    ax.axhline(0, color="0.5", lw=0.6)
    ax.set_xlim(-1, V)
    ax.set_xlabel(f"all {V:,} vocabulary entries, sorted by score")
    ax.set_ylabel("logit")
    ax.set_title(title or f"one position, {V:,} logits: one score per vocabulary entry")
    fig.tight_layout()
    return fig


def temperature_curves(logits, token_ids: list[int], names: list[str],
                       temperatures=None, log: bool = True):
    """Probability of a few tokens as the temperature goes from sharp to flat (log scale by
    default, so that a confident model's tail stays visible).

    Args:
        logits: ``[V]`` raw logits of one position.
        token_ids, names: the tokens to follow and their labels (same length); the first is
            drawn in green (the greedy choice), the rest in shades of blue.
        temperatures: 1-D sequence of temperatures > 0 (default 0.25 ... 5).
        log: logarithmic probability axis (from 1e-6).

    Raises:
        ValueError: mismatched ``token_ids``/``names`` or a temperature <= 0.
    """
    import torch
    if len(token_ids) != len(names):
        raise ValueError("token_ids and names must have the same length")
    if temperatures is None:
        temperatures = torch.linspace(0.25, 5.0, 39).tolist()
    if min(temperatures) <= 0:
        raise ValueError("temperatures must be > 0")
    probs = torch.stack([(logits.detach().float() / t).softmax(-1)[token_ids]
                         for t in temperatures])                         # [n_T, n_tokens]
    fig, ax = plt.subplots(figsize=(7, 3.2))
    for j, name in enumerate(names):
        color = COLORS["token"] if j == 0 else COLORS["hidden"]
        ax.plot(temperatures, probs[:, j].tolist(), color=color, lw=2 if j == 0 else 1.2,
                alpha=1.0 if j == 0 else max(0.35, 1 - 0.2 * j), label=name)
    ax.axvline(1.0, color="0.5", lw=0.8, ls="--")
    ax.text(1.02, 0.97, "T = 1 (the model's own\nprobabilities)", fontsize=9, va="top",
            transform=ax.get_xaxis_transform())
    ax.set_xlabel("temperature T (logits / T before softmax)")
    if log:
        ax.set_yscale("log")
        ax.set_ylim(1e-6, 2)
    ax.set_ylabel("probability" + (" (log scale)" if log else ""))
    ax.legend(fontsize=9, ncol=2)
    fig.tight_layout()
    return fig


def sampling_bars(tokens: list[str], probs_before, probs_after, kept, chosen: int | None = None,
                  title: str = ""):
    """What the filters did to the best few tokens.

    Dashed outline: the probability after temperature only. Filled bar: for a kept token
    (blue, or green if it is the drawn one) the probability it is actually sampled with (after
    top-k / top-p / min-p, renormalised); for a removed token (grey) its probability before
    the filters, which now goes to 0.

    Args:
        tokens: labels of the ``n`` tokens shown.
        probs_before, probs_after: ``n`` probabilities each (sequences or 1-D tensors).
        kept: ``n`` booleans.
        chosen: index (into ``tokens``) of the sampled token, or None.
    """
    pb, pa, kept = [float(v) for v in probs_before], [float(v) for v in probs_after], \
        [bool(v) for v in kept]
    if not len(tokens) == len(pb) == len(pa) == len(kept):
        raise ValueError("tokens, probs_before, probs_after and kept must have the same length")
    n = len(tokens)
    colors = [COLORS["token"] if i == chosen else (COLORS["hidden"] if kept[i] else _REMOVED)
              for i in range(n)]
    from matplotlib.patches import Patch
    fig, ax = plt.subplots(figsize=(8, 3.2))
    heights = [pa[i] if kept[i] else pb[i] for i in range(n)]   # a removed token: grey, as it was
    ax.bar(range(n), heights, color=colors, width=0.7)
    ax.bar(range(n), pb, fill=False, edgecolor="0.25", width=0.7, lw=1.0, ls="--")
    handles = [Patch(color=COLORS["hidden"], label="kept: probability sampled from"),
               Patch(color=_REMOVED, label="removed by the filters (its probability before)"),
               Patch(color=COLORS["token"], label="the drawn token"),
               Patch(fill=False, edgecolor="0.25", ls="--", label="after temperature only")]
    ax.set_xticks(range(n), tokens)
    ax.set_ylabel("probability")
    ax.set_ylim(0, max(max(pa), max(pb)) * 1.15 + 1e-9)
    ax.legend(handles=handles, fontsize=9, loc="upper right")
    if title:
        ax.set_title(title, fontsize=10)
    fig.tight_layout()
    return fig


def frequency_bars(tokens: list[str], probs, freqs, title: str = ""):
    """Expected probability (blue) next to the frequency observed in repeated draws (green).

    Raises:
        ValueError: if the three sequences differ in length.
    """
    probs, freqs = [float(v) for v in probs], [float(v) for v in freqs]
    if not len(tokens) == len(probs) == len(freqs):
        raise ValueError("tokens, probs and freqs must have the same length")
    n = len(tokens)
    fig, ax = plt.subplots(figsize=(8, 3.2))
    x = list(range(n))
    ax.bar([i - 0.2 for i in x], probs, width=0.4, color=COLORS["hidden"],
           label="probability after filters")
    ax.bar([i + 0.2 for i in x], freqs, width=0.4, color=COLORS["token"],
           label="observed frequency")
    ax.set_xticks(x, tokens)
    ax.set_ylabel("share of draws")
    ax.legend(fontsize=9)
    if title:
        ax.set_title(title, fontsize=10)
    fig.tight_layout()
    return fig


def sampling_panel(logits, tokenizer, temperature: float = 1.0, top_k: int | None = None,
                   top_p: float | None = None, min_p: float | None = None, n: int = 12,
                   seed: int = 0, quiet: bool = False):
    """Filter one position's ``logits [V]``, draw one token with a seeded generator, print a
    one-line summary and draw :func:`sampling_bars` for the ``n`` most likely tokens (after
    temperature). If the drawn token is not among them, it replaces the ``n``-th, so its green
    bar is always shown.

    The printed line (kept tokens, their mass before renormalising, the drawn token) is what
    the chapter's widget shows; the same call in a plain cell is checked by nbval. With
    ``quiet=True`` nothing is printed and the figure's title says how many tokens were kept
    and which one was drawn (for :func:`tokenflow.widgets.sampling_static`).

    Raises:
        TypeError, ValueError: as :func:`tokenflow.sampling.filter_logits`.
    """
    import torch
    from .sampling import filter_steps, sample
    steps = filter_steps(logits, temperature, top_k, top_p, min_p)
    scaled = steps["temperature"]
    before = scaled.softmax(-1)                                    # after temperature only
    after = steps["min_p"].softmax(-1)                             # what is sampled
    kept = torch.isfinite(steps["min_p"])
    chosen = int(sample(logits, temperature, top_k, top_p, min_p,
                        generator=torch.Generator().manual_seed(seed)))
    top = before.topk(min(n, before.numel())).indices.tolist()
    if chosen not in top:               # the drawn token always gets a (green) bar: last place
        top = top[:-1] + [chosen]
    names = [tokenizer.id_to_token(i) for i in top]
    title = f"T={temperature}, top-k={top_k}, top-p={top_p}, min-p={min_p}"
    if quiet:
        title += (f": {int(kept.sum())} of {kept.numel()} kept, "
                  f"drawn {tokenizer.id_to_token(chosen)}")
    else:
        print(f"T={temperature}, top_k={top_k}, top_p={top_p}, min_p={min_p}: "
              f"{int(kept.sum())} of {kept.numel()} tokens kept\n"
              f"  they held {float(before[kept].sum()):.3f} of the probability; "
              f"drawn (seed {seed}): {tokenizer.id_to_token(chosen)}")
    return sampling_bars(names, before[top], after[top], kept[top],
                         chosen=top.index(chosen), title=title)


# --------------------------------------------------------------------- chapter 06 (F6)
def logit_lens_heatmap(lens, tokenizer, tokens: list[str], batch: int = 0, title: str = ""):
    """The logit lens as a grid: one row per depth (embedding, after block 0, ...), one column
    per position; each cell names the top token read at that depth and position, shaded by
    its probability (the book's hidden-state blue). Column ``s`` predicts the token after
    ``tokens[s]``.

    Args:
        lens: ``[L+1, B, S, V]`` from :func:`tokenflow.lens.logit_lens`.
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


# --------------------------------------------------------------------- chapter 05 (F5)
_WAIT = "#c8c8c8"           # grey: a request waiting (queued, or not scheduled this step)
__all__ += ["phase_times_plot", "decode_batch_plot", "arithmetic_intensity_plot",
            "serving_timeline", "batch_composition_plot", "batching_comparison_plot",
            "serving_counts", "serving_panel"]


def _same_len(**lists) -> None:
    n = {len(v) for v in lists.values()}
    if len(n) != 1 or 0 in n:
        raise ValueError(f"{', '.join(lists)} must be non-empty and of the same length")


def _ms_panel(ax, xs, series, xlabel: str, title: str) -> None:
    """Draw ``series`` (``(seconds, style, colour, label)``) in ms against ``xs`` on ``ax``."""
    for seconds, style, colour, label in series:
        ax.plot(xs, [t * 1e3 for t in seconds], style, color=colour, label=label)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("ms")
    ax.set_ylim(bottom=0)
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=9)


def phase_times_plot(lengths, prefill_s, contexts, cached_s, recompute_s, title: str = ""):
    """Two panels, times in ms: prefill time against prompt length (blue), and the time of
    the next token against the context length, one decode step with the KV cache (green)
    against running the whole sequence again without it (grey).

    Raises:
        ValueError: on empty lists or lists of different lengths.
    """
    _same_len(lengths=lengths, prefill_s=prefill_s)
    _same_len(contexts=contexts, cached_s=cached_s, recompute_s=recompute_s)
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(9.5, 3.4))
    _ms_panel(a1, lengths, [(prefill_s, "o-", COLORS["hidden"], "prefill [1, S]")],
              "prompt length S (tokens)", "prefill: one pass over the prompt")
    _ms_panel(a2, contexts, [(recompute_s, "s--", "#777777", "no cache: recompute [1, L+1]"),
                             (cached_s, "o-", COLORS["token"], "decode step [1, 1] + cache")],
              "context length L (tokens already seen)", "next token: with vs without the KV cache")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig


def decode_batch_plot(batch_sizes, step_s, title: str = ""):
    """Decode step time (ms, left) and generated tokens per second (``B / step time``,
    right, green) against the batch size ``B``.

    Raises:
        ValueError: on empty lists or lists of different lengths.
    """
    _same_len(batch_sizes=batch_sizes, step_s=step_s)
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(9.5, 3.4))
    a1.plot(batch_sizes, [t * 1e3 for t in step_s], "o-", color=COLORS["hidden"])
    a1.set_ylim(bottom=0)
    a1.set_ylabel("ms per decode step")
    a1.set_title("one step for the whole batch", fontsize=10)
    a2.plot(batch_sizes, [b / t for b, t in zip(batch_sizes, step_s)], "o-",
            color=COLORS["token"])
    a2.set_ylim(bottom=0)
    a2.set_ylabel("tokens / s")
    a2.set_title("throughput: B tokens per step", fontsize=10)
    for a in (a1, a2):
        a.set_xscale("log", base=2)
        a.set_xticks(batch_sizes, [str(b) for b in batch_sizes])
        a.set_xlabel("batch size B (sequences decoding together)")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig


def arithmetic_intensity_plot(prefill_tokens, prefill_ai, decode_batch, decode_ai,
                              ridge: float, ridge_label: str = "ridge point", title: str = ""):
    """Arithmetic intensity (FLOPs per byte moved) on log-log axes: prefill against the
    prompt length (blue), decode against the batch size (green), and the accelerator's
    ridge point (peak FLOP/s / memory bandwidth, dashed): below it a pass waits on memory
    (memory-bound), above it on arithmetic (compute-bound).

    Raises:
        ValueError: on empty or mismatched lists, or ``ridge <= 0``.
    """
    _same_len(prefill_tokens=prefill_tokens, prefill_ai=prefill_ai)
    _same_len(decode_batch=decode_batch, decode_ai=decode_ai)
    if ridge <= 0:
        raise ValueError(f"ridge must be > 0, got {ridge}")
    fig, ax = plt.subplots(figsize=(7.5, 3.6))
    ax.plot(prefill_tokens, prefill_ai, "o-", color=COLORS["hidden"],
            label="prefill: S tokens of one prompt")
    ax.plot(decode_batch, decode_ai, "s-", color=COLORS["token"],
            label="decode: 1 token of each of B sequences")
    ax.axhline(ridge, color="black", ls="--", lw=1)
    ax.text(min(min(prefill_tokens), min(decode_batch)), ridge * 1.15, ridge_label, fontsize=9)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("tokens per forward pass (S for prefill, B for decode)")
    ax.set_ylabel("FLOPs per byte")
    ax.legend(fontsize=9, loc="lower right")
    ax.set_title(title or "arithmetic intensity of the two phases", fontsize=10)
    fig.tight_layout()
    return fig


def serving_timeline(timelines, title: str = "", max_steps: int | None = None):
    """One row per request, one cell per engine step: prefill (blue), decode (green),
    waiting (grey); blank before arrival and after the last token. ``timelines``: the
    :class:`tokenflow.serving.RequestTimeline` list of one run. A black tick marks each
    request's first token.

    Raises:
        ValueError: if ``timelines`` is empty.
    """
    from matplotlib.patches import Patch
    if not timelines:
        raise ValueError("timelines must be a non-empty list of RequestTimeline")
    colour = {"prefill": COLORS["hidden"], "decode": COLORS["token"], "wait": _WAIT}
    n = len(timelines)
    fig, ax = plt.subplots(figsize=(9.5, 0.22 * n + 1.6))
    last = 0
    for row, r in enumerate(timelines):
        for state in colour:
            cells = [(i, 1) for i, s in r.states.items() if s == state]
            ax.broken_barh(cells, (row - 0.4, 0.8), color=colour[state], lw=0)
        if r.first_token_step is not None:
            ax.plot([r.first_token_step + 1] * 2, [row - 0.45, row + 0.45], color="black", lw=1)
        last = max([last] + [i + 1 for i in r.states])
    ax.set_xlim(0, max_steps or last)
    ax.set_ylim(n - 0.5, -0.5)
    ax.set_yticks(range(n), [str(r.request_id) for r in timelines], fontsize=9)
    ax.set_ylabel("request")
    ax.set_xlabel("engine step")
    ax.legend(handles=[Patch(color=c, label=s) for s, c in colour.items()], fontsize=9,
              loc="upper right", ncol=3)
    ax.set_title(title or "requests over engine steps", fontsize=10)
    fig.tight_layout()
    return fig


def batch_composition_plot(steps, title: str = ""):
    """What each engine step computed, from its :class:`tokenflow.serving.StepRecord` list:
    top, requests in the step (prefill rows blue, decode rows green, stacked); bottom,
    tokens computed (prompt tokens blue, decode tokens green).

    Raises:
        ValueError: if ``steps`` is empty.
    """
    if not steps:
        raise ValueError("steps must be a non-empty list of StepRecord")
    x = [s.index for s in steps]
    n_pre = [len(s.prefill) for s in steps]
    n_dec = [len(s.decode) for s in steps]
    t_pre = [sum(n for _, n in s.prefill) for s in steps]
    fig, (a1, a2) = plt.subplots(2, 1, figsize=(9.5, 4.4), sharex=True)
    for ax, pre, dec, what in ((a1, n_pre, n_dec, "requests"), (a2, t_pre, n_dec, "tokens")):
        ax.bar(x, pre, width=1.0, color=COLORS["hidden"], label=f"prefill {what}")
        ax.bar(x, dec, width=1.0, bottom=pre, color=COLORS["token"], label=f"decode {what}")
        ax.set_ylabel(f"{what} in step")
        ax.legend(fontsize=9, loc="upper right")
    a2.set_xlabel("engine step")
    a1.set_title(title or "batch composition per step", fontsize=10)
    fig.tight_layout()
    return fig


def batching_comparison_plot(results: dict, title: str = ""):
    """Bars per scheduling mode (``results``: ``{name: engine.metrics()}``): throughput
    (generated tokens/s), mean time to first token and mean end-to-end latency (ms).

    Raises:
        ValueError: if ``results`` is empty.
    """
    if not results:
        raise ValueError("results must map at least one mode name to engine metrics")
    names = list(results)
    panels = [("throughput_tok_s", "tokens / s", 1), ("mean_ttft_s", "mean TTFT (ms)", 1e3),
              ("mean_e2e_s", "mean end-to-end (ms)", 1e3)]
    colours = [COLORS["token"], "#777777", COLORS["hidden"], COLORS["moe"]]
    fig, axes = plt.subplots(1, 3, figsize=(9.5, 3.0))
    for ax, (key, label, scale) in zip(axes, panels):
        vals = [results[n][key] * scale for n in names]
        ax.bar(names, vals, color=colours[:len(names)])
        for i, v in enumerate(vals):
            ax.text(i, v, f"{v:,.0f}", ha="center", va="bottom", fontsize=9)
        ax.set_ylim(0, 1.2 * max(vals))
        ax.set_title(label, fontsize=10)
        ax.tick_params(axis="x", labelsize=9)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig


def serving_counts(model, token_ids: list[int], batch_size: int = 8, prompt_len: int = 16,
                   output_len: int = 16, max_num_seqs: int = 4, block_size: int = 16) -> dict:
    """Serve ``batch_size`` requests of ``prompt_len`` prompt tokens (consecutive slices of
    ``token_ids``, so no two share a prefix) and ``output_len`` generated tokens each, all
    arriving at once, with :class:`tokenflow.serving.LLMEngine`, and count what happened
    (steps and KV blocks; no times, so the counts are the same on every machine).

    Returns:
        dict: ``steps``, ``prefill_steps``, ``mean_rows`` / ``max_rows`` (decode rows per
        step with decode), ``blocks_per_request``, ``slots_per_request``, ``tokens_per_request``,
        ``unused_slots`` (per request), ``pool_blocks``, ``peak_blocks`` (most in use at
        once), ``timelines`` (:class:`tokenflow.serving.RequestTimeline` list) and the
        arguments.

    Raises:
        ValueError: a setting outside its range (the message names it), or ``token_ids``
            too short or ``prompt_len + output_len`` past the model's positions.
    """
    from .serving import LLMEngine, SamplingParams, request_timeline, run_with_arrivals
    for name, v in (("batch_size", batch_size), ("prompt_len", prompt_len),
                    ("output_len", output_len), ("max_num_seqs", max_num_seqs),
                    ("block_size", block_size)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be an int >= 1, got {v!r}")
    total = prompt_len + output_len
    if total > model.config.max_position_embeddings:
        raise ValueError(f"prompt_len + output_len must be <= max_position_embeddings="
                         f"{model.config.max_position_embeddings}, got {total}")
    if len(token_ids) < batch_size * prompt_len:
        raise ValueError(f"token_ids must hold batch_size * prompt_len = "
                         f"{batch_size * prompt_len} ids, got {len(token_ids)}")
    per_req = -(-total // block_size)
    engine = LLMEngine(model, num_blocks=batch_size * per_req, block_size=block_size,
                       max_num_seqs=max_num_seqs, max_num_batched_tokens=1024,
                       enable_prefix_caching=False)
    prompts = [list(token_ids[i * prompt_len:(i + 1) * prompt_len]) for i in range(batch_size)]
    _, arrivals = run_with_arrivals(engine, prompts, SamplingParams(output_len, ignore_eos=True),
                                    [0] * batch_size)
    steps = engine.steps
    dec = [len(s.decode) for s in steps if s.decode]
    return dict(batch_size=batch_size, prompt_len=prompt_len, output_len=output_len,
                max_num_seqs=max_num_seqs, block_size=block_size,
                steps=len(steps), prefill_steps=sum(bool(s.prefill) for s in steps),
                mean_rows=sum(dec) / max(len(dec), 1), max_rows=max(dec, default=0),
                blocks_per_request=per_req, slots_per_request=per_req * block_size,
                tokens_per_request=total, unused_slots=per_req * block_size - total,
                pool_blocks=engine.block_manager.num_blocks,
                peak_blocks=engine.block_manager.num_blocks
                - min(s.num_free_blocks for s in steps),
                timelines=request_timeline(engine, arrivals))


def serving_panel(model, token_ids: list[int], batch_size: int = 8, prompt_len: int = 16,
                  output_len: int = 16, max_num_seqs: int = 4, block_size: int = 16):
    """Print the step and KV-block counts of :func:`serving_counts` (same arguments) and
    draw :func:`serving_timeline`. Counts only (no times), so the printed text is the same
    on every machine.

    Raises:
        ValueError: as :func:`serving_counts`.
    """
    c = serving_counts(model, token_ids, batch_size, prompt_len, output_len, max_num_seqs,
                       block_size)
    print(f"{batch_size} requests x ({prompt_len} prompt + {output_len} new tokens), "
          f"max_num_seqs={max_num_seqs}, block_size={block_size}")
    print(f"  steps: {c['steps']}, {c['prefill_steps']} with prefill; decode rows per step: "
          f"mean {c['mean_rows']:.2f}, max {c['max_rows']}")
    print(f"  KV blocks per request: {c['blocks_per_request']} ({c['slots_per_request']} "
          f"slots for {c['tokens_per_request']} tokens, {c['unused_slots']} unused)")
    print(f"  pool: {c['pool_blocks']} blocks, at most {c['peak_blocks']} in use at once")
    return serving_timeline(c["timelines"], title=f"{batch_size} requests, {max_num_seqs} seats")


# ---- chapter 8: further topics
__all__ += ["cache_per_sequence_plot"]


def cache_per_sequence_plot(layouts, contexts, bytes_per_element: float = 2, title: str = ""):
    """Cache bytes one sequence holds (GiB, log-log) against its length, one line per
    :class:`tokenflow.attention_kinds.CacheLayout`: straight lines of slope 1 for layouts
    whose every layer keeps K/V, bending flat where sliding windows fill and constant states
    dominate. Layouts whose name ends in ``*`` (what-if variants) are dashed.

    Raises:
        ValueError: empty ``layouts`` or ``contexts``.
    """
    if not layouts or not contexts:
        raise ValueError("layouts and contexts must be non-empty")
    fig, ax = plt.subplots(figsize=(8.5, 4.2))
    cmap = plt.get_cmap("tab10")
    for i, lay in enumerate(layouts):
        gib = [lay.bytes(n, 1, bytes_per_element) / 2**30 for n in contexts]
        ax.plot(contexts, gib, "--" if lay.name.endswith("*") else "-", color=cmap(i),
                lw=1.6, label=lay.name)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("tokens in the sequence (context length)")
    ax.set_ylabel("cache per sequence (GiB)")
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")
    ax.set_title(title or "what one sequence keeps, by attention kind", fontsize=10)
    fig.tight_layout()
    return fig

# ---- chapter 7: the simulator's two lenses, and the roofline for a real deployment
__all__ += ["lens_bars", "roofline_summary", "roofline_bars", "roofline_panel"]

_LENS_COLOURS = {
    "request queue": "#9e9e9e", "prefill": COLORS["hidden"], "KV cache": "#8fb8ee",
    "decode loop": COLORS["token"], "sampling": "#1b6b2d", "response": "#b7d9bf",
    "embedding": "#1f4f99", "attention": COLORS["hidden"], "FFN / MoE": COLORS["moe"],
    "norm": "#8fb8ee", "LM head": COLORS["token"], "other": "#dddddd"}


def lens_bars(pipeline: dict, blocks: dict, title: str = ""):
    """Two stacked horizontal bars of the same run: the pipeline lens (``pipeline``: stage ->
    seconds, as :meth:`tokenflow.lenses.LensProfile.pipeline`) above the block lens
    (``blocks``: module class -> seconds). Segments in milliseconds, labelled when wide
    enough; blue = hidden-state flow, yellow = MoE, green = token and decode loop.

    Raises:
        ValueError: an empty lens or a negative value.
    """
    for name, lens in (("pipeline", pipeline), ("blocks", blocks)):
        if not lens or min(lens.values()) < 0:
            raise ValueError(f"{name} must map at least one part to seconds >= 0")
    fig, ax = plt.subplots(figsize=(9.5, 2.8))
    total = max(sum(pipeline.values()), sum(blocks.values())) * 1e3
    for y, lens in ((1, pipeline), (0, blocks)):
        left = 0.0
        for part, s in lens.items():
            ms = s * 1e3
            ax.barh(y, ms, left=left, color=_LENS_COLOURS.get(part, "#cccccc"),
                    edgecolor="white", height=0.6)
            if ms > 0.06 * total:
                ax.text(left + ms / 2, y, f"{part}\n{ms:.0f} ms", ha="center", va="center",
                        fontsize=8)
            left += ms
    ax.set_yticks([1, 0], ["pipeline lens", "block lens"])
    ax.set_xlabel("milliseconds of engine step time (the same steps in both bars)")
    ax.set_xlim(0, total * 1.01)
    ax.set_title(title or "one engine run, two lenses")
    fig.tight_layout()
    return fig


def roofline_summary(config, hw_name: str = "H800", phase: str = "decode", batch: int = 64,
                     context_len: int = 4096, ep_size: int = 32, dtype: str = "fp8",
                     bytes_per_param: float = 1, kv_bytes_per_element: float = 2,
                     max_nodes_per_token: int | None = 4) -> dict:
    """Roofline of one step on one device (:func:`tokenflow.roofline.roofline`, tensor
    parallel 1 as in DeepSeek's DP attention) for a hardware preset, with the memory the step
    needs: ``weights + KV`` bytes (:mod:`tokenflow.costmodel`: this device's weights and the
    batch's KV cache).

    Returns:
        dict: the :func:`~tokenflow.roofline.roofline` result plus ``hw`` (the
        :class:`~tokenflow.roofline.HardwareSpec`), ``memory_needed`` (bytes), ``fits``
        (bool) and the arguments.

    Raises:
        ValueError: as :func:`~tokenflow.roofline.hardware` and
            :func:`~tokenflow.roofline.roofline` (e.g. ``ep_size`` not dividing the experts).
    """
    from .costmodel import kv_cache_bytes, weight_bytes_per_device
    from .roofline import hardware, roofline
    hw = hardware(hw_name)
    r = roofline(config, hw, phase, batch, context_len, 1, ep_size, dtype, bytes_per_param,
                 kv_bytes_per_element, max_nodes_per_token)
    mem = weight_bytes_per_device(config, 1, ep_size, bytes_per_param)["total"] + \
        kv_cache_bytes(config, batch, context_len, kv_bytes_per_element)
    return dict(r, hw=hw, memory_needed=mem, fits=mem <= hw.memory_bytes, config=config,
                phase=phase, batch=batch, context_len=context_len, ep_size=ep_size,
                dtype=dtype)


def roofline_bars(summary: dict):
    """The three times of a :func:`roofline_summary` as horizontal bars, with the roofline
    step time (the largest) dashed."""
    r, hw = summary, summary["hw"]
    fig, ax = plt.subplots(figsize=(7.5, 2.2))
    names = ["compute", "memory", "communication"]
    vals = [r[k] * 1e3 for k in ("compute_s", "memory_s", "comm_s")]
    ax.barh(names, vals, color=[COLORS["hidden"], "#8fb8ee", COLORS["moe"]])
    ax.axvline(r["step_s"] * 1e3, color="black", lw=1, ls="--")
    ax.invert_yaxis()
    ax.set_xlabel("ms per step (dashed: the roofline step time, the largest)")
    ax.set_title(f"{r['config'].name}, {r['phase']} on one {hw.name}", fontsize=10)
    fig.tight_layout()
    return fig


def roofline_panel(config, hw_name: str = "H800", phase: str = "decode", batch: int = 64,
                   context_len: int = 4096, ep_size: int = 32, dtype: str = "fp8",
                   bytes_per_param: float = 1, kv_bytes_per_element: float = 2,
                   max_nodes_per_token: int | None = 4):
    """Print :func:`roofline_summary` (same arguments: the three times, the bound, tokens/s
    per device and the memory the step needs) and draw :func:`roofline_bars`.

    Raises:
        ValueError: as :func:`roofline_summary`.
    """
    r = roofline_summary(config, hw_name, phase, batch, context_len, ep_size, dtype,
                         bytes_per_param, kv_bytes_per_element, max_nodes_per_token)
    hw, mem = r["hw"], r["memory_needed"]
    print(f"{config.name} on {hw.name}, {phase}, batch {batch}, context {context_len:,}, "
          f"EP{ep_size}, {dtype}")
    print(f"  compute {r['compute_s'] * 1e3:.2f} ms, memory {r['memory_s'] * 1e3:.2f} ms, "
          f"communication {r['comm_s'] * 1e3:.2f} ms -> {r['bound']}-bound")
    print(f"  {r['tokens_per_s']:,.0f} tokens/s per device; weights + KV "
          f"{mem / 1e9:.1f} GB of {hw.memory_bytes / 1e9:.0f} GB"
          + ("" if r["fits"] else "  (does not fit)"))
    return roofline_bars(r)
