"""Grouped-query attention with RoPE, reading and writing the KV cache.

Follows Llama's attention (Hugging Face ``LlamaAttention``): q/k/v projections without bias,
rotary position embedding (Su et al., RoFormer, arXiv:2104.09864, in the "rotate half"
layout of HF), ``num_key_value_heads`` shared K/V heads (Ainslie et al., GQA,
arXiv:2305.13245), scaled dot-product attention with a causal mask, and an output
projection. Shapes: ``x [B,S,H] -> [B,S,H]``; q ``[B,n_heads,S,D]``; K/V cache
``[B,n_kv,L,D]`` where ``L`` is the number of filled cache slots after this step.
"""
from __future__ import annotations

import math

import torch
from torch import nn
import torch.nn.functional as F

from .config import ModelConfig

__all__ = ["RotaryEmbedding", "apply_rope", "Attention", "attention_mask_for"]


class RotaryEmbedding(nn.Module):
    """Precomputed RoPE ``cos``/``sin`` tables ``[max_position_embeddings, D]``.

    ``inv_freq[i] = rope_theta ** (-2i / D)``; position ``p`` rotates pair ``i`` by
    ``p * inv_freq[i]`` (RoFormer eq. 34, HF layout: the two halves of the head are paired).
    """

    def __init__(self, config: ModelConfig):
        super().__init__()
        D = config.head_dim
        inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, D, 2, dtype=torch.float32) / D))
        pos = torch.arange(config.max_position_embeddings, dtype=torch.float32)
        freqs = torch.outer(pos, inv_freq)                    # [P, D/2]
        emb = torch.cat([freqs, freqs], dim=-1)               # [P, D]
        self.register_buffer("cos", emb.cos(), persistent=False)
        self.register_buffer("sin", emb.sin(), persistent=False)

    def forward(self, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``position_ids [B,S]`` -> ``cos, sin [B,1,S,D]`` (broadcast over heads)."""
        return self.cos[position_ids][:, None], self.sin[position_ids][:, None]


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x [B,heads,S,D]`` by its positions' angles (``cos, sin [B,1,S,D]``)."""
    return x * cos + _rotate_half(x) * sin


def attention_mask_for(valid: torch.Tensor, start: int, S: int) -> torch.Tensor:
    """Boolean mask ``[B,1,S,L]`` (True = may attend) for ``S`` queries at cache slots
    ``[start, start+S)`` over keys at slots ``[0, L)``, ``L = start + S``.

    A query sees a key when the key's slot is not after its own (causal, correct also when
    the query is shorter than the keys: decode and chunked prefill) and the key is a real
    token (``valid [B,L]``, False for left padding). Every query also sees itself, so a
    padding query never has an empty row (which would make NaNs that leak through V).
    """
    L = start + S
    q_slot = torch.arange(start, L, device=valid.device)[:, None]     # [S, 1]
    k_slot = torch.arange(L, device=valid.device)[None, :]            # [1, L]
    causal = k_slot <= q_slot                                          # [S, L]
    mask = causal[None] & valid[:, None, :L]                           # [B, S, L]
    mask = mask | (k_slot == q_slot)[None]
    return mask[:, None]                                               # [B, 1, S, L]


class Attention(nn.Module):
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

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                mask: torch.Tensor, kv_cache=None, start: int = 0, trace=None) -> torch.Tensor:
        """One attention step.

        Args:
            x: ``[B,S,H]`` normalised hidden states of the new tokens.
            cos, sin: ``[B,1,S,D]`` RoPE tables for their positions.
            mask: ``[B,1,S,L]`` bool from :func:`attention_mask_for`.
            kv_cache: a :class:`~tokenflow.kv_cache.KVCache` (new K/V are written at slots
                ``[start, start+S)`` and all filled slots are read), or ``None`` (attend
                over the new tokens only).
            start: first cache slot of the new tokens.
            trace: optional :class:`~tokenflow.trace.Trace`.

        Returns:
            ``[B,S,H]``: the attention output (to be added to the residual stream).
        """
        B, S, _ = x.shape
        D = self.head_dim
        q = self.q_proj(x).view(B, S, self.n_heads, D).transpose(1, 2)   # [B, nh, S, D]
        k = self.k_proj(x).view(B, S, self.n_kv, D).transpose(1, 2)      # [B, nkv, S, D]
        v = self.v_proj(x).view(B, S, self.n_kv, D).transpose(1, 2)      # [B, nkv, S, D]
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        where = f"layer {self.layer_idx} attention"
        if kv_cache is not None:
            k_all, v_all = kv_cache.write(self.layer_idx, start, k, v)   # [B, nkv, L, D]
            if trace is not None:
                trace.record("write KV", where, x, k, nbytes=k.nbytes + v.nbytes,
                             note=f"K,V of {S} new token(s) -> cache slots {start}..{start + S - 1}")
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
        else:
            out = F.scaled_dot_product_attention(q, k_all, v_all, attn_mask=mask,
                                                 enable_gqa=self.n_kv != self.n_heads)
        out = self.o_proj(out.transpose(1, 2).reshape(B, S, self.n_heads * D))  # [B, S, H]
        if trace is not None:
            trace.record("read KV", where, q, out, nbytes=k_all.nbytes + v_all.nbytes,
                         note=f"Q [B,{self.n_heads},{S},{D}] reads K/V "
                              f"{list(k_all.shape)} ({k_all.shape[2]} positions)")
        return out
