"""Grouped-query attention with RoPE, reading and writing the KV cache.

Follows Llama's attention (Hugging Face ``LlamaAttention``): q/k/v projections without bias,
rotary position embedding (Su et al., RoFormer, arXiv:2104.09864, in the "rotate half"
layout of HF), ``num_key_value_heads`` shared K/V heads (Ainslie et al., GQA,
arXiv:2305.13245), scaled dot-product attention with a causal mask, and an output
projection. Shapes: ``x [B,S,H] -> [B,S,H]``; q ``[B,n_heads,S,D]``; K/V cache
``[B,n_kv,L,D]`` where ``L`` is the number of filled cache slots after this step. The cache is
reached through its interface (:mod:`tokenflow.model.kv_cache`): one ``update`` call per layer.
RoPE lives in :mod:`tokenflow.model.rope` and the mask in
:func:`~tokenflow.model.kv_cache.attention_mask_for` (both re-exported here).
"""
from __future__ import annotations

import inspect
import math

import torch
from torch import nn
import torch.nn.functional as F

from .config import ModelConfig
from .fused import PackedWeights, linear_weights, packed_rows
from .kv_cache import CacheStep, PackedCacheStep, attention_mask_for
from .linear import linear
from .rope import RotaryEmbedding, apply_rope

__all__ = ["RotaryEmbedding", "apply_rope", "Attention", "attention_mask_for",
           "attention_steps", "trace_attention_step"]


def _hides_no_key(mask: torch.Tensor, num_keys: int) -> bool:
    """True if ``mask`` (``[..., L]``) was marked by :func:`attention_mask_for` as hiding no
    key (``sdpa_hint == "none"``: an unpadded decode step) and still has ``num_keys`` keys;
    then attention may skip the mask (SDPA without ``attn_mask``, a softmax without
    ``masked_fill``) with the same values."""
    return getattr(mask, "sdpa_hint", None) == "none" and mask.shape[-1] == num_keys


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,
          enable_gqa: bool = False, scale: float | None = None) -> torch.Tensor:
    """SDPA with ``mask``, or without a mask tensor when :func:`attention_mask_for` marked it
    as "no key masked" / "plain causal" (and its shape still fits): same values, faster.
    ``scale`` defaults to SDPA's ``1 / sqrt(D)``."""
    if _hides_no_key(mask, k.shape[-2]):                       # any number of query rows
        return F.scaled_dot_product_attention(q, k, v, enable_gqa=enable_gqa, scale=scale)
    if getattr(mask, "sdpa_hint", None) == "causal" and \
            mask.shape[-2] == mask.shape[-1] == q.shape[-2] == k.shape[-2]:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                              enable_gqa=enable_gqa, scale=scale)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=enable_gqa,
                                          scale=scale)


class Attention(PackedWeights, nn.Module):
    """Grouped-query self-attention of one decoder block.

    Args:
        config: uses ``hidden_size``, ``num_attention_heads``, ``num_key_value_heads``,
            ``head_dim``.
        layer_idx: which block (selects the cache layer).
    """

    def __init__(self, config: ModelConfig, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.n_heads = config.num_attention_heads
        self.n_kv = config.num_key_value_heads
        self.head_dim = config.head_dim
        H, D = config.hidden_size, config.head_dim
        self.q_proj = nn.Linear(H, self.n_heads * D, bias=False)
        self.k_proj = nn.Linear(H, self.n_kv * D, bias=False)
        self.v_proj = nn.Linear(H, self.n_kv * D, bias=False)
        self.o_proj = nn.Linear(self.n_heads * D, H, bias=False)
        packed_rows(self, "qkv", (self.q_proj.weight, self.k_proj.weight,  # one copy, packed
                                  self.v_proj.weight))                   # (tokenflow.model.fused)

    def qkv_weight(self) -> torch.Tensor:
        """The Q, K and V projections as one ``[(nh + 2*nkv)*D, H]`` matrix (rows of
        ``q_proj``, then ``k_proj``, then ``v_proj``), so that one matrix product computes all
        three. Without gradients it is :func:`tokenflow.model.fused.packed_rows` (one copy of the
        weights, no copy per call); with gradients on (training) a ``torch.cat`` of the three,
        through which gradients reach each projection."""
        ws = linear_weights(self, ("q_proj", "k_proj", "v_proj"))   # (q_proj.weight, ...)
        if torch.is_grad_enabled():
            return torch.cat(ws)
        return packed_rows(self, "qkv", ws)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor
               ) -> torch.Tensor:
        """Scaled dot-product attention of ``q [B,nh,S,D]`` over ``k, v [B,nkv,L,D]`` under
        ``mask [B,1,S,L]``; returns ``[B,nh,S,D]``."""
        B, nh, S, D = q.shape
        nkv = self.n_kv
        if S == 1 and nkv != nh:
            # Decode with GQA: the nh/nkv query heads that share a KV head read the same K and
            # V, so they become the rows of one query block against that head (a [rep, D] by
            # [D, L] product instead of rep [1, D] ones: one read of the K/V serves rep queries).
            # Head h = g*rep + r uses KV head g, as enable_gqa would; same values, faster.
            out = _sdpa(q.reshape(B, nkv, nh // nkv, D), k, v, mask)
            return out.reshape(B, nh, 1, D)                               # [B, nh, 1, D]
        return _sdpa(q, k, v, mask, nkv != nh)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                step: CacheStep, kv_cache=None, trace=None) -> torch.Tensor:
        """One attention step.

        Args:
            x: ``[B,S,H]`` normalised hidden states of the new tokens.
            cos, sin: ``[B,1,S,D]`` RoPE tables for their positions.
            step: the forward pass's :class:`~tokenflow.model.kv_cache.CacheStep` (``mask
                [B,1,S,L]``, ``start``); a :class:`~tokenflow.model.kv_cache.PackedCacheStep`
                when ``x`` is ``[1, T, H]``, several sequences end to end.
            kv_cache: a cache storage (:class:`~tokenflow.model.kv_cache.KVCache`): the new K/V are
                written at the step's slots and all filled slots are read; or ``None``
                (attend over the new tokens only).
            trace: optional :class:`~tokenflow.analysis.trace.Trace`.

        Returns:
            ``[B,S,H]``: the attention output (to be added to the residual stream).
        """
        B, S, _ = x.shape
        D, nh, nkv = self.head_dim, self.n_heads, self.n_kv
        qkv = linear(x, self.qkv_weight())                            # [B, S, (nh+2*nkv)*D]
        qkv = qkv.view(B, S, nh + 2 * nkv, D).transpose(1, 2)         # [B, nh+2*nkv, S, D]
        # Q and K heads side by side, so that one RoPE call rotates both (fewer ops per step).
        qk, v = qkv.split((nh + nkv, nkv), dim=1)                     # [B,nh+nkv,S,D], [B,nkv,S,D]
        qk = apply_rope(qk, cos, sin)
        q, k = qk.split((nh, nkv), dim=1)                             # [B,nh,S,D], [B,nkv,S,D]
        mask = step.mask
        if trace is not None:
            where, start = f"layer {self.layer_idx} attention", step.start
        if kv_cache is not None:
            k_all, v_all = kv_cache.update(self.layer_idx, step, k, v)   # [B, nkv, L, D]
            if trace is not None:
                trace.record("write KV", where, x, k, nbytes=k.nbytes + v.nbytes,
                             note=f"K,V of {S} new token(s) -> cache slots "
                                  f"{start}..{start + S - 1}")
        else:
            k_all, v_all = k, v
        keep = trace is not None and trace.keep_tensors
        if keep:
            rep = self.n_heads // self.n_kv
            kr = k_all.repeat_interleave(rep, dim=1)                      # [B, nh, L, D]
            vr = v_all.repeat_interleave(rep, dim=1)
            scores = q @ kr.transpose(-1, -2) / math.sqrt(D)              # [B, nh, S, L]
            weights = scores.masked_fill(~mask, float("-inf")).softmax(dim=-1)
            out = weights @ vr                                            # [B, nh, S, D]
            trace.attention_weights[self.layer_idx] = weights.detach()
        elif isinstance(step, PackedCacheStep):   # sequences end to end: each its own context
            out = step.attend_each(self.attend, (q,), (k_all, v_all))     # [1, nh, T, D]
        else:
            out = self.attend(q, k_all, v_all, mask)                      # [B, nh, S, D]
        out = linear(out.transpose(1, 2).reshape(B, S, nh * D), self.o_proj.weight)  # [B,S,H]
        if trace is not None:
            trace.record("read KV", where, q, out, nbytes=k_all.nbytes + v_all.nbytes,
                         note=f"Q [B,{self.n_heads},{S},{D}] reads K/V "
                              f"{list(k_all.shape)} ({k_all.shape[2]} positions)")
        return out


# --------------------------------------------------------------------- step by step (chapter 02)
def attention_steps(attn: Attention, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                    mask: torch.Tensor, kv_cache=None, start: int = 0) -> dict[str, torch.Tensor]:
    """The computation of :meth:`Attention.forward`, one named tensor per step.

    Uses the module's own projections (``attn.q_proj``, ``k_proj``, ``v_proj``, ``o_proj``)
    and :func:`apply_rope`; the result ``"out"`` equals the module's forward with a
    :class:`~tokenflow.model.kv_cache.CacheStep` of this ``mask`` and ``start`` (tested). Unlike the
    module it does **not** write the cache: it reads the past slots ``[0, start)`` of layer
    ``attn.layer_idx`` and appends the new K/V in a copy, so it can be called before (or instead of)
    the real forward without changing the cache.

    Args:
        attn: an :class:`Attention` module (e.g. ``model.layers[i].self_attn``).
        x: ``[B,S,H]`` normalised hidden states of the new tokens (``input_layernorm(h)``).
        cos, sin: ``[B,1,S,D]`` RoPE tables for their positions.
        mask: ``[B,1,S,L]`` bool, ``L = start + S`` (:func:`attention_mask_for`).
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
    if not isinstance(start, int) or start < 0:
        raise ValueError(f"start must be an int >= 0, got {start!r}")
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
    weights = scores.masked_fill(~mask, float("-inf")).softmax(dim=-1)  # [B, nh, S, L]
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
    n = len(model.layers)
    if isinstance(layer_idx, bool) or not isinstance(layer_idx, int) or not 0 <= layer_idx < n:
        raise ValueError(f"layer_idx must be an int in [0, {n}), got {layer_idx!r}")
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
