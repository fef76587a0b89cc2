"""Attention step by step: the computation of the model's attention, one named tensor per step.

:func:`attention_steps` is the twin of :meth:`tokenflow.model.attention.Attention.forward`
written out for chapter 02 (projections, RoPE, past + new K/V, scores, mask, softmax, heads);
the tests prove its output equal to the module's. :func:`trace_attention_step` runs an
ordinary forward pass and keeps those tensors for one block, through forward pre-hooks.
"""
from __future__ import annotations

import inspect
import math

import torch

from tokenflow.model.attention import Attention
from tokenflow.model.rope import apply_rope
from tokenflow.validate import index, integer

__all__ = ["attention_steps", "trace_attention_step"]


def attention_steps(attn: Attention, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                    mask: torch.Tensor, kv_cache=None, start: int = 0) -> dict[str, torch.Tensor]:
    """The computation of :meth:`~tokenflow.model.attention.Attention.forward`, one named
    tensor per step.

    Uses the module's own projections (``attn.q_proj``, ``k_proj``, ``v_proj``, ``o_proj``)
    and :func:`~tokenflow.model.rope.apply_rope`; the result ``"out"`` equals the module's
    forward with a :class:`~tokenflow.model.kv_cache.CacheStep` of this ``mask`` and
    ``start`` (tested). Unlike the module it does **not** write the cache: it reads the past
    slots ``[0, start)`` of layer ``attn.layer_idx`` and appends the new K/V in a copy, so it
    can be called before (or instead of) the real forward without changing the cache.

    Args:
        attn: an :class:`Attention` module (e.g. ``model.layers[i].self_attn``).
        x: ``[B,S,H]`` normalised hidden states of the new tokens (``input_layernorm(h)``).
        cos, sin: ``[B,1,S,D]`` RoPE tables for their positions.
        mask: ``[B,1,S,L]`` bool, ``L = start + S``
            (:func:`~tokenflow.model.kv_cache.attention_mask_for`).
        kv_cache: a cache storage holding at least ``start`` filled slots (read through its
            ``read``), or ``None`` (then ``start`` must be 0: attend within ``x`` only).
        start: cache slot of the first new token (= number of past slots read).

    Returns:
        dict of tensors (``nh`` query heads, ``nkv`` K/V heads, ``D`` head_dim,
        ``P = start`` past slots, ``L = P + S``):
        ``x [B,S,H]``; ``q_proj [B,S,nh,D]`` (Q projection, before RoPE);
        ``q [B,nh,S,D]`` (after RoPE); ``k_new, v_new [B,nkv,S,D]`` (this step's K/V, K after
        RoPE); ``k_past, v_past [B,nkv,P,D]`` (read from the cache); ``k, v [B,nkv,L,D]``
        (past + new); ``scores [B,nh,S,L]`` (``q k^T / sqrt(D)``, before masking);
        ``mask [B,1,S,L]``; ``weights [B,nh,S,L]`` (softmax over keys; exactly 0 where masked);
        ``heads [B,nh,S,D]`` (weights @ V per head); ``out [B,S,H]`` (after ``o_proj``).

    Raises:
        ValueError: if ``x`` is not ``[B,S,hidden]``, ``start`` is negative or beyond the
            cache's filled length, ``start > 0`` without a cache, or ``mask`` is not
            ``[B,1,S,start+S]``.
    """
    if x.dim() != 3 or x.shape[-1] != attn.q_proj.in_features:
        raise ValueError(f"x must have shape [B, S, {attn.q_proj.in_features}], "
                         f"got {list(x.shape)}")
    B, S, _ = x.shape
    integer("start", start, 0)
    if kv_cache is None and start != 0:
        raise ValueError(f"start must be 0 without a kv_cache, got {start}")
    if kv_cache is not None and start > kv_cache.max_len - S:
        raise ValueError(f"start={start} + {S} new tokens exceeds the cache's "
                         f"max_len={kv_cache.max_len}")
    if tuple(mask.shape) != (B, 1, S, start + S):
        raise ValueError(f"mask must have shape [{B}, 1, {S}, {start + S}], "
                         f"got {list(mask.shape)}")
    nh, nkv, D = attn.n_heads, attn.n_kv, attn.head_dim
    q_proj = attn.q_proj(x).view(B, S, nh, D)                           # [B, S, nh, D]
    q = apply_rope(q_proj.transpose(1, 2), cos, sin)                    # [B, nh, S, D]
    k_new = attn.k_proj(x).view(B, S, nkv, D).transpose(1, 2)           # [B, nkv, S, D]
    v_new = attn.v_proj(x).view(B, S, nkv, D).transpose(1, 2)           # [B, nkv, S, D]
    k_new = apply_rope(k_new, cos, sin)
    if kv_cache is not None:
        k_past, v_past = kv_cache.read(attn.layer_idx, start)          # [B, nkv, P, D]
    else:
        k_past = k_new[:, :, :0]
        v_past = v_new[:, :, :0]
    k = torch.cat([k_past, k_new], dim=2)                               # [B, nkv, L, D]
    v = torch.cat([v_past, v_new], dim=2)
    rep = nh // nkv
    scores = q @ k.repeat_interleave(rep, dim=1).transpose(-1, -2) / math.sqrt(D)  # [B,nh,S,L]
    weights = scores.masked_fill(~mask, float("-inf")).softmax(dim=-1)  # [B, nh, S, S_k]
    heads = weights @ v.repeat_interleave(rep, dim=1)                   # [B, nh, S, D]
    out = attn.o_proj(heads.transpose(1, 2).reshape(B, S, nh * D))      # [B, S, H]
    return dict(x=x, q_proj=q_proj, q=q, k_new=k_new, v_new=v_new, k_past=k_past,
                v_past=v_past, k=k, v=v, scores=scores, mask=mask, weights=weights,
                heads=heads, out=out)


def trace_attention_step(model, input_ids: torch.Tensor, kv_cache, layer_idx: int,
                         attention_mask: torch.Tensor | None = None
                         ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Run one ordinary forward pass of ``model`` and keep every intermediate tensor of the
    attention of block ``layer_idx`` (via :func:`attention_steps`, called from forward
    pre-hooks on the real modules; the forward itself is unchanged).

    Typical use: after ``prefill`` has filled ``kv_cache``, pass one new token per sequence
    (``input_ids [B,1]``) to see a decode step read the cache.

    Args:
        model: a :class:`~tokenflow.model.transformer.TokenFlowModel`.
        input_ids: ``[B,S]`` new token ids (``S = 1`` for a decode step).
        kv_cache: the :class:`~tokenflow.model.kv_cache.KVCache` (updated as by ``model(...)``).
        layer_idx: block to look inside, ``0 <= layer_idx < num_hidden_layers``.
        attention_mask: optional ``[B,S]`` (1 real, 0 left padding), as for the model.

    Returns:
        ``(logits [B,S,V], steps)``: the model's logits and the dict of
        :func:`attention_steps` plus ``hidden_in [B,S,H]`` (the residual stream entering the
        block) and ``hidden_out [B,S,H] = hidden_in + out`` (the updated hidden state after
        attention, before the block's FFN/MoE), and ``start`` (0-d tensor: past slots read).

    Raises:
        ValueError: if ``layer_idx`` is out of range, ``kv_cache`` is None or the model's
            attention is MLA; and as the model's forward.
    """
    index("layer_idx", layer_idx, len(model.layers), "num_hidden_layers")
    if kv_cache is None:
        raise ValueError("kv_cache must be a KVCache (the step reads and writes it), got None")
    if model.config.is_mla:
        raise ValueError("trace_attention_step follows grouped-query attention; this model's "
                         "attention is MLA (use Trace(keep_tensors=True) for its weights)")
    block = model.layers[layer_idx]
    steps: dict[str, torch.Tensor] = {}

    def bound(module, args, kwargs) -> dict:
        b = inspect.signature(module.forward).bind(*args, **kwargs)
        b.apply_defaults()
        return b.arguments

    def grab_block(module, args, kwargs):
        steps["hidden_in"] = bound(module, args, kwargs)["h"].detach()

    def grab_attn(module, args, kwargs):
        a = bound(module, args, kwargs)
        with torch.no_grad():
            got = attention_steps(module, a["x"], a["cos"], a["sin"], a["step"].mask,
                                  a["kv_cache"], a["step"].start)
        steps.update({k: t.detach() for k, t in got.items()})
        steps["start"] = torch.tensor(a["step"].start)

    handles = [block.register_forward_pre_hook(grab_block, with_kwargs=True),
               block.self_attn.register_forward_pre_hook(grab_attn, with_kwargs=True)]
    try:
        with torch.no_grad():
            logits = model(input_ids, kv_cache=kv_cache, attention_mask=attention_mask)
    finally:
        for h in handles:
            h.remove()
    steps["hidden_out"] = steps["hidden_in"] + steps["out"]
    return logits, steps
