"""Chapter 03: FFN and MoE. The MoE flow, routing heatmaps, dispatch / combine, expert load and
all-to-all traffic, with the routing explorers.

Part of :mod:`tokenflow.viz`, the only package that draws; nothing below it imports it.
"""
from __future__ import annotations

import matplotlib.pyplot as plt
from .fmt import fold
from .lang import tr
from .style import column_figsize, MIN_FONT_PT, text_on
from matplotlib.patches import FancyBboxPatch

from tokenflow.analysis.trace import COLORS

_IMPORTED = set(globals())          # the names above are imported, not defined here


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
    """Chapter 3's two views of an MoE layer as two columns of boxes: the algorithm
    view (hidden state -> router -> top-k experts -> expert FFN -> weighted combine -> updated
    hidden state) and the system view with experts on other devices (local hidden states ->
    all-to-all dispatch -> remote expert compute -> all-to-all combine -> back at the token
    positions). Blue = hidden-state flow, yellow = routing / expert parallelism. The two views
    side by side, each a column of boxes, at the book column's width with body-size labels."""
    rows = [("algorithm view (one device)",
             [("hidden state\n[T, H]", "hidden"), ("router / gate\n路由", "moe"),
              ("top-k experts\nK of E", "moe"), ("expert FFN\n专家", "moe"),
              ("weighted\ncombine", "moe"), ("updated hidden\nstate [T, H]", "hidden")]),
            ("system view (experts on W devices)",
             [("local hidden\nstates [T_r, H]", "hidden"), ("all-to-all\ndispatch", "moe"),
              ("remote expert\ncompute", "moe"), ("all-to-all\ncombine", "moe"),
              ("back at the token\npositions [T_r, H]", "hidden")])]
    # the two views side by side, each a column of boxes top to bottom (data units = inches)
    w, h, step, col = 2.9, 0.56, 0.74, 3.3
    top = 6 * step
    fig, ax = plt.subplots(figsize=column_figsize(6.5, top + 0.4))
    for c, (label, boxes) in enumerate(rows):
        x = c * col
        ax.text(x, top + 0.05, label, fontsize=11, fontweight="bold", va="bottom")
        for i, (text, kind) in enumerate(boxes):
            y = top - (i + 1) * step + 0.1
            ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.03",
                                        fc=COLORS[kind], ec="black", alpha=0.88))
            ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=MIN_FONT_PT,
                    color=text_on(COLORS[kind], 0.88), linespacing=1.1)
            if i:
                ax.annotate("", xy=(x + w / 2, y + h + 0.03),
                            xytext=(x + w / 2, y + step - 0.03),
                            arrowprops=dict(arrowstyle="->", lw=1.4))
    ax.set_xlim(-0.05, col + w + 0.05)
    ax.set_ylim(-0.1, top + 0.4)
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
    fig, ax = plt.subplots(figsize=column_figsize(min(0.62 * num_experts + 2.2, 9.5),
                                                  0.5 * T + 1.5))
    ax.imshow(grid.numpy(), cmap=_moe_cmap(), vmin=0, vmax=max(float(w.max()), 1e-9),
              aspect="auto")
    for t in range(T):
        for k in range(idx.shape[1]):
            ax.text(int(idx[t, k]), t, f"{float(w[t, k]):.2f}", ha="center", va="center",
                    fontsize=MIN_FONT_PT)
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
    fig, ax = plt.subplots(figsize=column_figsize(9, 0.36 * P + 1.6))

    def y_tok(t):
        return (P - 1) * (1 - (t + 0.5) / T)

    wmax = max((p[2] for p in pairs), default=1.0) or 1.0
    for side, x in (("in", 0.0), ("out", 2.0)):
        for t in range(T):
            ax.add_patch(FancyBboxPatch((x - 0.28, y_tok(t) - 0.3), 0.56, 0.6,
                                        boxstyle="round,pad=0.02", fc=COLORS["hidden"],
                                        ec="black"))
            ax.text(x, y_tok(t), row_labels[t], ha="center", va="center",
                    color=text_on(COLORS["hidden"]),
                    fontsize=MIN_FONT_PT)
    prev = None
    for i, (e, t, wt) in enumerate(pairs):
        y = P - 1 - i
        if e != prev:
            n = sum(1 for p in pairs if p[0] == e)
            ax.add_patch(plt.Rectangle((0.72, y - n + 0.55), 0.56, n - 0.1, fc=COLORS["moe"],
                                       ec="black", alpha=0.35))
            ax.text(0.75, y - (n - 1) / 2, f"expert {e}\n{n} row{'s' if n > 1 else ''}",
                    va="center", fontsize=MIN_FONT_PT)
            prev = e
        ax.text(1.14, y, row_labels[t], ha="center", va="center", fontsize=MIN_FONT_PT)
        ax.plot([0.28, 0.72], [y_tok(t), y], color=COLORS["moe"], lw=1.2)
        ax.plot([1.28, 1.72], [y, y_tok(t)], color=COLORS["moe"], lw=0.6 + 3.0 * wt / wmax)
    for x, text in ((0.0, "tokens\n[T, H]"), (1.0, "dispatch: rows\ngrouped by expert"
                                                    f"\n[T*K, H] = [{P}, H]"),
                    (2.0, "combine: weighted\nsum back [T, H]")):
        ax.text(x, P + 0.2, text, ha="center", va="bottom", fontsize=MIN_FONT_PT)
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
        capacity: rows an expert accepts (:func:`tokenflow.model.moe.expert_capacity`), or None.
        ax: draw into this axes instead of a new figure.

    Returns:
        the ``matplotlib.figure.Figure``.
    """
    counts = [int(c) for c in (counts.tolist() if hasattr(counts, "tolist") else counts)]
    if not counts:
        raise ValueError("counts must have at least one expert")
    if ax is None:
        fig, ax = plt.subplots(figsize=column_figsize(min(0.3 * len(counts) + 3, 9.5), 3))
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
    ax.legend(fontsize=MIN_FONT_PT, loc="upper right")
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
        fig, ax = plt.subplots(figsize=column_figsize(min(0.8 * W + 2.4, 9.5),
                                                      min(0.7 * W + 1.6, 9.0)))
    else:
        fig = ax.figure
    ax.imshow(m.numpy(), cmap=_moe_cmap(), vmin=0, vmax=max(float(m.max()), 1.0))
    for i in range(W):
        for j in range(W):
            ax.text(j, i, f"{int(m[i, j])}", ha="center", va="center", fontsize=MIN_FONT_PT,
                    fontweight="bold" if i == j else "normal")
        ax.add_patch(plt.Rectangle((i - 0.5, i - 0.5), 1, 1, fill=False, ec=COLORS["hidden"],
                                   lw=2))
    ax.set_xticks(range(W), [str(j) for j in range(W)])
    ax.set_yticks(range(W), [str(i) for i in range(W)])
    ax.set_xlabel("to rank")
    ax.set_ylabel("from rank")
    ax.set_title(title or "dispatched rows (diagonal: local)", fontsize=10)
    fig.tight_layout()
    return fig


def routing_load_plot(result: dict, title: str = ""):
    """Two panels for :func:`tokenflow.parallel.expert_parallel.simulate_routing` output: load per
    expert with its capacity, and the rank-to-rank traffic."""
    fig, (a1, a2) = plt.subplots(1, 2, figsize=column_figsize(9.5, 3.6),
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
    fig, ax = plt.subplots(figsize=column_figsize(min(1.6 * len(labels) + 3, 9.5), 3.2))
    ax.bar(labels, d, color=COLORS["moe"], ec="black", lw=0.4, label="dispatch (out)")
    ax.bar(labels, c, bottom=d, color="#f3dc7a", ec="black", lw=0.4, hatch="..",
           label="combine (back)")
    for i, (a, b) in enumerate(zip(d, c)):
        ax.text(i, a + b, f"{a + b:,.1f}", ha="center", va="bottom", fontsize=MIN_FONT_PT)
    ax.set_ylim(0, 1.18 * max(a + b for a, b in zip(d, c)) or 1.0)
    ax.set_ylabel(unit)
    ax.legend(fontsize=MIN_FONT_PT)
    ax.set_title(title or "all-to-all bytes")
    fig.tight_layout()
    return fig


# --------------------------------------------------------------------- chapter 03 (F3)
def moe_routing_summary(num_experts: int, top_k: int, batch_size: int, seq_len: int,
                        world_size: int = 4, hidden_size: int = 7168,
                        bytes_per_element: float = 2, capacity_factor: float = 1.25,
                        seed: int = 0) -> str:
    """Text for :func:`tokenflow.parallel.expert_parallel.simulate_routing`: tokens, load per
    expert, imbalance, what a capacity limit would drop, and all-to-all bytes (dispatch and again
    combine) at ``hidden_size`` / ``bytes_per_element``, against the uniform-routing formula.
    A ``ValueError`` (e.g. ``top_k > num_experts``) is returned as its message.
    """
    from tokenflow.parallel.expert_parallel import simulate_routing
    try:
        r = simulate_routing(num_experts, top_k, batch_size, seq_len, world_size=world_size,
                             hidden_size=hidden_size, bytes_per_element=bytes_per_element,
                             capacity_factor=capacity_factor, seed=seed)
    except ValueError as exc:
        return "\n".join(fold(tr(f"ValueError: {exc}"), 90, "  "))
    pairs = r["tokens"] * top_k
    lines = [
        f"E={num_experts} experts, top-k={top_k}, B={batch_size} x S={seq_len} = "
        f"{r['tokens']} tokens -> {pairs} (token, expert) pairs",
        f"  load: min {min(r['counts'])}, mean {pairs / num_experts:.4g}, max "
        f"{max(r['counts'])} pairs per expert; imbalance max/mean {r['imbalance']:.2f}",
        f"  capacity factor {capacity_factor}: capacity {r['capacity']} rows per expert, "
        f"{r['dropped']} pairs over it ({r['dropped'] / max(pairs, 1):.2%})",
        f"  EP over {world_size} ranks: {r['local_pairs']} pairs stay local, "
        f"{r['remote_pairs']} cross ranks",
        f"  all-to-all at H={hidden_size}, {bytes_per_element} B/element: dispatch "
        f"{r['dispatch_bytes']:,} B + combine {r['combine_bytes']:,} B",
        f"  (uniform-routing formula: {int(r['uniform_bytes']):,} B each way)"]
    return "\n".join(line[:len(line) - len(line.lstrip())] + tr(line.lstrip()) for line in lines)


def prob_text(p: float) -> str:
    """A probability with the digits that matter: 4 decimals (``0.4892``, ``0.0005``),
    ``<0.0001`` below that (a table of top tokens reads "tiny", not rounding digits such as
    ``3.8e-05``), ``0`` for exactly zero.

    Raises:
        ValueError: if ``p`` is not in [0, 1].
    """
    p = float(p)
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"p must be a probability in [0, 1], got {p!r}")
    return "0" if p == 0 else f"{p:.4f}" if p >= 1e-4 else "<0.0001"


def moe_routing_explorer(num_experts=(8, 64, 256), top_k=(2, 6, 8), world_size=(2, 8),
                         batch_size: int = 4, seq_len: int = 64, hidden_size: int = 7168,
                         bytes_per_element: float = 2, capacity_factor: float = 1.25,
                         default: dict | None = None, live: bool = True):
    """:func:`tokenflow.viz.routing_load_plot` of
    :func:`tokenflow.parallel.expert_parallel.simulate_routing` for one experts ``E``, top-k
    ``K`` (up to DeepSeek-V3's 8) and EP size ``W`` of the given values (``B x S`` random
    tokens), titled with the pairs dropped at ``capacity_factor`` and the all-to-all bytes at
    ``hidden_size`` / ``bytes_per_element`` (:func:`tokenflow.viz.explore`; ``default``
    starts at E=64, K=6, W=8 where the grid has them).

    Raises:
        ValueError: as :func:`tokenflow.viz.precomputed_explorer` (grid too large), or
            :func:`simulate_routing` (a ``W`` that does not divide an ``E``).
    """
    from tokenflow.parallel.expert_parallel import simulate_routing

    from .fmt import format_bytes
    from .static import explore, default_in

    def show(**kw):
        E, K, W = kw["experts E"], kw["top-k K"], kw["EP ranks W"]
        r = simulate_routing(E, K, batch_size, seq_len, world_size=W, hidden_size=hidden_size,
                             bytes_per_element=bytes_per_element,
                             capacity_factor=capacity_factor)
        return routing_load_plot(r, title=(
            f"E={E}, K={K}, {r['tokens']} tokens on W={W}: {r['dropped']} pairs over capacity, "
            f"{format_bytes(r['dispatch_bytes'])} dispatched"))
    controls = {"experts E": list(num_experts), "top-k K": list(top_k),
                "EP ranks W": list(world_size)}
    return explore(
        show, controls, live=live,
        title=f"B x S = {batch_size} x {seq_len} random tokens, H = {hidden_size}, "
              f"{bytes_per_element} B/element",
        default=default or default_in(controls, {"experts E": 64, "top-k K": 6, "EP ranks W": 8}),
        live_below=True)


def moe_routing_static(*args, **kw):
    """:func:`moe_routing_explorer` precomputed (``live=False``): works without a kernel."""
    return moe_routing_explorer(*args, live=False, **kw)


# what this module defines (every public name after the imports)
__all__ = [n for n in globals() if not n.startswith("_") and n not in _IMPORTED]
