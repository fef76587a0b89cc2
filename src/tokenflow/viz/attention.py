"""Chapter 02: attention and the KV cache. Which context a query reads, per-head heatmaps, KV
cache growth and per-sequence cache size, with their tables and explorers.

Part of :mod:`tokenflow.viz`, the only package that draws; nothing below it imports it.
"""
from __future__ import annotations

import matplotlib.pyplot as plt

from .fmt import counted
from .style import column_figsize, MIN_FONT_PT, series_style, text_on
from tokenflow.analysis.trace import COLORS

from .hidden import _as_2d

_IMPORTED = set(globals())          # the names above are imported, not defined here


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
    ncols = min(2, len(layers))                   # 2 panels per row fill the book column
    nrows = -(-len(layers) // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=column_figsize(3.25 * ncols,
                                                                  (0.5 * nh + 1.5) * nrows + 0.4),
                             squeeze=False)
    for ax in axes.flat[len(layers):]:
        ax.remove()
    for ax, l in zip(axes.flat, layers):
        w = attention_weights[l][batch_index, :, query_index].detach().float()   # [nh, Sk]
        ax.imshow(w.numpy(), cmap="Blues", vmin=0, vmax=1, aspect="auto")
        for h in range(nh):
            for k in range(Sk):
                v = float(w[h, k])
                ax.text(k, h, f"{v:.2f}", ha="center", va="center", fontsize=MIN_FONT_PT,
                        color=text_on(plt.get_cmap("Blues")(v)))
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
    fig, ax = plt.subplots(figsize=column_figsize(min(9.0, 0.8 * w.shape[1] + 2.2),
                                    0.55 * w.shape[0] + 1.4))
    ax.imshow(w.numpy(), cmap="Blues", vmin=0, vmax=1, aspect="auto")
    for i in range(w.shape[0]):
        for j in range(w.shape[1]):
            v = float(w[i, j])
            if v == 0.0:
                ax.add_patch(plt.Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, hatch="//",
                                           ec="#bbbbbb", lw=0))
            else:
                ax.text(j, i, f"{v:.2f}", ha="center", va="center", fontsize=MIN_FONT_PT,
                        color=text_on(plt.get_cmap("Blues")(v)))
    ax.set_xticks(range(w.shape[1]), k_labels)
    ax.set_yticks(range(w.shape[0]), q_labels)
    ax.set_xlabel("key (what is read)")
    ax.set_ylabel("query (who reads)")
    if title:
        ax.set_title(title)
    fig.tight_layout()
    return fig


def kv_cache_growth_plot(config, max_len: int, kv_heads: list[int],
                         bytes_per_element: float = 2, title: str = ""):
    """KV-cache bytes of one sequence against its length, one line per K/V head count
    (the config's own count in blue, others grey), from
    :func:`tokenflow.analysis.costmodel.kv_cache_bytes_per_token`. Bytes grow linearly in the
    length.

    Args:
        config: a :class:`~tokenflow.config.ModelConfig`.
        max_len: longest sequence drawn (tokens, >= 1).
        kv_heads: K/V head counts to compare (each must divide ``num_attention_heads``).
        bytes_per_element: 2 for bf16/fp16, 4 for fp32.

    Raises:
        ValueError: on ``max_len < 1`` or a head count that does not divide the query heads.
    """
    from tokenflow.analysis.costmodel import kv_cache_bytes_per_token
    if not isinstance(max_len, int) or max_len < 1:
        raise ValueError(f"max_len must be an int >= 1, got {max_len!r}")
    if not kv_heads:
        raise ValueError("kv_heads must be a non-empty list of ints")
    fig, ax = plt.subplots(figsize=column_figsize(6.5, 3.4))
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
                label=f"{counted(n, 'KV head')} ({kind}): {per:,} B/token")
    ax.set_xlabel("tokens in the sequence")
    ax.set_ylabel("KV cache (MiB)")
    ax.legend(fontsize=MIN_FONT_PT)
    ax.set_title(title or f"KV cache of one sequence, {config.name}")
    fig.tight_layout()
    return fig


def cache_per_sequence_plot(layouts, contexts, bytes_per_element: float = 2, title: str = ""):
    """Cache bytes one sequence holds (GiB, log-log) against its length, one line per
    :class:`tokenflow.analysis.attention_kinds.CacheLayout`: straight lines of slope 1 for layouts
    whose every layer keeps K/V, bending flat where sliding windows fill and constant states
    dominate. Layouts whose name ends in ``*`` (what-if variants) are dashed.

    Raises:
        ValueError: empty ``layouts`` or ``contexts``.
    """
    if not layouts or not contexts:
        raise ValueError("layouts and contexts must be non-empty")
    fig, ax = plt.subplots(figsize=column_figsize(8.5, 4.2))
    for i, lay in enumerate(layouts):
        gib = [lay.bytes(n, 1, bytes_per_element) / 2**30 for n in contexts]
        ax.plot(contexts, gib, "--" if lay.name.endswith("*") else "-", **series_style(i),
                markersize=4, lw=1.6, label=lay.name)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("tokens in the sequence (context length)")
    ax.set_ylabel("cache per sequence (GiB)")
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=MIN_FONT_PT, loc="upper left")
    ax.set_title(title or "what one sequence keeps, by attention kind", fontsize=10)
    fig.tight_layout()
    return fig


def kv_cache_summary(config, batch_size: int, seq_len: int, num_key_value_heads: int,
                     dtype_name: str = "bf16") -> str:
    """Text for a KV cache of ``config`` with ``num_key_value_heads`` K/V heads: shape per
    layer, bytes per token by formula and from the (meta-device) tensors, total bytes,
    and the saving against full multi-head attention. Uses
    :func:`tokenflow.analysis.attention_kinds.kv_cache_size`.

    Raises:
        ValueError: on a bad ``dtype_name`` (``"bf16"`` or ``"fp32"``) and as
            :func:`~tokenflow.analysis.attention_kinds.kv_cache_size`.
    """
    import torch

    from tokenflow.analysis.attention_kinds import kv_cache_size

    from .fmt import format_bytes
    dtypes = {"bf16": torch.bfloat16, "fp32": torch.float32}
    if dtype_name not in dtypes:
        raise ValueError(f"dtype_name must be one of {sorted(dtypes)}, got {dtype_name!r}")
    r = kv_cache_size(config, batch_size, seq_len, num_key_value_heads, dtypes[dtype_name])
    mha = kv_cache_size(config, batch_size, seq_len, config.num_attention_heads,
                        dtypes[dtype_name])
    kind = ("MHA" if num_key_value_heads == config.num_attention_heads else
            "MQA" if num_key_value_heads == 1 else "GQA")
    return "\n".join([
        f"{config.name}: {counted(num_key_value_heads, 'KV head')} for "
        f"{config.num_attention_heads} "
        f"query heads ({kind}), {dtype_name}",
        f"  K and V per layer: {r['shape']} x {r['num_tensors']} tensors",
        f"  bytes/token: formula {r['formula_bytes_per_token']:,}, tensors "
        f"{r['bytes_per_token']:,}",
        f"  total for B={batch_size}, S={seq_len}: {r['nbytes']:,} B "
        f"({format_bytes(r['nbytes'])})",
        "  this is full MHA" if kind == "MHA" else
        f"  full MHA would need {mha['nbytes']:,} B: {mha['nbytes'] // r['nbytes']}x more"])


def kv_cache_explorer(config, seq_len=(1, 16, 64, 128), batch_size: int = 1,
                      dtype_name: str = "bf16", live: bool = True):
    """:func:`kv_cache_summary` for one sequence length ``S`` of ``seq_len`` and one K/V-head
    count (every divisor of the query heads: MQA ... MHA), starting at the longest ``S`` and
    the config's own K/V heads (:func:`tokenflow.viz.explore`: ``ipywidgets`` with
    ``live=True``, else precomputed)."""
    from .static import explore
    divisors = [d for d in range(1, config.num_attention_heads + 1)
                if config.num_attention_heads % d == 0]
    return explore(
        lambda S, kv_heads: kv_cache_summary(config, batch_size, S, kv_heads, dtype_name),
        {"S": list(seq_len), "kv_heads": divisors},
        default={"S": seq_len[-1], "kv_heads": config.num_key_value_heads}, live=live,
        title=f"{config.name}: KV cache for sequence length S and K/V heads ({dtype_name})",
        live_below=True)


def kv_cache_static(*args, **kw):
    """:func:`kv_cache_explorer` precomputed (``live=False``): works without a kernel."""
    return kv_cache_explorer(*args, live=False, **kw)


def attention_explorer(attention_weights: dict, q_labels: list[str], k_labels: list[str],
                       batch_index: int = 0, default: dict | None = None, live: bool = True):
    """:func:`tokenflow.viz.attention_head_heatmap` of one layer and head of
    ``{layer: [B, n_heads, S_q, S_k]}`` weights behind a layer and a head control
    (:func:`tokenflow.viz.explore`; ``default``: the ``layer`` / ``head`` shown first; the
    precomputed figures are PNG, as every explorer's)."""
    from .static import explore
    layers = sorted(attention_weights)
    nh = attention_weights[layers[0]].shape[1]
    return explore(
        lambda layer, head: attention_head_heatmap(attention_weights[layer][batch_index, head],
                                                   q_labels, k_labels,
                                                   title=f"layer {layer}, head {head}"),
        {"layer": layers, "head": list(range(nh))}, default=default, live=live, live_below=True)


def attention_static(*args, **kw):
    """:func:`attention_explorer` precomputed (``live=False``): works without a kernel."""
    return attention_explorer(*args, live=False, **kw)


def kv_cache_scale_table(config, context: int, batch: int, num_key_value_heads: int,
                         device_memory_bytes: float = 80e9, bytes_per_element: float = 2,
                         memory_fraction: float = 0.9):
    """A published ``config`` at serving scale, with ``num_key_value_heads`` K/V heads, from
    the cost model: its weights (:func:`~tokenflow.analysis.costmodel.weight_bytes_per_device`)
    and the KV cache of ``batch`` sequences of ``context`` tokens
    (:func:`~tokenflow.analysis.costmodel.kv_cache_bytes`), in GiB and as shares of one
    device of ``device_memory_bytes``; titled with the most such sequences that fit
    (:func:`~tokenflow.analysis.costmodel.max_batch_size`: ``memory_fraction`` of the memory is
    usable, the rest left to activations and overhead). Its last two rows are one sequence's
    cache and the usable memory, so the title's count is floor((usable - weights) / one
    sequence). A :class:`tokenflow.viz.Table`.

    Raises:
        ValueError: a ``num_key_value_heads`` that does not divide the query heads, and as the
            cost-model functions.
    """
    import dataclasses

    from tokenflow.analysis.costmodel import kv_cache_bytes, max_batch_size, \
        weight_bytes_per_device

    from .fmt import Table
    nh = config.num_attention_heads
    if (isinstance(num_key_value_heads, bool) or not isinstance(num_key_value_heads, int)
            or num_key_value_heads < 1 or nh % num_key_value_heads):
        raise ValueError(f"num_key_value_heads must divide num_attention_heads={nh}, "
                         f"got {num_key_value_heads!r}")
    c = dataclasses.replace(config, num_key_value_heads=num_key_value_heads)
    w = weight_bytes_per_device(c, bytes_per_param=bytes_per_element)["total"]
    kv = kv_cache_bytes(c, batch=batch, context_len=context, bytes_per_element=bytes_per_element)
    one = kv_cache_bytes(c, batch=1, context_len=context, bytes_per_element=bytes_per_element)
    fit = max_batch_size(c, context_len=context, device_memory_bytes=device_memory_bytes,
                         bytes_per_param=bytes_per_element,
                         kv_bytes_per_element=bytes_per_element, memory_fraction=memory_fraction)
    gb = device_memory_bytes / 1e9
    usable = memory_fraction * device_memory_bytes
    rows = [["weights", w / 2**30, w / device_memory_bytes],
            [f"KV cache, B={batch} x S={context:,}", kv / 2**30, kv / device_memory_bytes],
            ["together", (w + kv) / 2**30, (w + kv) / device_memory_bytes],
            [f"KV cache, one sequence of S={context:,}", one / 2**30, one / device_memory_bytes],
            [f"usable ({memory_fraction:.0%} of {gb:g} GB)", usable / 2**30, memory_fraction]]
    kind = "MHA" if num_key_value_heads == nh else "MQA" if num_key_value_heads == 1 else "GQA"
    return Table(rows, ["", "GiB", f"share of {gb:g} GB"], digits=[0, 1, 2], align="<>>",
                 title=f"{config.name}, {counted(num_key_value_heads, 'KV head')} ({kind}): "
                       f"at most {fit} sequences of {context:,} tokens fit one {gb:g} GB "
                       f"device: (usable - weights) / one sequence, rounded down")


def kv_cache_scale_explorer(config, context=(1024, 2048, 4096, 8192), batch=(1, 8, 32, 128),
                            kv_heads=(1, 8, 32), default: dict | None = None,
                            live: bool = True):
    """:func:`kv_cache_scale_table` for one context ``S``, batch ``B`` and K/V-head count of
    the given values (:func:`tokenflow.viz.explore`; precomputed: at most 48 combinations)."""
    from .static import explore
    return explore(lambda S, B, kv_heads: kv_cache_scale_table(config, S, B, kv_heads),
                   {"S": list(context), "B": list(batch), "kv_heads": list(kv_heads)},
                   default=default, live=live, title=f"{config.name} at serving scale (bf16)")


def kv_cache_scale_static(*args, **kw):
    """:func:`kv_cache_scale_explorer` precomputed (``live=False``): works without a kernel."""
    return kv_cache_scale_explorer(*args, live=False, **kw)


def kv_per_token_view(layouts: list, contexts: list, bytes_per_element: float = 2):
    """:func:`tokenflow.analysis.attention_kinds.kv_per_token_rows` as a
    :class:`tokenflow.viz.Table`: one row per cache layout, average bytes per token of one
    sequence at each context."""
    from tokenflow.analysis.attention_kinds import kv_per_token_rows

    from .fmt import Table
    return Table(kv_per_token_rows(layouts, contexts, bytes_per_element),
                 ["layout"] + [f"{n:,} tok" for n in contexts],
                 title=f"average cache bytes per token of one sequence "
                       f"({bytes_per_element:g} bytes per element; * = what-if variant)")


# what this module defines (every public name after the imports)
__all__ = [n for n in globals() if not n.startswith("_") and n not in _IMPORTED]
