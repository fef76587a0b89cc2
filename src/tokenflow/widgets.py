"""ipywidgets controls shared by the chapters.

Each builder returns an ``ipywidgets`` object; its callback calls a plain function that the
chapter also calls in an ordinary cell, so the numbers shown are checked by nbval even
though widget output is not.
"""
from __future__ import annotations

import ipywidgets as widgets

__all__ = ["shape_controls",
           "tensor_table", "hidden_state_sizes", "size_table", "hidden_size_explorer", "residual_stream_summary",
           "residual_stream_explorer", "kv_cache_summary", "kv_cache_explorer", "attention_explorer",
           "sampling_controls", "sampling_explorer",
           "moe_routing_summary", "moe_routing_explorer",
           "logit_lens_topk", "logit_lens_explorer", "decode_trace_summary", "decode_trace_explorer"]


def shape_controls(batch=(1, 8, 1, 2), seq_len=(1, 64, 1, 5), experts=(2, 32, 2, 8)):
    """Sliders for batch size ``B``, sequence length ``S`` and expert count ``E``.

    Each argument is ``(min, max, step, value)``. Returns a dict of ``IntSlider`` named
    ``batch_size``, ``seq_len``, ``num_experts``.
    """
    def s(desc, spec):
        lo, hi, step, val = spec
        return widgets.IntSlider(value=val, min=lo, max=hi, step=step, description=desc,
                                 continuous_update=False)
    return {"batch_size": s("batch B", batch), "seq_len": s("seq len S", seq_len),
            "num_experts": s("experts E", experts)}


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
    from .viz import Table
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
    from .viz import Table, format_bytes
    body = [[r["name"], str(r["shape"]), r["elements"],
             *[format_bytes(r[k]) if k in r else "-" for k in ("int64", "bf16", "fp32")]]
            for r in rows]
    return Table(body, ["tensor", "shape", "elements", "int64", "bf16", "fp32"],
                 align="<<>>>>")


def hidden_size_explorer(hidden_size: int, vocab_size: int, batch=(1, 16, 1, 8),
                         seq_len=(1, 8192, 1, 4096)):
    """Sliders for ``B`` and ``S`` that print :func:`size_table` of
    :func:`hidden_state_sizes` for the given ``H`` and ``V``. ``batch``/``seq_len`` are
    ``(min, max, step, value)``. Returns an ``ipywidgets.interactive``."""
    def show(batch_size, seq_len):
        print(size_table(hidden_state_sizes(batch_size, seq_len, hidden_size, vocab_size)))
    return widgets.interactive(
        show,
        batch_size=widgets.IntSlider(value=batch[3], min=batch[0], max=batch[1], step=batch[2],
                                     description="batch B", continuous_update=False),
        seq_len=widgets.IntSlider(value=seq_len[3], min=seq_len[0], max=seq_len[1],
                                  step=seq_len[2], description="seq len S",
                                  continuous_update=False))


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


def residual_stream_explorer(hidden_states, tokens: list[str], token_index: int = -1):
    """A layer slider and a token selector: shows :func:`residual_stream_summary` and
    :func:`tokenflow.plots.residual_stream_plot` for the chosen depth. Returns an
    ``ipywidgets.interactive``."""
    import matplotlib.pyplot as plt
    from .plots import residual_stream_plot
    n = len(hidden_states)

    def show(token, layer):
        print(residual_stream_summary(hidden_states, token, tokens, layer))
        residual_stream_plot(hidden_states, token, tokens, layer)
        plt.show()
    options = [(f"{i} {t}", i) for i, t in enumerate(tokens)]
    return widgets.interactive(
        show,
        token=widgets.Dropdown(options=options, value=options[token_index][1],
                               description="token"),
        layer=widgets.IntSlider(value=n - 1, min=0, max=n - 1, description="depth",
                                continuous_update=False))


def kv_cache_summary(config, batch_size: int, seq_len: int, num_key_value_heads: int,
                     dtype_name: str = "bf16") -> str:
    """Text for a KV cache of ``config`` with ``num_key_value_heads`` K/V heads: shape per
    layer, bytes per token by formula and from the (meta-device) tensors, total bytes,
    and the saving against full multi-head attention. Uses
    :func:`tokenflow.kv_cache.kv_cache_size`.

    Raises:
        ValueError: on a bad ``dtype_name`` (``"bf16"`` or ``"fp32"``) and as
            :func:`~tokenflow.kv_cache.kv_cache_size`.
    """
    import torch
    from .kv_cache import format_bytes, kv_cache_size
    dtypes = {"bf16": torch.bfloat16, "fp32": torch.float32}
    if dtype_name not in dtypes:
        raise ValueError(f"dtype_name must be one of {sorted(dtypes)}, got {dtype_name!r}")
    r = kv_cache_size(config, batch_size, seq_len, num_key_value_heads, dtypes[dtype_name])
    mha = kv_cache_size(config, batch_size, seq_len, config.num_attention_heads,
                        dtypes[dtype_name])
    kind = ("MHA" if num_key_value_heads == config.num_attention_heads else
            "MQA" if num_key_value_heads == 1 else "GQA")
    return "\n".join([
        f"{config.name}: {num_key_value_heads} KV heads for {config.num_attention_heads} "
        f"query heads ({kind}), {dtype_name}",
        f"  K and V per layer: {r['shape']} x {r['num_tensors']} tensors",
        f"  bytes/token: formula {r['formula_bytes_per_token']:,}, tensors "
        f"{r['bytes_per_token']:,}",
        f"  total for B={batch_size}, S={seq_len}: {r['nbytes']:,} B "
        f"({format_bytes(r['nbytes'])})",
        f"  this is full MHA" if kind == "MHA" else
        f"  full MHA would need {mha['nbytes']:,} B: {mha['nbytes'] // r['nbytes']}x more"])


def kv_cache_explorer(config, batch_size: int = 1, seq_len=(1, 128, 1, 64),
                      dtype_name: str = "bf16"):
    """Sequence-length slider and K/V-head selector (the divisors of the query-head count)
    that print :func:`kv_cache_summary`. ``seq_len`` is ``(min, max, step, value)``; ``max``
    is capped at ``config.max_position_embeddings``. Returns an ``ipywidgets.interactive``."""
    divisors = [d for d in range(1, config.num_attention_heads + 1)
                if config.num_attention_heads % d == 0]
    hi = min(seq_len[1], config.max_position_embeddings)

    def show(seq_len, num_key_value_heads):
        print(kv_cache_summary(config, batch_size, seq_len, num_key_value_heads, dtype_name))
    return widgets.interactive(
        show,
        seq_len=widgets.IntSlider(value=min(seq_len[3], hi), min=seq_len[0], max=hi,
                                  step=seq_len[2], description="seq len S",
                                  continuous_update=False),
        num_key_value_heads=widgets.Dropdown(options=divisors,
                                             value=config.num_key_value_heads,
                                             description="KV heads"))


def attention_explorer(attention_weights: dict, q_labels: list[str], k_labels: list[str],
                       batch_index: int = 0):
    """Layer and head selectors over ``{layer: [B, n_heads, S_q, S_k]}`` weights, drawing
    :func:`tokenflow.plots.attention_head_heatmap`. Returns an ``ipywidgets.interactive``."""
    import matplotlib.pyplot as plt
    from .plots import attention_head_heatmap
    layers = sorted(attention_weights)
    nh = attention_weights[layers[0]].shape[1]

    def show(layer, head):
        attention_head_heatmap(attention_weights[layer][batch_index, head], q_labels, k_labels,
                               title=f"layer {layer}, head {head}")
        plt.show()
    return widgets.interactive(
        show,
        layer=widgets.Dropdown(options=layers, value=layers[0], description="layer"),
        head=widgets.IntSlider(value=0, min=0, max=nh - 1, description="head",
                               continuous_update=False))


# --------------------------------------------------------------------- chapter 03 (F3)
def moe_routing_summary(num_experts: int, top_k: int, batch_size: int, seq_len: int,
                        world_size: int = 4, hidden_size: int = 7168,
                        bytes_per_element: float = 2, capacity_factor: float = 1.25,
                        seed: int = 0) -> str:
    """Text for :func:`tokenflow.expert_parallel.simulate_routing`: tokens, load per expert,
    imbalance, what a capacity limit would drop, and all-to-all bytes (dispatch and again
    combine) at ``hidden_size`` / ``bytes_per_element``, against the uniform-routing formula.
    A ``ValueError`` (e.g. ``top_k > num_experts``) is returned as its message.
    """
    from .expert_parallel import simulate_routing
    try:
        r = simulate_routing(num_experts, top_k, batch_size, seq_len, world_size=world_size,
                             hidden_size=hidden_size, bytes_per_element=bytes_per_element,
                             capacity_factor=capacity_factor, seed=seed)
    except ValueError as exc:
        import textwrap
        return textwrap.fill(f"ValueError: {exc}", width=90, subsequent_indent="  ")
    pairs = r["tokens"] * top_k
    return "\n".join([
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
        f"  (uniform-routing formula: {int(r['uniform_bytes']):,} B each way)"])


def moe_routing_explorer(hidden_size: int = 7168, bytes_per_element: float = 2,
                         capacity_factor: float = 1.25):
    """Sliders for experts ``E``, top-k ``K``, batch ``B``, sequence length ``S`` and EP size
    ``W``; prints :func:`moe_routing_summary` and draws
    :func:`tokenflow.plots.routing_load_plot` (load per expert, rank-to-rank traffic).
    Returns an ``ipywidgets.interactive``."""
    import matplotlib.pyplot as plt
    from .expert_parallel import simulate_routing
    from .plots import routing_load_plot

    def show(num_experts, top_k, batch_size, seq_len, world_size):
        print(moe_routing_summary(num_experts, top_k, batch_size, seq_len, world_size,
                                  hidden_size, bytes_per_element, capacity_factor))
        try:
            r = simulate_routing(num_experts, top_k, batch_size, seq_len, world_size=world_size,
                                 hidden_size=hidden_size, bytes_per_element=bytes_per_element,
                                 capacity_factor=capacity_factor)
        except ValueError:
            return
        routing_load_plot(r)
        plt.show()
    return widgets.interactive(
        show,
        num_experts=widgets.SelectionSlider(options=[4, 8, 16, 32, 64, 128, 256], value=8,
                                            description="experts E", continuous_update=False),
        top_k=widgets.IntSlider(value=2, min=1, max=8, description="top-k K",
                                continuous_update=False),
        batch_size=widgets.IntSlider(value=4, min=1, max=32, description="batch B",
                                     continuous_update=False),
        seq_len=widgets.IntSlider(value=64, min=1, max=512, description="seq len S",
                                  continuous_update=False),
        world_size=widgets.Dropdown(options=[1, 2, 4], value=4, description="EP ranks W"))


# --------------------------------------------------------------------- chapter 04 (F4)
def sampling_controls(temperature=(0.0, 5.0, 0.1, 1.0), top_k=(1, 50, 1, 50),
                      top_p=(0.05, 1.0, 0.05, 1.0), min_p=(0.0, 1.0, 0.01, 0.0)):
    """Sliders for temperature, top-k, top-p and min-p.

    Each argument is ``(min, max, step, value)``. Returns a dict of sliders named
    ``temperature``, ``top_k``, ``top_p``, ``min_p`` (the keyword names of
    :func:`tokenflow.sampling.filter_logits`), ready for ``widgets.interactive``.
    """
    def f(desc, spec, fmt):
        lo, hi, step, val = spec
        return widgets.FloatSlider(value=val, min=lo, max=hi, step=step, description=desc,
                                   readout_format=fmt, continuous_update=False)
    lo, hi, step, val = top_k
    return {"temperature": f("temperature", temperature, ".2f"),
            "top_k": widgets.IntSlider(value=val, min=lo, max=hi, step=step,
                                       description="top-k", continuous_update=False),
            "top_p": f("top-p", top_p, ".2f"),
            "min_p": f("min-p", min_p, ".2f")}


def sampling_explorer(logits, tokenizer, n: int = 12, seed: int = 0, **slider_specs):
    """An ``interactive`` widget: move the sliders of :func:`sampling_controls` and see
    :func:`tokenflow.plots.sampling_panel` redraw for one position's ``logits [V]`` (kept
    tokens in blue, removed in grey, the seeded draw in green).

    ``slider_specs`` are passed to :func:`sampling_controls`.
    """
    from .plots import sampling_panel

    def show(temperature, top_k, top_p, min_p):
        sampling_panel(logits, tokenizer, round(temperature, 4), top_k, round(top_p, 4),
                       round(min_p, 4), n=n, seed=seed)
        import matplotlib.pyplot as plt
        plt.show()
    return widgets.interactive(show, **sampling_controls(**slider_specs))


# --------------------------------------------------------------------- chapter 06 (F6)
def logit_lens_topk(lens, tokenizer, depth: int, position: int, token_ids=(), k: int = 5,
                    batch: int = 0) -> str:
    """Text: the ``k`` most likely tokens read by the logit lens at ``depth`` (0 =
    embedding, ``l`` = after block ``l-1``) and ``position``, then the rank and probability
    of each of ``token_ids``.

    Args:
        lens: ``[L+1, B, S, V]`` from :func:`tokenflow.lens.logit_lens`.

    Raises:
        ValueError: if ``depth`` or ``position`` is out of range.
    """
    from .lens import token_rank
    from .trace import pad
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


def decode_trace_summary(config, batch_size: int, seq_len: int, num_experts: int) -> str:
    """The trace of a random-weight model of ``config`` with ``B``, ``S``, ``E`` changed
    (:func:`tokenflow.trace.trace_shapes`), tied to the diagram nodes; blocks 0 and 1 only
    (the others repeat block 1)."""
    from .diagram import diagram_trace_table
    from .trace import trace_shapes
    trace = trace_shapes(config, batch_size, seq_len, num_experts=num_experts)
    return diagram_trace_table(trace, layers=(0, 1))


def decode_trace_explorer(config, **slider_specs):
    """:func:`shape_controls` sliders (B, S, E) printing :func:`decode_trace_summary`.
    Returns an ``ipywidgets.interactive``."""
    def show(batch_size, seq_len, num_experts):
        print(decode_trace_summary(config, batch_size, seq_len, num_experts))
    return widgets.interactive(show, **shape_controls(**slider_specs))


# --------------------------------------------------------------------- chapter 05 (F5)
__all__ += ["serving_explorer"]


def serving_explorer(model, token_ids: list[int]):
    """Sliders for :func:`tokenflow.plots.serving_panel`: requests (the batch that arrives
    together), prompt length, output length, max running sequences and KV block size.
    Settings past the model's positions print the error instead. Returns an
    ``ipywidgets.interactive``."""
    from .plots import serving_panel

    def show(batch_size, prompt_len, output_len, max_num_seqs, block_size):
        import matplotlib.pyplot as plt
        try:
            serving_panel(model, token_ids, batch_size, prompt_len, output_len, max_num_seqs,
                          block_size)
        except ValueError as e:
            print(e)
            return
        plt.show()

    def s(desc, lo, hi, val):
        return widgets.IntSlider(value=val, min=lo, max=hi, description=desc,
                                 continuous_update=False)
    return widgets.interactive(
        show, batch_size=s("requests", 1, 16, 8), prompt_len=s("prompt len", 1, 64, 16),
        output_len=s("output len", 1, 64, 16), max_num_seqs=s("max seqs", 1, 16, 4),
        block_size=widgets.Dropdown(options=[1, 2, 4, 8, 16, 32], value=16,
                                    description="block size"))


__all__ += ["timeline_table", "timeline_view"]


def _timeline_rows(timelines, outputs, seconds: bool):
    """Headers and rows shared by :func:`timeline_table` and :func:`timeline_view`."""
    out = {o.request_id: o for o in outputs}
    if {r.request_id for r in timelines} - set(out):
        raise ValueError("timelines and outputs must describe the same requests")
    ms = lambda v: None if v is None else v * 1e3                      # noqa: E731
    if seconds:
        headers = ["id", "prompt", "new", "TTFT ms", "TPOT ms", "e2e ms"]
    else:
        headers = ["id", "prompt", "new", "arrives", "waits", "TTFT steps", "done at"]
    rows = []
    for r in timelines:
        o = out[r.request_id]
        head = [r.request_id, len(o.prompt_token_ids), len(o.output_token_ids)]
        rows.append(head + ([ms(o.ttft), ms(o.tpot), ms(o.e2e_latency)] if seconds else
                            [r.arrival, r.count("wait"), r.ttft_steps, r.finish_step]))
    return headers, rows


def timeline_table(timelines, outputs, seconds: bool = False) -> str:
    """One line per request of a served workload: prompt and generated tokens, then either
    step counts from its :class:`tokenflow.serving.RequestTimeline` (arrival step, steps
    waiting, time to first token in steps, last step), or, with ``seconds=True``, the
    measured TTFT, TPOT and end-to-end latency of its ``RequestOutput`` in ms (these vary
    from run to run). Plain text; :func:`timeline_view` gives the same rows as a table.

    Raises:
        ValueError: if the two lists do not hold the same request ids.
    """
    headers, rows = _timeline_rows(timelines, outputs, seconds)
    widths = [max(len(h), 4) if i else 3 for i, h in enumerate(headers)]
    cell = lambda v: "-" if v is None else f"{v:.1f}" if isinstance(v, float) else str(v)  # noqa
    return "\n".join(" ".join(f"{cell(v):>{w}}" for v, w in zip(r, widths))
                     for r in [headers] + rows)


def timeline_view(timelines, outputs, seconds: bool = False):
    """:func:`timeline_table`'s rows as a :class:`tokenflow.viz.Table` (HTML in the book),
    times in ms with 1 decimal.

    Raises:
        ValueError: if the two lists do not hold the same request ids.
    """
    from .viz import Table
    headers, rows = _timeline_rows(timelines, outputs, seconds)
    title = ("measured per request (ms; they change from run to run)" if seconds else
             "per request, in engine steps (the same on every machine)")
    return Table(rows, headers, digits=1, title=title)


__all__ += ["roofline_explorer"]


def roofline_explorer(config, **defaults):
    """Controls for :func:`tokenflow.plots.roofline_panel`: batch per device, context
    length, expert-parallel size (the divisors of ``config.num_experts`` that are powers of
    two), hardware preset and phase. ``defaults`` override the starting values (``batch``,
    ``context_len``, ``ep_size``, ``hw_name``, ``phase``). Settings the cost model refuses
    print the error instead. Returns an ``ipywidgets.interactive``."""
    from .plots import roofline_panel
    from .roofline import HARDWARE
    start = dict(batch=64, context_len=4096, ep_size=32, hw_name="H800", phase="decode")
    start.update(defaults)

    def show(batch, context_len, ep_size, hw_name, phase):
        import matplotlib.pyplot as plt
        try:
            roofline_panel(config, hw_name, phase, batch, context_len, ep_size)
        except ValueError as e:
            print(e)
            return
        plt.show()

    eps = [e for e in (2 ** i for i in range(11)) if not config.num_experts % e]
    return widgets.interactive(
        show,
        batch=widgets.SelectionSlider(options=[2 ** i for i in range(11)],
                                      value=start["batch"], description="batch",
                                      continuous_update=False),
        context_len=widgets.SelectionSlider(options=[2 ** i for i in range(7, 18)],
                                            value=start["context_len"], description="context",
                                            continuous_update=False),
        ep_size=widgets.Dropdown(options=eps, value=start["ep_size"], description="EP size"),
        hw_name=widgets.Dropdown(options=sorted(HARDWARE), value=start["hw_name"],
                                 description="hardware"),
        phase=widgets.ToggleButtons(options=["decode", "prefill"], value=start["phase"],
                                    description="phase"))


# --------------------------------------------------------------------- F8: chapters 00-02
# Tables (tokenflow.viz.Table: HTML in the book and JupyterLab, aligned text for nbval) and
# the kernel-less versions of the chapters' explorers (tokenflow.viz.precomputed_explorer).
__all__ += ["trace_table", "trace_shapes_table", "trace_shapes_static", "hidden_size_static",
            "residual_stream_table", "residual_stream_static", "attention_static",
            "kv_cache_static"]


def trace_table(trace, where: tuple[str, ...] | None = None, note: bool = True):
    """:class:`tokenflow.trace.Trace` events as a :class:`tokenflow.viz.Table`: index, action,
    where, input and output shape (no-break spaces, so a shape stays on one line), bytes and
    (``note=True``) the note. ``where`` keeps only
    events whose ``where`` is in it (e.g. ``("embedding", "LM head")``)."""
    from .viz import Table
    def shape(t):                      # no-break spaces: a shape never wraps inside a cell
        return "[" + ",\u00a0".join(str(n) for n in t) + "]"
    rows = [[i, e.action, e.where, shape(e.in_shape), shape(e.out_shape), e.nbytes]
            + ([e.note] if note else [])
            for i, e in enumerate(trace.events) if where is None or e.where in where]
    headers = ["#", "action", "where", "in shape", "out shape", "bytes"] + (["note"] if note else [])
    return Table(rows, headers)


TRACE_SHAPES_WHERE = ("embedding", "layer 1 attention", "layer 1 MoE", "LM head")


def trace_shapes_table(config, batch_size: int, seq_len: int, num_experts: int):
    """The rows of :func:`tokenflow.trace.trace_shapes` (random weights, only the shapes mean
    anything) for the embedding, the first MoE block and the LM head, as a
    :class:`tokenflow.viz.Table`. Raises as ``trace_shapes``."""
    from .trace import trace_shapes
    t = trace_shapes(config, batch_size, seq_len, num_experts=num_experts)
    return trace_table(t, where=TRACE_SHAPES_WHERE)


def trace_shapes_static(config, batch=(1, 2, 8), seq_len=(1, 5, 64), experts=(2, 8, 32),
                        default=None):
    """Kernel-less explorer of :func:`trace_shapes_table` over the given values of ``B``,
    ``S`` and ``E`` (:func:`tokenflow.viz.precomputed_explorer`; at most 48 combinations)."""
    from .viz import precomputed_explorer
    return precomputed_explorer(
        lambda B, S, E: trace_shapes_table(config, B, S, E),
        {"B": list(batch), "S": list(seq_len), "E": list(experts)},
        default=default, title="trace shapes for batch B, sequence length S, experts E")


def hidden_size_static(hidden_size: int, vocab_size: int, batch=(1, 4, 8, 16),
                       seq_len=(1, 512, 4096, 8192), default=None):
    """Kernel-less explorer of :func:`size_table` of :func:`hidden_state_sizes` over the
    given ``B`` and ``S`` values, for fixed ``H`` and ``V``."""
    from .viz import precomputed_explorer
    return precomputed_explorer(
        lambda B, S: size_table(hidden_state_sizes(B, S, hidden_size, vocab_size)),
        {"B": list(batch), "S": list(seq_len)}, default=default,
        title=f"tensor sizes for H = {hidden_size:,}, V = {vocab_size:,}")


def residual_stream_table(hidden_states, token_index: int, tokens: list[str],
                          n_features: int = 4):
    """One token's hidden state at every depth as a :class:`tokenflow.viz.Table`: its first
    ``n_features`` values, its RMS and the RMS of what the block before it added (the same
    numbers as :func:`residual_stream_summary`, 3 decimals).

    Raises:
        ValueError: if ``token_index`` is out of range.
    """
    from .viz import Table
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


def residual_stream_static(hidden_states, tokens: list[str], token_index: int = -1):
    """Kernel-less explorer of :func:`tokenflow.plots.residual_stream_plot` with a token
    selector: one figure per token (every depth is a row of each figure), starting at
    ``token_index``. Figures are inline SVG."""
    from .plots import residual_stream_plot
    from .viz import precomputed_explorer
    options = [f"{i} {t}" for i, t in enumerate(tokens)]
    return precomputed_explorer(
        lambda token: residual_stream_plot(hidden_states, options.index(token), tokens),
        {"token": options}, default={"token": options[token_index]}, kind="svg")


def attention_static(attention_weights: dict, q_labels: list[str], k_labels: list[str],
                     batch_index: int = 0, default: dict | None = None):
    """Kernel-less explorer of :func:`tokenflow.plots.attention_head_heatmap` over every
    layer and head of ``{layer: [B, n_heads, S_q, S_k]}`` weights (``default``: the
    ``layer`` / ``head`` shown first). Figures are inline SVG (half the bytes of PNG here)."""
    from .plots import attention_head_heatmap
    from .viz import precomputed_explorer
    layers = sorted(attention_weights)
    nh = attention_weights[layers[0]].shape[1]
    return precomputed_explorer(
        lambda layer, head: attention_head_heatmap(attention_weights[layer][batch_index, head],
                                                   q_labels, k_labels,
                                                   title=f"layer {layer}, head {head}"),
        {"layer": layers, "head": list(range(nh))}, default=default, kind="svg")


def kv_cache_static(config, seq_len=(1, 16, 64, 128), batch_size: int = 1,
                    dtype_name: str = "bf16"):
    """Kernel-less explorer of :func:`kv_cache_summary` over sequence lengths and every
    K/V-head count that divides the query heads (MQA ... MHA)."""
    from .viz import precomputed_explorer
    divisors = [d for d in range(1, config.num_attention_heads + 1)
                if config.num_attention_heads % d == 0]
    return precomputed_explorer(
        lambda S, kv_heads: kv_cache_summary(config, batch_size, S, kv_heads, dtype_name),
        {"S": list(seq_len), "kv_heads": divisors},
        default={"S": seq_len[-1], "kv_heads": config.num_key_value_heads},
        title=f"{config.name}: KV cache for sequence length S and K/V heads ({dtype_name})")


# --------------------------------------------------------------------- [F8] without a kernel
# The static book cannot run the live explorers above. Each ``*_static`` function computes its
# explorer's outputs over a small grid now and returns a
# :func:`tokenflow.viz.precomputed_explorer`, whose controls switch between them in the browser.
__all__ += ["prob_text", "moe_routing_static", "sampling_static", "logit_lens_static",
            "decode_trace_static"]


def prob_text(p: float) -> str:
    """A probability with the digits that matter: 4 decimals from 0.001 up (``0.4892``),
    scientific below (``3.8e-05``), ``0`` for exactly zero.

    Raises:
        ValueError: if ``p`` is not in [0, 1].
    """
    p = float(p)
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"p must be a probability in [0, 1], got {p!r}")
    return "0" if p == 0 else f"{p:.4f}" if p >= 1e-3 else f"{p:.1e}"


def moe_routing_static(num_experts=(8, 64, 256), top_k=(2, 6), world_size=(2, 8),
                       batch_size: int = 4, seq_len: int = 64, hidden_size: int = 7168,
                       bytes_per_element: float = 2, capacity_factor: float = 1.25):
    """:func:`moe_routing_explorer` without a kernel: :func:`tokenflow.plots.routing_load_plot`
    of :func:`tokenflow.expert_parallel.simulate_routing` for every ``(E, K, W)`` of the
    grid (``B x S`` random tokens), titled with the tokens dropped at ``capacity_factor`` and
    the all-to-all bytes at ``hidden_size`` / ``bytes_per_element``.

    Raises:
        ValueError: as :func:`tokenflow.viz.precomputed_explorer` (grid too large), or
            :func:`simulate_routing` (a ``W`` that does not divide an ``E``).
    """
    from .expert_parallel import simulate_routing
    from .plots import routing_load_plot
    from .viz import format_bytes, precomputed_explorer

    def show(**kw):
        E, K, W = kw["experts E"], kw["top-k K"], kw["EP ranks W"]
        r = simulate_routing(E, K, batch_size, seq_len, world_size=W, hidden_size=hidden_size,
                             bytes_per_element=bytes_per_element,
                             capacity_factor=capacity_factor)
        return routing_load_plot(r, title=(
            f"E={E}, K={K}, {r['tokens']} tokens on W={W}: {r['dropped']} pairs over capacity, "
            f"{format_bytes(r['dispatch_bytes'])} dispatched"))
    return precomputed_explorer(
        show, {"experts E": list(num_experts), "top-k K": list(top_k),
               "EP ranks W": list(world_size)},
        title=f"B x S = {batch_size} x {seq_len} random tokens, H = {hidden_size}, "
              f"{bytes_per_element} B/element",
        default={"experts E": 64, "top-k K": 6, "EP ranks W": 8})


def sampling_static(logits, tokenizer, temperature=(0.5, 1.0, 2.0), top_k=(3, 50),
                    top_p=(0.7, 1.0), min_p=(0.0, 0.1), n: int = 12, seed: int = 0):
    """:func:`sampling_explorer` without a kernel: :func:`tokenflow.plots.sampling_panel`
    (quiet: the kept count and the drawn token go in the title) for every combination of the
    given values. Shown first: the temperature closest to 1 with the loosest filters.

    Raises:
        ValueError: as :func:`tokenflow.viz.precomputed_explorer` or
            :func:`tokenflow.sampling.filter_logits`.
    """
    from .plots import sampling_panel
    from .viz import precomputed_explorer

    def show(**kw):
        return sampling_panel(logits, tokenizer, kw["temperature"], kw["top-k"], kw["top-p"],
                              kw["min-p"], n=n, seed=seed, quiet=True)
    return precomputed_explorer(
        show, {"temperature": list(temperature), "top-k": list(top_k), "top-p": list(top_p),
               "min-p": list(min_p)},
        title=f"the {n} most likely tokens; drawn with seed {seed}",
        default={"temperature": min(temperature, key=lambda t: abs(t - 1.0)),
                 "top-k": max(top_k), "top-p": max(top_p), "min-p": min(min_p)})


def logit_lens_static(lens, tokenizer, tokens: list[str], token_ids=(), k: int = 5):
    """:func:`logit_lens_explorer` without a kernel: :func:`logit_lens_topk` for every depth
    and position of ``lens [L+1, B, S, V]`` (batch row 0). Shows the last depth and position
    first."""
    from .viz import precomputed_explorer
    n_depth = lens.shape[0]
    names = [f"{i} {t}" for i, t in enumerate(tokens)]

    def show(**kw):
        return logit_lens_topk(lens, tokenizer, kw["depth"], names.index(kw["position"]),
                               token_ids, k=k)
    return precomputed_explorer(show, {"depth": list(range(n_depth)), "position": names},
                                title="logit lens: top tokens at one depth and position",
                                default={"depth": n_depth - 1, "position": names[-1]})


def decode_trace_static(config, batch_size=(1, 2, 4, 8), seq_len=(1, 8, 32),
                        num_experts=(4, 8, 16)):
    """:func:`decode_trace_explorer` without a kernel: :func:`decode_trace_summary` for every
    ``(B, S, E)`` of the grid (random weights: only the shapes mean anything)."""
    from .viz import precomputed_explorer

    def show(**kw):
        return decode_trace_summary(config, kw["batch B"], kw["seq len S"], kw["experts E"])
    return precomputed_explorer(
        show, {"batch B": list(batch_size), "seq len S": list(seq_len),
               "experts E": list(num_experts)},
        title="trace of a random-weight model, blocks 0 and 1",
        default={"batch B": batch_size[0], "seq len S": seq_len[min(1, len(seq_len) - 1)],
                 "experts E": num_experts[min(1, len(num_experts) - 1)]})


# --------------------------------------------------------------------- F8: chapters 05, 07, 08
__all__ += ["serving_summary_table", "serving_static", "roofline_table", "roofline_static",
            "kv_per_token_view"]


def serving_summary_table(counts: dict):
    """The counts of :func:`tokenflow.plots.serving_counts` as a two-column
    :class:`tokenflow.viz.Table` (what a served batch took: steps, decode rows, KV blocks)."""
    from .viz import Table
    c = counts
    rows = [("engine steps", c["steps"]), ("steps with a prefill", c["prefill_steps"]),
            ("decode rows per step, mean", round(c["mean_rows"], 2)),
            ("decode rows per step, max", c["max_rows"]),
            ("KV blocks per request", c["blocks_per_request"]),
            ("slots per request (unused)", f"{c['slots_per_request']} ({c['unused_slots']})"),
            ("blocks in the pool", c["pool_blocks"]),
            ("blocks in use at the busiest step", c["peak_blocks"])]
    return Table(rows, ["", "count"], align="<>",
                 title=f"{c['batch_size']} requests x ({c['prompt_len']} prompt + "
                       f"{c['output_len']} new tokens), seats: {c['max_num_seqs']}, "
                       f"block size {c['block_size']}")


def serving_static(model, token_ids: list[int], requests=(4, 8, 16), max_num_seqs=(1, 2, 4, 8),
                   block_size=(4, 16), prompt_len: int = 16, output_len: int = 16,
                   default: dict | None = None):
    """Kernel-less explorer of :func:`serving_summary_table` over the number of requests
    (arriving together), the seats (``max_num_seqs``) and the KV block size, for fixed
    prompt and output lengths (:func:`tokenflow.viz.precomputed_explorer`; tables, not
    figures, to keep the page small). Raises as :func:`tokenflow.plots.serving_counts`."""
    from .plots import serving_counts
    from .viz import precomputed_explorer
    return precomputed_explorer(
        lambda requests, seats, block: serving_summary_table(serving_counts(
            model, token_ids, requests, prompt_len, output_len, seats, block)),
        {"requests": list(requests), "seats": list(max_num_seqs), "block": list(block_size)},
        default=default, title=f"serving: {prompt_len}-token prompts + {output_len} new tokens")


def roofline_table(summary: dict):
    """A :func:`tokenflow.plots.roofline_summary` as a :class:`tokenflow.viz.Table`: the three
    times (ms), which bounds the step, tokens/s per device, and the memory it needs."""
    from .viz import Table
    r = summary
    gb = r["memory_needed"] / 1e9
    rows = [("compute", r["compute_s"] * 1e3), ("memory", r["memory_s"] * 1e3),
            ("communication", r["comm_s"] * 1e3)]
    rows = [(n, ms, "<- bound" if n.startswith(r["bound"]) else "") for n, ms in rows]
    rows += [("tokens/s per device", round(r["tokens_per_s"]), ""),
             ("weights + KV (GB)", round(gb, 1),
              f"of {r['hw'].memory_bytes / 1e9:.0f}" + ("" if r["fits"] else ": does not fit"))]
    return Table(rows, ["", "ms per step", ""], align="<><", digits=2,
                 title=f"{r['config'].name} on {r['hw'].name}, {r['phase']}, batch "
                       f"{r['batch']}, context {r['context_len']:,}, EP{r['ep_size']}, "
                       f"{r['dtype']}")


def roofline_static(config, hw_names=("H800", "H200"), batch=(1, 8, 64, 256),
                    ep_size=(8, 32, 256), context_len: int = 4096, phase: str = "decode",
                    default: dict | None = None, **kw):
    """Kernel-less explorer of :func:`roofline_table` over hardware presets, batch per device
    and expert-parallel size, at one context length and phase (``kw``: the other arguments
    of :func:`tokenflow.plots.roofline_summary`). Raises as ``roofline_summary``."""
    from .plots import roofline_summary
    from .viz import precomputed_explorer
    return precomputed_explorer(
        lambda hardware, batch, EP: roofline_table(roofline_summary(
            config, hardware, phase, batch, context_len, EP, **kw)),
        {"hardware": list(hw_names), "batch": list(batch), "EP": list(ep_size)},
        default=default, title=f"{config.name}, {phase}, context {context_len:,}: one step "
                               f"on one GPU")


def kv_per_token_view(layouts: list, contexts: list, bytes_per_element: float = 2):
    """:func:`tokenflow.attention_kinds.kv_per_token_rows` as a :class:`tokenflow.viz.Table`:
    one row per cache layout, average bytes per token of one sequence at each context."""
    from .attention_kinds import kv_per_token_rows
    from .viz import Table
    return Table(kv_per_token_rows(layouts, contexts, bytes_per_element),
                 ["layout"] + [f"{n:,} tok" for n in contexts],
                 title=f"average cache bytes per token of one sequence "
                       f"({bytes_per_element:g} bytes per element; * = what-if variant)")
