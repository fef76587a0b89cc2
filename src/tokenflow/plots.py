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

__all__ = ["setup_notebook", "cjk_font", "token_flow_diagram", "topk_bar",
           "hidden_state_heatmap", "residual_stream_plot", "attention_context_plot",
           "attention_head_heatmap", "shape_flow", "kv_cache_growth_plot",
           "vocab_scores", "temperature_curves", "sampling_bars", "frequency_bars", "sampling_panel"]


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
    fig, ax = plt.subplots(figsize=(10, 0.45 * h.shape[0] + 1.4))
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
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(11, 0.5 * n + 1.8),
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
    fig, axes = plt.subplots(1, len(layers), figsize=(3.6 * len(layers), 0.45 * nh + 1.8),
                             squeeze=False)
    for ax, l in zip(axes[0], layers):
        w = attention_weights[l][batch_index, :, query_index].detach().float()   # [nh, Sk]
        ax.imshow(w.numpy(), cmap="Blues", vmin=0, vmax=1, aspect="auto")
        for h in range(nh):
            for k in range(Sk):
                v = float(w[h, k])
                ax.text(k, h, f"{v:.2f}", ha="center", va="center", fontsize=7.5,
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
    fig, ax = plt.subplots(figsize=(0.7 * w.shape[1] + 2.2, 0.55 * w.shape[0] + 1.4))
    ax.imshow(w.numpy(), cmap="Blues", vmin=0, vmax=1, aspect="auto")
    for i in range(w.shape[0]):
        for j in range(w.shape[1]):
            v = float(w[i, j])
            if v == 0.0:
                ax.add_patch(plt.Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, hatch="//",
                                           ec="#bbbbbb", lw=0))
            else:
                ax.text(j, i, f"{v:.2f}", ha="center", va="center", fontsize=7.5,
                        color="white" if v > 0.6 else "black")
    ax.set_xticks(range(w.shape[1]), k_labels)
    ax.set_yticks(range(w.shape[0]), q_labels)
    ax.set_xlabel("key (what is read)")
    ax.set_ylabel("query (who reads)")
    if title:
        ax.set_title(title)
    fig.tight_layout()
    return fig


def shape_flow(steps: list[tuple[str, str]], title: str = ""):
    """A row of boxes joined by arrows, e.g. the steps of one attention call with their
    shapes. ``steps`` is a list of ``(text, kind)``, ``kind`` one of ``COLORS``
    (``"hidden"``, ``"moe"``, ``"token"``) or ``"cache"`` (drawn as a light-blue store).

    Raises:
        ValueError: on an empty list or an unknown ``kind``.
    """
    if not steps:
        raise ValueError("steps must be a non-empty list of (text, kind)")
    fills = dict(COLORS, cache="#cfe0f7")
    for _, kind in steps:
        if kind not in fills:
            raise ValueError(f"kind must be one of {sorted(fills)}, got {kind!r}")
    w, gap = 1.5, 0.35
    fig, ax = plt.subplots(figsize=(1.9 * len(steps) + 0.4, 1.9))
    for i, (text, kind) in enumerate(steps):
        x = i * (w + gap)
        ax.add_patch(FancyBboxPatch((x, 0), w, 1, boxstyle="round,pad=0.03", fc=fills[kind],
                                    ec="black", alpha=0.9))
        ax.text(x + w / 2, 0.5, text, ha="center", va="center", fontsize=8.5,
                color="white" if kind in ("hidden", "token") else "black")
        if i:
            ax.annotate("", xy=(x, 0.5), xytext=(x - gap, 0.5),
                        arrowprops=dict(arrowstyle="->", lw=1.4))
    ax.set_xlim(-0.2, len(steps) * (w + gap))
    ax.set_ylim(-0.2, 1.25)
    ax.axis("off")
    if title:
        ax.set_title(title)
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
    ax.legend(fontsize=8)
    ax.set_title(title or f"KV cache of one sequence, {config.name}")
    fig.tight_layout()
    return fig


# --------------------------------------------------------------------- chapter 03 (F3)
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
    ax.text(1.02, 0.97, "T = 1 (the model's own\nprobabilities)", fontsize=8, va="top",
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
    ax.legend(handles=handles, fontsize=8, loc="upper right")
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
    ax.legend(fontsize=8)
    if title:
        ax.set_title(title, fontsize=10)
    fig.tight_layout()
    return fig


def sampling_panel(logits, tokenizer, temperature: float = 1.0, top_k: int | None = None,
                   top_p: float | None = None, min_p: float | None = None, n: int = 12,
                   seed: int = 0):
    """Filter one position's ``logits [V]``, draw one token with a seeded generator, print a
    one-line summary and draw :func:`sampling_bars` for the ``n`` most likely tokens.

    The printed line (kept tokens, their mass before renormalising, the drawn token) is what
    the chapter's widget shows; the same call in a plain cell is checked by nbval.

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
    names = [tokenizer.id_to_token(i) for i in top]
    print(f"T={temperature}, top_k={top_k}, top_p={top_p}, min_p={min_p}: "
          f"{int(kept.sum())} of {kept.numel()} tokens kept, holding "
          f"{float(before[kept].sum()):.4f} of the probability; "
          f"drawn (seed {seed}): {tokenizer.id_to_token(chosen)}")
    return sampling_bars(names, before[top], after[top], kept[top],
                         chosen=top.index(chosen) if chosen in top else None,
                         title=f"T={temperature}, top-k={top_k}, top-p={top_p}, "
                               f"min-p={min_p}")
