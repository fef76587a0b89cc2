"""Grouped-query attention (GQA, arXiv:2305.13245) as HF ``LlamaAttention``: q/k/v without
bias, RoPE (:mod:`.rope`), ``num_key_value_heads`` shared K/V heads, SDPA, ``o_proj``.
``x [B,S,H] -> [B,S,H]``; q ``[B,nh,S,D]``; K/V ``[B,nkv,L,D]``, ``L`` filled slots.
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
    """True if ``mask`` hides no key (``sdpa_hint == "none"``) and has ``num_keys`` keys."""
    return getattr(mask, "sdpa_hint", None) == "none" and mask.shape[-1] == num_keys


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,
          enable_gqa: bool = False, scale: float | None = None) -> torch.Tensor:
    """SDPA under ``mask``, or without it when its ``sdpa_hint`` allows (same values)."""
    if _hides_no_key(mask, k.shape[-2]):                       # any number of query rows
        return F.scaled_dot_product_attention(q, k, v, enable_gqa=enable_gqa, scale=scale)
    if getattr(mask, "sdpa_hint", None) == "causal" and \
            mask.shape[-2] == mask.shape[-1] == q.shape[-2] == k.shape[-2]:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                              enable_gqa=enable_gqa, scale=scale)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=enable_gqa,
                                          scale=scale)


class Attention(PackedWeights, nn.Module):
    """GQA of block ``layer_idx`` (its cache layer)."""

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
        """``q_proj``, ``k_proj``, ``v_proj`` as one ``[(nh + 2*nkv)*D, H]`` matrix: packed
        (:func:`.fused.packed_rows`, no copy), or with gradients on a ``torch.cat``."""
        ws = linear_weights(self, ("q_proj", "k_proj", "v_proj"))   # (q_proj.weight, ...)
        if torch.is_grad_enabled():
            return torch.cat(ws)
        return packed_rows(self, "qkv", ws)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor
               ) -> torch.Tensor:
        """``q [B,nh,S,D]`` over ``k, v [B,nkv,L,D]`` under ``mask [B,1,S,L]`` -> ``[B,nh,S,D]``."""
        B, nh, S, D = q.shape
        nkv = self.n_kv
        if S == 1 and nkv != nh:
            # Decode: the rep = nh/nkv query heads sharing KV head g (h = g*rep + r, as
            # enable_gqa) become one [rep, D] block, so one read of the K/V serves them.
            out = _sdpa(q.reshape(B, nkv, nh // nkv, D), k, v, mask)
            return out.reshape(B, nh, 1, D)                               # [B, nh, 1, D]
        return _sdpa(q, k, v, mask, nkv != nh)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                step: CacheStep, kv_cache=None) -> torch.Tensor:
        """``x [B,S,H]`` (normed new tokens; ``cos, sin [B,1,S,D]``) -> ``[B,S,H]``. The new
        K/V go to ``kv_cache`` at ``step``'s slots and every filled slot is read (``None``:
        the new tokens only); a packed ``step`` has ``x [1, T, H]``."""
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
