"""Trace events as tables: the rows a :class:`tokenflow.analysis.trace.Trace` recorded, the
shapes of one traced pass at any B, S, E, and the decode-step trace explorer (chapters 00, 06).

Part of :mod:`tokenflow.viz`, the only package that draws; nothing below it imports it.
"""
from __future__ import annotations

import textwrap

from .lang import tr


_IMPORTED = set(globals())          # the names above are imported, not defined here


def decode_trace_summary(config, batch_size: int, seq_len: int, num_experts: int,
                         router: bool = False) -> str:
    """The trace of a random-weight model of ``config`` with ``B``, ``S``, ``E`` changed
    (:func:`tokenflow.analysis.trace.trace_shapes`), tied to the diagram nodes; blocks 0 and 1 only
    (the others repeat block 1). With ``router``, a first line says what ``E`` changes (no
    traced shape holds it: :func:`router_sentence`)."""
    from tokenflow.analysis.trace import trace_shapes

    from .diagram import diagram_trace_table
    trace = trace_shapes(config, batch_size, seq_len, num_experts=num_experts)
    route = next(e for e in trace.events if e.action == "route top-k")
    head = (textwrap.fill(tr(router_sentence(batch_size * seq_len, route.out_shape[-1],
                                             num_experts)), 90) + "\n" if router else "")
    return head + diagram_trace_table(trace, layers=(0, 1))


def router_sentence(tokens: int, top_k: int, num_experts: int) -> str:
    """What the expert count ``E`` changes in one pass of ``tokens`` (``B*S``) tokens that
    each keep ``top_k`` experts: the router's score matrix ``[B*S, E]`` and the (token, expert)
    pairs each expert gets on average, ``B*S*K / E``."""
    return (f"E = {num_experts}: the router scores [{tokens}, {num_experts}] (B*S = {tokens} "
            f"tokens x {num_experts} experts) and keeps K = {top_k}; each expert gets "
            f"{tokens * top_k / num_experts:g} (token, expert) pairs on average")


def trace_table(trace, where: tuple[str, ...] | None = None, note: bool = True):
    """:class:`tokenflow.analysis.trace.Trace` events as a :class:`tokenflow.viz.Table`: index,
    action, where, input and output shape (no-break spaces, so a shape stays on one line), bytes
    and (``note=True``) the note. ``where`` keeps only
    events whose ``where`` is in it (e.g. ``("embedding", "LM head")``)."""
    from .fmt import Table
    def shape(t):                      # no-break spaces: a shape never wraps inside a cell
        return "[" + ",\u00a0".join(str(n) for n in t) + "]"
    rows = [[i, e.action, e.where, shape(e.in_shape), shape(e.out_shape), e.nbytes]
            + ([e.note] if note else [])
            for i, e in enumerate(trace.events) if where is None or e.where in where]
    headers = (["#", "action", "where", "in shape", "out shape", "bytes"]
               + (["note"] if note else []))
    return Table(rows, headers)


TRACE_SHAPES_WHERE = ("embedding", "layer 1 attention", "layer 1 MoE", "LM head")


def trace_shapes_table(config, batch_size: int, seq_len: int, num_experts: int):
    """The rows of :func:`tokenflow.analysis.trace.trace_shapes` (random weights, only the shapes
    mean anything) for the embedding, the first MoE block and the LM head, as a
    :class:`tokenflow.viz.Table`. Raises as ``trace_shapes``."""
    from tokenflow.analysis.trace import trace_shapes
    t = trace_shapes(config, batch_size, seq_len, num_experts=num_experts)
    return trace_table(t, where=TRACE_SHAPES_WHERE)


def trace_shapes_view(config, batch_size: int, seq_len: int, num_experts: int):
    """:func:`trace_shapes_table` titled with what ``E`` changes, where it shows at any width:
    the router's score matrix ``[B*S, E]`` and the (token, expert) pairs each expert gets on
    average, ``B*S*K / E``. Raises as :func:`tokenflow.analysis.trace.trace_shapes`."""
    t = trace_shapes_table(config, batch_size, seq_len, num_experts)
    route = next(r for r in t.rows if r[1] == "route top-k")
    K = int(route[4].strip("[]").split(",")[-1])
    t.title = tr(router_sentence(batch_size * seq_len, K, num_experts))
    return t


def trace_shapes_explorer(config, batch=(1, 2, 8), seq_len=(1, 5, 64), experts=(2, 8, 32),
                          default=None, live: bool = True):
    """:func:`trace_shapes_view` for one ``B``, ``S`` and ``E`` of the given values, through
    :func:`tokenflow.viz.explore` (precomputed: at most 48 combinations); starts at B=2, S=5,
    E=8 where the grid has them."""
    from .static import default_in, explore
    controls = {"B": list(batch), "S": list(seq_len), "E": list(experts)}
    return explore(
        lambda B, S, E: trace_shapes_view(config, B, S, E), controls, live=live,
        default=default or default_in(controls, {"B": 2, "S": 5, "E": 8}),
        title="trace shapes for batch B, sequence length S, experts E", live_below=True)


def trace_shapes_static(*args, **kw):
    """:func:`trace_shapes_explorer` precomputed (``live=False``): works without a kernel."""
    return trace_shapes_explorer(*args, live=False, **kw)


def decode_trace_explorer(config, batch_size=(1, 2, 4, 8), seq_len=(1, 8, 32),
                          num_experts=(4, 8, 16), live: bool = True):
    """:func:`decode_trace_summary` (with its router line: ``E`` changes no traced shape) for
    one ``(B, S, E)`` of the given values (random weights: only the shapes mean anything),
    through :func:`tokenflow.viz.explore`."""
    from .static import explore

    def show(**kw):
        return decode_trace_summary(config, kw["batch B"], kw["seq len S"], kw["experts E"],
                                    router=True)
    return explore(
        show, {"batch B": list(batch_size), "seq len S": list(seq_len),
               "experts E": list(num_experts)}, live=live,
        title="trace of a random-weight model, blocks 0 and 1",
        default={"batch B": batch_size[0], "seq len S": seq_len[min(1, len(seq_len) - 1)],
                 "experts E": num_experts[min(1, len(num_experts) - 1)]}, live_below=True)


def decode_trace_static(*args, **kw):
    """:func:`decode_trace_explorer` precomputed (``live=False``): works without a kernel."""
    return decode_trace_explorer(*args, live=False, **kw)


WEIGHT_PARTS = {"embedding": ("embedding",), "attention": ("attention", "norms"),
                "dense FFN": ("dense_ffn",), "MoE router": ("router",),
                "MoE experts": ("routed_experts", "shared_experts"), "LM head": ("lm_head",)}
"""Diagram node -> the :func:`tokenflow.analysis.costmodel.param_breakdown` parts whose
weights it reads (the norms are counted with attention); together they cover every part."""


def step_bytes_table(trace, config, bytes_per_element: float = 4):
    """Per diagram node of one traced pass: trace rows, activation bytes produced (the sum of
    the events' ``nbytes``) and weight bytes read, from
    :func:`tokenflow.analysis.costmodel.forward_weight_bytes` for the pass's tokens (the
    lookup's ``B*S``; in MoE layers the experts those tokens are expected to touch), split by
    :data:`WEIGHT_PARTS`. Returns a :class:`tokenflow.viz.Table`.

    Raises:
        ValueError: a trace without a ``lookup`` event.
    """
    import math

    from tokenflow.analysis.costmodel import forward_weight_bytes

    from .diagram import load_diagram, node_of
    from .fmt import Table
    lookup = next((e for e in trace.events if e.action == "lookup"), None)
    if lookup is None:
        raise ValueError("trace must contain a 'lookup' event (a whole forward pass)")
    d = load_diagram()
    per_node = {}
    for e in trace.events:
        name = d.name(node_of(e))
        rows, nbytes = per_node.get(name, (0, 0))
        per_node[name] = (rows + 1, nbytes + e.nbytes)
    *B, S = lookup.in_shape                                  # token ids [B, S]
    w = forward_weight_bytes(config, batch=math.prod(B), new_tokens=S,
                             bytes_per_element=bytes_per_element)
    return Table([(name, rows, nbytes, sum(w[k] for k in WEIGHT_PARTS.get(name, ())))
                  for name, (rows, nbytes) in per_node.items()],
                 ["diagram node", "rows", "bytes produced", "weight bytes read"], digits=0)


# what this module defines (every public name after the imports)
__all__ = [n for n in globals() if not n.startswith("_") and n not in _IMPORTED]
