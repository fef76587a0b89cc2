"""Multi-head latent attention (MLA; DeepSeek-V2 report, arXiv:2405.04434, section 2.1; HF
``DeepseekV3Attention`` and its module names), the sibling of :mod:`.attention`.

``nh`` heads, ``r`` = ``kv_lora_rank``, ``dn`` / ``dr`` = ``qk_nope`` / ``qk_rope_head_dim``,
``dv`` = ``v_head_dim``, ``L`` filled slots. The query (``q_proj``, or ``q_a_proj ->
q_a_layernorm -> q_b_proj``) has ``dn`` plain and ``dr`` rotated numbers per head. The cache
holds only the latent ``[r]`` and one shared RoPE key ``[dr]`` per token (``kv_a_proj_with_mqa``).
Naive form: ``kv_b_proj`` expands every cached latent into per-head K and V. Absorbed form
(decode): ``q_nope . (W_UK c) = (W_UK^T q_nope) . c``, so ``W_UK`` folds into the query and
``W_UV`` applies once after the weighted sum; the cache is never expanded (same output, tested).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .attention import _sdpa, _hides_no_key
from tokenflow.config import ModelConfig
from .kv_cache import CacheStep
from .norm import RMSNorm
from .rope import apply_rope, yarn_softmax_scale

__all__ = ["MLAttention"]

_LORA_EPS = 1e-6        # HF builds q_a_layernorm / kv_a_layernorm with the default eps


class MLAttention(nn.Module):
    """MLA of block ``layer_idx``. ``absorb``: ``None`` (absorbed form for ``S == 1``, naive
    otherwise) or ``True`` / ``False`` to force one. Raises ``ValueError`` if not ``is_mla``.
    """

    def __init__(self, config: ModelConfig, layer_idx: int):
        super().__init__()
        if not config.is_mla:
            raise ValueError("MLAttention needs an MLA config (kv_lora_rank set)")
        c = config
        self.layer_idx, self.n_heads = layer_idx, c.num_attention_heads
        self.r, self.dn, self.dr, self.dv = (c.kv_lora_rank, c.qk_nope_head_dim,
                                             c.qk_rope_head_dim, c.v_head_dim)
        H, nh, dq = c.hidden_size, c.num_attention_heads, c.qk_nope_head_dim + c.qk_rope_head_dim
        self.q_lora = c.q_lora_rank is not None        # query through a low-rank bottleneck
        if not self.q_lora:
            self.q_proj = nn.Linear(H, nh * dq, bias=False)
        else:
            self.q_a_proj = nn.Linear(H, c.q_lora_rank, bias=False)
            self.q_a_layernorm = RMSNorm(c.q_lora_rank, _LORA_EPS)
            self.q_b_proj = nn.Linear(c.q_lora_rank, nh * dq, bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(H, self.r + self.dr, bias=False)
        self.kv_a_layernorm = RMSNorm(self.r, _LORA_EPS)
        self.kv_b_proj = nn.Linear(self.r, nh * (self.dn + self.dv), bias=False)
        self.o_proj = nn.Linear(nh * self.dv, H, bias=False)
        self.scale = yarn_softmax_scale(c, dq)
        self.absorb: bool | None = None

    # ------------------------------------------------------------------ the pieces
    def query(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
              ) -> tuple[torch.Tensor, torch.Tensor]:
        """``x [B,S,H]`` -> ``q_nope [B,nh,S,dn]``, ``q_rope [B,nh,S,dr]`` (rotated)."""
        B, S, _ = x.shape
        q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x))) if self.q_lora else \
            self.q_proj(x)
        q = q.view(B, S, self.n_heads, self.dn + self.dr).transpose(1, 2)  # [B, nh, S, dn+dr]
        q_nope, q_rope = q.split([self.dn, self.dr], dim=-1)
        return q_nope, apply_rope(q_rope, cos, sin)

    def latent(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """``x [B,S,H]`` -> what the cache stores: ``latent [B,1,S,r]`` (normalised) and
        ``k_rope [B,1,S,dr]`` (rotated)."""
        B, S, _ = x.shape
        latent, k_rope = self.kv_a_proj_with_mqa(x).split([self.r, self.dr], dim=-1)
        latent = self.kv_a_layernorm(latent).view(B, 1, S, self.r)          # [B, 1, S, r]
        k_rope = apply_rope(k_rope.view(B, 1, S, self.dr), cos, sin)        # [B, 1, S, dr]
        return latent, k_rope

    def up_weights(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``kv_b_proj``'s weight split per head: ``W_UK [nh, dn, r]``, ``W_UV [nh, dv, r]``."""
        w = self.kv_b_proj.weight.view(self.n_heads, self.dn + self.dv, self.r)
        return w[:, :self.dn], w[:, self.dn:]

    def attend_naive(self, q_nope, q_rope, latent, k_rope, mask, keep_weights=False):
        """Expand the cache into per-head K ``[B,nh,L,dn+dr]`` and V ``[B,nh,L,dv]``, then
        attend. Returns ``(heads [B,nh,S,dv], weights [B,nh,S,L] or None)``."""
        B, _, L, _ = latent.shape
        kv = self.kv_b_proj(latent[:, 0]).view(B, L, self.n_heads, self.dn + self.dv)
        k_nope, v = kv.transpose(1, 2).split([self.dn, self.dv], dim=-1)  # [B,nh,L,dn|dv]
        k = torch.cat([k_nope, k_rope.expand(-1, self.n_heads, -1, -1)], dim=-1)
        q = torch.cat([q_nope, q_rope], dim=-1)                           # [B, nh, S, dn+dr]
        if not keep_weights:
            # SDPA's fused CPU/GPU kernels want V as wide as Q and K (dn + dr); with a narrower
            # V they fall back to the math path, which builds the [S, S_k] scores of every
            # head. Zero columns appended to V change no output column (HF pads the same way
            # for FlashAttention); they are cut off again.
            pad = q.shape[-1] - self.dv
            vp = F.pad(v, (0, pad)) if pad > 0 else v                     # [B, nh, L, dn+dr]
            return _sdpa(q, k, vp, mask, scale=self.scale)[..., :self.dv], None
        weights = _softmax(q @ k.transpose(-1, -2) * self.scale, mask)   # [B, nh, S, S_k]
        return weights @ v, weights

    def attend_absorbed(self, q_nope, q_rope, latent, k_rope, mask):
        """Attend over the cache as stored: ``W_UK`` folded into the query, ``W_UV`` applied
        after the weighted sum. Returns ``(heads [B,nh,S,dv], weights [B,nh,S,L])``."""
        w_uk, w_uv = self.up_weights()
        q_lat = torch.einsum("bhsd,hdr->bhsr", q_nope, w_uk)             # [B, nh, S, r]
        scores = q_lat @ latent.transpose(-1, -2) + q_rope @ k_rope.transpose(-1, -2)
        weights = _softmax(scores * self.scale, mask)                     # [B, nh, S, S_k]
        ctx = weights @ latent                                            # [B, nh, S, r]
        return torch.einsum("bhsr,hvr->bhsv", ctx, w_uv), weights         # [B, nh, S, dv]

    def attend(self, q_nope, q_rope, latent, k_rope, mask, keep_weights=False):
        """The form :attr:`absorb` picks (by default absorbed for one query per sequence,
        ``S == 1``, naive otherwise). Returns ``(heads [B,nh,S,dv], weights or None)``."""
        absorb = self.absorb if self.absorb is not None else q_nope.shape[2] == 1
        if absorb:
            return self.attend_absorbed(q_nope, q_rope, latent, k_rope, mask)
        return self.attend_naive(q_nope, q_rope, latent, k_rope, mask, keep_weights)

    # ------------------------------------------------------------------ forward
    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                step: CacheStep, kv_cache=None) -> torch.Tensor:
        """``x [B,S,H] -> [B,S,H]``, as :meth:`.attention.Attention.forward` (``cos, sin
        [B,1,S,dr]``)."""
        B, S, _ = x.shape
        q_nope, q_rope = self.query(x, cos, sin)
        latent, k_rope = self.latent(x, cos, sin)
        if kv_cache is not None:
            latent, k_rope = kv_cache.update(self.layer_idx, step, latent, k_rope)
        if step.packed:   # sequences end to end: each its own context
            heads = step.attend_each(lambda *a: self.attend(*a)[0], (q_nope, q_rope),
                                     (latent, k_rope))                    # [1, nh, T, dv]
        else:
            heads, _ = self.attend(q_nope, q_rope, latent, k_rope, step.mask)
        return self.o_proj(heads.transpose(1, 2).reshape(B, S, self.n_heads * self.dv))


def _softmax(scores: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Masked softmax over keys in float32 (HF's eager attention); a mask that hides no key
    is skipped (same values, two ops fewer)."""
    if not _hides_no_key(mask, scores.shape[-1]):
        scores = scores.masked_fill(~mask, float("-inf"))
    return scores.float().softmax(dim=-1).to(scores.dtype)
