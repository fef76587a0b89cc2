"""Chapter 04: the LM head and sampling. Vocabulary scores, temperature curves, what the
top-k / top-p / min-p filters keep, with the sampling explorers.

Part of :mod:`tokenflow.viz`, the only package that draws; nothing below it imports it.
"""
from __future__ import annotations

import matplotlib.pyplot as plt

from .lang import tr
from .style import column_figsize, MIN_FONT_PT
from tokenflow.analysis.trace import COLORS

_IMPORTED = set(globals())          # the names above are imported, not defined here


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
    fig, ax = plt.subplots(figsize=column_figsize(9, 3.2))
    ax.vlines(range(V), 0, vals.tolist(), colors=colors, lw=max(0.5, 400 / V))   # one bar each
    rank = {tid: r for r, tid in enumerate(order)}
    hi, lo = float(vals[0]), float(vals[-1])
    for n, (tid, text) in enumerate(sorted(labels.items(), key=lambda kv: rank[kv[0]])):
        r = rank[tid]                                   # labels in a column, top right of the peak
        ax.annotate(f"#{r + 1} {text}  {float(vals[r]):.2f}", xy=(r, float(vals[r])),
                    xytext=(V * 0.08, hi - (n + 0.1) * (hi - lo) * 0.13),
                    fontsize=MIN_FONT_PT, va="center", arrowprops=dict(arrowstyle="-", lw=0.6,
                                                                       color="0.4"),
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
    fig, ax = plt.subplots(figsize=column_figsize(7, 3.2))
    for j, name in enumerate(names):
        color = COLORS["token"] if j == 0 else COLORS["hidden"]
        ax.plot(temperatures, probs[:, j].tolist(), color=color, lw=2 if j == 0 else 1.2,
                alpha=1.0 if j == 0 else max(0.35, 1 - 0.2 * j), label=name)
    ax.axvline(1.0, color="0.5", lw=0.8, ls="--")
    ax.text(1.02, 0.97, "temperature 1 (the model's\nown probabilities)", fontsize=MIN_FONT_PT,
            va="top", transform=ax.get_xaxis_transform())
    ax.set_xlabel("temperature T (logits / T before softmax)")
    if log:
        ax.set_yscale("log")
        ax.set_ylim(1e-6, 2)
    ax.set_ylabel("probability" + (" (log scale)" if log else ""))
    ax.legend(fontsize=MIN_FONT_PT, ncol=2)
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
    fig, ax = plt.subplots(figsize=column_figsize(8, 3.2))
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
    ax.legend(handles=handles, fontsize=MIN_FONT_PT, loc="upper right")
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
    fig, ax = plt.subplots(figsize=column_figsize(8, 3.2))
    x = list(range(n))
    ax.bar([i - 0.2 for i in x], probs, width=0.4, color=COLORS["hidden"],
           label="probability after filters")
    ax.bar([i + 0.2 for i in x], freqs, width=0.4, color=COLORS["token"],
           label="observed frequency")
    ax.set_xticks(x, tokens)
    ax.set_ylabel("share of draws")
    ax.legend(fontsize=MIN_FONT_PT)
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
    and which one was drawn (for :func:`tokenflow.viz.sampling_static`).

    Raises:
        TypeError, ValueError: as :func:`tokenflow.inference.sampling.filter_logits`.
    """
    import torch

    from tokenflow.inference.sampling import filter_steps, sample
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
    title = f"temperature={temperature}, top-k={top_k}, top-p={top_p}, min-p={min_p}"
    if quiet:
        title += (f": {int(kept.sum())} of {kept.numel()} kept, "
                  f"drawn {tokenizer.id_to_token(chosen)}")
    else:
        print(tr(f"temperature={temperature}, top_k={top_k}, top_p={top_p}, min_p={min_p}: "
                 f"{int(kept.sum())} of {kept.numel()} tokens kept") + "\n  "
              + tr(f"they held {float(before[kept].sum()):.3f} of the probability; "
                   f"drawn (seed {seed}): {tokenizer.id_to_token(chosen)}"))
    return sampling_bars(names, before[top], after[top], kept[top],
                         chosen=top.index(chosen), title=title)


# --------------------------------------------------------------------- chapter 04 (F4)
def sampling_explorer(logits, tokenizer, temperature=(0.5, 1.0, 2.0), top_k=(3, 50),
                      top_p=(0.7, 1.0), min_p=(0.0, 0.1), n: int = 12, seed: int = 0,
                      live: bool = True):
    """:func:`tokenflow.viz.sampling_panel` of one position's ``logits [V]`` (quiet: the kept
    count and the drawn token go in the title; kept tokens blue, removed grey, the seeded draw
    green) for one temperature, top-k, top-p and min-p of the given values
    (:func:`tokenflow.viz.explore`). Shown first: the temperature closest to 1 with the
    loosest filters.

    Raises:
        ValueError: as :func:`tokenflow.viz.precomputed_explorer` or
            :func:`tokenflow.inference.sampling.filter_logits`.
    """
    from .static import explore

    def show(**kw):
        return sampling_panel(logits, tokenizer, kw["temperature"], kw["top-k"], kw["top-p"],
                              kw["min-p"], n=n, seed=seed, quiet=True)
    return explore(
        show, {"temperature": list(temperature), "top-k": list(top_k), "top-p": list(top_p),
               "min-p": list(min_p)}, live=live,
        title=f"the {n} most likely tokens; drawn with seed {seed}",
        default={"temperature": min(temperature, key=lambda t: abs(t - 1.0)),
                 "top-k": max(top_k), "top-p": max(top_p), "min-p": min(min_p)}, live_below=True)


def sampling_static(*args, **kw):
    """:func:`sampling_explorer` precomputed (``live=False``): works without a kernel."""
    return sampling_explorer(*args, live=False, **kw)


# what this module defines (every public name after the imports)
__all__ = [n for n in globals() if not n.startswith("_") and n not in _IMPORTED]
