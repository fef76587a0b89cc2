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

import torch
from torch import nn
import torch.nn.functional as F

from tokenflow.config import ModelConfig
from .fused import PackedWeights, linear_weights, packed_rows
from .kv_cache import CacheStep, attention_mask_for
from .linear import linear
from .rope import RotaryEmbedding, apply_rope

__all__ = ["RotaryEmbedding", "apply_rope", "Attention", "attention_mask_for"]


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
                step: CacheStep, kv_cache=None) -> torch.Tensor:
        """One attention step.

        Args:
            x: ``[B,S,H]`` normalised hidden states of the new tokens.
            cos, sin: ``[B,1,S,D]`` RoPE tables for their positions.
            step: the forward pass's :class:`~tokenflow.model.kv_cache.CacheStep` (``mask
                [B,1,S,L]``, ``start``); a packed step
                when ``x`` is ``[1, T, H]``, several sequences end to end.
            kv_cache: a cache storage (:class:`~tokenflow.model.kv_cache.KVCache`): the new K/V are
                written at the step's slots and all filled slots are read; or ``None``
                (attend over the new tokens only).

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
        if kv_cache is not None:
            k_all, v_all = kv_cache.update(self.layer_idx, step, k, v)   # [B, nkv, L, D]
        else:
            k_all, v_all = k, v
        if step.packed:     # sequences end to end: each its own context
            out = step.attend_each(self.attend, (q,), (k_all, v_all))     # [1, nh, T, D]
        else:
            out = self.attend(q, k_all, v_all, step.mask)                 # [B, nh, S, D]
        return linear(out.transpose(1, 2).reshape(B, S, nh * D), self.o_proj.weight)  # [B,S,H]
