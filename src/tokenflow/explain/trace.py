"""Record the arrow actions of one forward pass: what happened, to which shapes.

Chapter 0 names six arrow actions; the trace records each where the code performs it:

========================  ==========================================  ==========
action                    where                                       colour
========================  ==========================================  ==========
``lookup``                embedding: ids ``[B,S] -> [B,S,H]``         blue
``write KV`` / ``read KV``  attention of every block                  blue
``route top-k``           MoE router of every MoE block               yellow
``dispatch/combine``      MoE experts of every MoE block              yellow
``FFN``                   dense feed-forward blocks                   blue
``project vocab``         LM head ``[B,S,H] -> [B,S,V]``              blue
``sample``                sampling ``[B,V] -> [B]``                   green
========================  ==========================================  ==========

Pass ``Trace()`` as ``trace=`` to the model (or to ``generate``); it records data only:
:func:`tokenflow.viz.trace_table` shows the events as a table. It records through forward
hooks (:meth:`Trace.attach`: on the embedding, each block's attention and MLP, each block, the
LM head), so the model's forward has no trace code and computes the same numbers traced or
not; ``model(ids, trace=t)`` attaches them for that call.
With ``keep_tensors=True`` it also keeps (detached) tensors that the chapters plot:
``hidden_states`` (the residual stream after the embedding and after each block),
``attention_weights`` (per layer ``[B, n_heads, S_q, S_k]``), ``router`` (per MoE layer,
indices and weights ``[T, K]``).
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import torch

from tokenflow.model.attention import Attention
from tokenflow.model.moe import MoE
from tokenflow.validate import integer
from .attention import attention_steps

__all__ = ["Trace", "TraceEvent", "COLORS", "ARROW_ACTIONS", "trace_shapes"]

COLORS = {"hidden": "#3b7dd8", "moe": "#e0b000", "token": "#2e9e44"}
"""The book's colour code: blue = hidden-state flow, yellow = MoE, green = generated token."""

ARROW_ACTIONS = ("lookup", "read KV", "write KV", "route top-k", "project vocab", "sample")
"""The actions a trace records that are written on an arrow of the token-flow diagram
(data/token_flow.mmd), in the order of a forward pass: the book's *arrow actions*. The other
recorded actions, ``FFN`` and ``dispatch/combine``, are work inside a box."""

_ACTION_COLOR = {"lookup": "hidden", "write KV": "hidden", "read KV": "hidden",
                 "FFN": "hidden", "route top-k": "moe", "dispatch/combine": "moe",
                 "project vocab": "hidden", "sample": "token"}


def _shape(x) -> tuple:
    return tuple(x.shape) if isinstance(x, torch.Tensor) else tuple(x)


@dataclass
class TraceEvent:
    """One arrow action.

    Attributes:
        action: one of ``lookup``, ``write KV``, ``read KV``, ``route top-k``,
            ``dispatch/combine``, ``FFN``, ``project vocab``, ``sample``.
        where: the module that did it, e.g. ``"layer 1 attention"``.
        in_shape, out_shape: tensor shapes (tuples of ints).
        nbytes: bytes of the output tensor (or of the KV read, for ``read KV``).
        note: a short human explanation (e.g. ``"[B,S] -> [B,S,H]"``).
    """

    action: str
    where: str
    in_shape: tuple
    out_shape: tuple
    nbytes: int = 0
    note: str = ""

    @property
    def color(self) -> str:
        """The colour-code group of the action: ``hidden``, ``moe`` or ``token``."""
        return _ACTION_COLOR.get(self.action, "hidden")


@dataclass
class Trace:
    """Collects :class:`TraceEvent` rows (and optionally tensors) during forward passes.

    Args:
        keep_tensors: also keep hidden states, attention weights and router choices
            (costs memory; meant for the tiny model).
    """

    keep_tensors: bool = False
    events: list[TraceEvent] = field(default_factory=list)
    hidden_states: list[torch.Tensor] = field(default_factory=list)
    attention_weights: dict[int, torch.Tensor] = field(default_factory=dict)
    router: dict[int, dict[str, torch.Tensor]] = field(default_factory=dict)

    def record(self, action: str, where: str, inp, out, nbytes: int | None = None,
               note: str = "") -> None:
        """Append one event; ``inp``/``out`` are tensors or shapes."""
        if nbytes is None:
            nbytes = out.nbytes if isinstance(out, torch.Tensor) else 0
        self.events.append(TraceEvent(action, where, _shape(inp), _shape(out), int(nbytes), note))

    def actions(self) -> list[str]:
        """The action names in order."""
        return [e.action for e in self.events]

    def clear(self) -> None:
        """Forget all events and tensors."""
        self.events.clear()
        self.hidden_states.clear()
        self.attention_weights.clear()
        self.router.clear()

    def __repr__(self) -> str:
        actions = ", ".join(dict.fromkeys(self.actions()))
        return f"Trace({len(self.events)} events: {actions})"

    @contextlib.contextmanager
    def attach(self, module):
        """Record the forward passes of ``module`` while the ``with`` block runs.

        ``module`` is a :class:`~tokenflow.model.transformer.TokenFlowModel` (hooks on
        ``embed_tokens``, every block's ``self_attn`` and ``mlp``, every block for the
        residual stream, and ``lm_head``) or a single attention, MoE or FFN module. The hooks
        only read: they recompute what an event reports (the router's choices, the attention
        weights with ``keep_tensors``) from the module's inputs, and never change its output.
        """
        handles = [m.register_forward_hook(hook, with_kwargs=True)
                   for m, hook in _hooks(self, module)]
        try:
            yield self
        finally:
            for h in handles:
                h.remove()


def _hooks(trace: Trace, module) -> list:
    """(module, hook) pairs that record ``module``'s arrow actions into ``trace``."""
    if not hasattr(module, "layers"):                   # one attention / MoE / FFN module
        return [(module, _block_part_hook(trace, module, getattr(module, "layer_idx", 0)))]
    c = module.config
    out = [(module.embed_tokens, lambda m, args, kw, h: _lookup(trace, c, args[0], h))]
    for i, layer in enumerate(module.layers):
        out += [(layer.self_attn, _block_part_hook(trace, layer.self_attn, i)),
                (layer.mlp, _block_part_hook(trace, layer.mlp, i)),
                (layer, lambda m, args, kw, h: _keep_hidden(trace, h))]
    out.append((module.lm_head, lambda m, args, kw, logits: trace.record(
        "project vocab", "LM head", args[0], logits,
        note=f"[B, 1, H] -> [B, 1, V]: one score per vocabulary entry ({c.vocab_size:,})")))
    return out


def _lookup(trace: Trace, c, input_ids, h) -> None:
    trace.record("lookup", "embedding", input_ids, h,
                 note=f"[B,S] -> [B,S,H]: row id of table [{c.vocab_size}, {c.hidden_size}]")
    _keep_hidden(trace, h)


def _keep_hidden(trace: Trace, h) -> None:
    if trace.keep_tensors:
        trace.hidden_states.append(h.detach())


def _block_part_hook(trace: Trace, module, layer_idx: int):
    """The forward hook of one block's attention (GQA or MLA), MoE or dense FFN."""
    if isinstance(module, Attention):
        record = _record_attention
    elif isinstance(module, MoE):
        record = _record_moe
    elif hasattr(module, "kv_b_proj"):                   # MLAttention
        record = _record_mla
    else:
        record = _record_ffn

    def hook(m, args, kwargs, out):
        with torch.no_grad():
            record(trace, m, layer_idx, _bind(m, args, kwargs), out)
    return hook


def _bind(module, args, kwargs) -> dict:
    """The forward's arguments by name (defaults filled in)."""
    import inspect
    b = inspect.signature(module.forward).bind(*args, **kwargs)
    b.apply_defaults()
    return b.arguments


def _record_attention(trace: Trace, attn, i: int, a: dict, out) -> None:
    x, step, cache = a["x"], a["step"], a["kv_cache"]
    B, S, _ = x.shape
    nh, nkv, D = attn.n_heads, attn.n_kv, attn.head_dim
    L, where, size = step.mask.shape[-1], f"layer {i} attention", x.element_size()
    if cache is not None:
        trace.record("write KV", where, x, (B, nkv, S, D), nbytes=2 * B * nkv * S * D * size,
                     note=f"K,V of {S} new token{'s' * (S != 1)} -> cache slots "
                          f"{step.start}..{step.start + S - 1}")
    trace.record("read KV", where, (B, nh, S, D), out, nbytes=2 * B * nkv * L * D * size,
                 note=f"Q [B,{nh},{S},{D}] reads K/V {[B, nkv, L, D]} "
                      f"({L} position{'s' * (L != 1)})")
    if trace.keep_tensors:                 # the step-by-step twin's weights (tested equal)
        steps = attention_steps(attn, x, a["cos"], a["sin"], step.mask, cache, step.start)
        trace.attention_weights[i] = steps["weights"].detach()


def _record_mla(trace: Trace, attn, i: int, a: dict, out) -> None:
    x, step, cache = a["x"], a["step"], a["kv_cache"]
    B, S, _ = x.shape
    L, where = step.mask.shape[-1], f"layer {i} attention (MLA)"
    latent, k_rope = attn.latent(x, a["cos"], a["sin"])          # this step's new entries
    if cache is not None:
        trace.record("write KV", where, x, latent,
                     nbytes=latent.element_size() * S * (attn.r + attn.dr) * B,
                     note=f"latent + RoPE key of {S} new token(s) -> cache slots "
                          f"{step.start}..{step.start + S - 1}")
        latent, k_rope = cache.read(attn.layer_idx, L)           # [B, 1, L, r], [B, 1, L, dr]
    absorb = attn.absorb if attn.absorb is not None else S == 1
    q_nope, q_rope = attn.query(x, a["cos"], a["sin"])
    trace.record("read KV", where, q_nope, out, nbytes=latent.nbytes + k_rope.nbytes,
                 note=f"{'absorbed' if absorb else 'naive'} form reads latent "
                      f"{list(latent.shape)} + RoPE key {list(k_rope.shape)}")
    if trace.keep_tensors:
        weights = attn.attend(q_nope, q_rope, latent, k_rope, step.mask, True)[1]
        trace.attention_weights[i] = weights.detach()


def _record_moe(trace: Trace, moe, i: int, a: dict, out) -> None:
    x = a["x"]
    flat = x.reshape(-1, x.shape[-1])                                     # [T, H]
    indices, weights, logits = moe.gate(flat)                             # the same choices
    where, K = f"layer {i} MoE", indices.shape[1]
    trace.record("route top-k", where, flat, indices,
                 note=f"{K} of {moe.num_experts} experts per token")
    trace.record("dispatch/combine", where, flat, out,
                 note=f"{flat.shape[0] * K} (token, expert) pairs, weighted sum back")
    if trace.keep_tensors:
        trace.router[i] = {"indices": indices.detach(), "weights": weights.detach(),
                           "logits": logits.detach()}


def _record_ffn(trace: Trace, ffn, i: int, a: dict, out) -> None:
    act = ffn.hidden_act
    trace.record("FFN", f"layer {i} FFN", a["x"], out,
                 note="dense SwiGLU" if act == "silu" else f"dense gated FFN ({act})")


def trace_shapes(config, batch_size: int, seq_len: int, num_experts: int | None = None,
                 num_experts_per_tok: int | None = None, seed: int = 0) -> Trace:
    """Trace one prefill of random token ids through an untrained model of ``config``
    (optionally with another expert count), to watch the shapes change with ``B``, ``S``
    and ``E``. Weights are random: only the shapes mean anything.

    Args:
        config: a :class:`~tokenflow.config.ModelConfig` (e.g. ``model.config``).
        batch_size: B >= 1. seq_len: S in ``[1, max_position_embeddings]``.
        num_experts: E (>= 1) to use instead of ``config.num_experts``.
        num_experts_per_tok: K, default ``min(config.num_experts_per_tok, E)``.

    Returns:
        the :class:`Trace` of the forward pass (with a KV cache of capacity ``S``).

    Raises:
        ValueError: on out-of-range ``batch_size``, ``seq_len`` or expert counts.
    """
    from tokenflow.model.kv_cache import KVCache
    from tokenflow.model.transformer import TokenFlowModel
    integer("batch_size", batch_size, 1)
    integer("seq_len", seq_len, 1, config.max_position_embeddings,
            hi_name="max_position_embeddings")
    changes = {}
    if num_experts is not None:
        integer("num_experts", num_experts, 1)
        changes["num_experts"] = num_experts
        changes["num_experts_per_tok"] = min(config.num_experts_per_tok or 1, num_experts)
        changes["n_group"], changes["topk_group"] = 1, 1
    if num_experts_per_tok is not None:
        changes["num_experts_per_tok"] = num_experts_per_tok
    cfg = config.replace(**changes) if changes else config
    torch.manual_seed(seed)
    model = TokenFlowModel(cfg).eval()
    ids = torch.randint(0, cfg.vocab_size, (batch_size, seq_len))
    trace = Trace()
    with torch.inference_mode():
        model(ids, kv_cache=KVCache(cfg, batch_size, seq_len), trace=trace)
    return trace
