"""Rotary position embedding (RoPE; RoFormer, arXiv:2104.09864, eq. 34) and its scalings.

Position ``p`` rotates pair ``i`` (the two halves of a head, HF's "rotate half") by ``p *
inv_freq[i]``, ``inv_freq[i] = rope_theta ** (-2i / D)``; ``D`` is ``head_dim`` (MLA:
``qk_rope_head_dim``). ``rope_scaling`` as ``transformers.modeling_rope_utils``: ``linear``
(position interpolation, kaiokendev; Chen et al. 2023), ``llama3`` (Llama 3.1; HF
``_compute_llama3_parameters``), ``yarn`` (YaRN, arXiv:2309.00071; HF
``_compute_yarn_parameters``, ``yarn_apply_mscale``; DeepSeek-V2/V3).
"""
from __future__ import annotations

import math

import torch
from torch import nn

from tokenflow.config import ROPE_TYPES

__all__ = ["RotaryEmbedding", "apply_rope", "rope_inv_freq", "yarn_softmax_scale",
           "ROPE_TYPES"]


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def _yarn_factor(config, s: dict) -> float:
    f = s.get("factor")
    return f if f is not None else \
        config.max_position_embeddings / s["original_max_position_embeddings"]


def _yarn(pos_freqs: torch.Tensor, dim: int, config, s: dict) -> tuple[torch.Tensor, float]:
    """YaRN ``inv_freq`` and attention factor; ``pos_freqs`` is ``rope_theta ** (2i / dim)``."""
    base, factor = config.rope_theta, _yarn_factor(config, s)
    attn = s.get("attention_factor")
    if attn is None:
        m, m_all = s.get("mscale"), s.get("mscale_all_dim")
        attn = _yarn_mscale(factor, m) / _yarn_mscale(factor, m_all) if m and m_all \
            else _yarn_mscale(factor)
    beta_fast, beta_slow = s.get("beta_fast") or 32, s.get("beta_slow") or 1
    orig = s["original_max_position_embeddings"]

    def corr_dim(rot):          # the dimension whose wavelength fits ``rot`` times in ``orig``
        return dim * math.log(orig / (rot * 2 * math.pi)) / (2 * math.log(base))
    low, high = corr_dim(beta_fast), corr_dim(beta_slow)
    if s.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    extrapolate = 1 - ramp                                          # 1: keep the frequency
    inv = 1.0 / (factor * pos_freqs) * (1 - extrapolate) + 1.0 / pos_freqs * extrapolate
    return inv, float(attn)


def _llama3(inv_freq: torch.Tensor, s: dict) -> torch.Tensor:
    """Llama 3.1: low frequencies / ``factor``, high ones kept, a smooth ramp between."""
    factor, lo, hi = s["factor"], s["low_freq_factor"], s["high_freq_factor"]
    old = s["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > old / lo, inv_freq / factor, inv_freq)
    smooth = (old / wavelen - lo) / (hi - lo)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < old / hi) * ~(wavelen > old / lo)
    return torch.where(medium, smoothed, scaled)


def rope_inv_freq(config) -> tuple[torch.Tensor, float]:
    """``(inv_freq [D/2], attention_factor)`` (it scales ``cos``/``sin``; 1.0 but for YaRN)
    of a validated config."""
    dim = config.qk_rope_head_dim if config.kv_lora_rank is not None else config.head_dim
    s = config.rope_scaling or {"rope_type": "default"}
    kind = s["rope_type"]
    pos_freqs = config.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)
    if kind == "yarn":
        return _yarn(pos_freqs, dim, config, s)
    inv = 1.0 / pos_freqs
    if kind == "linear":
        return inv / s["factor"], 1.0
    if kind == "llama3":
        return _llama3(inv, s), 1.0
    return inv, 1.0


def yarn_softmax_scale(config, head_dim: int) -> float:
    """``head_dim ** -0.5``, times ``mscale(factor, mscale_all_dim) ** 2`` when the RoPE
    scaling has ``mscale_all_dim`` (DeepSeek-V2/V3's softmax scale)."""
    scale = head_dim ** -0.5
    s = config.rope_scaling
    if s and s.get("mscale_all_dim"):
        m = _yarn_mscale(_yarn_factor(config, s), s["mscale_all_dim"])
        scale = scale * m * m
    return scale


class RotaryEmbedding(nn.Module):
    """``cos``/``sin`` tables ``[max_position_embeddings, D]`` (YaRN's factor folded in)."""

    def __init__(self, config):
        super().__init__()
        inv_freq, attention_factor = rope_inv_freq(config)
        pos = torch.arange(config.max_position_embeddings, dtype=torch.float32)
        freqs = torch.outer(pos, inv_freq)                    # [P, D/2]
        emb = torch.cat([freqs, freqs], dim=-1)               # [P, D]
        self.register_buffer("cos", emb.cos() * attention_factor, persistent=False)
        self.register_buffer("sin", emb.sin() * attention_factor, persistent=False)

    def forward(self, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``position_ids [B,S]`` -> ``cos, sin [B,1,S,D]`` (broadcast over heads)."""
        idx = position_ids[:, None]                                      # [B, 1, S]
        return self.cos[idx], self.sin[idx]


_SIGNS: dict[tuple, torch.Tensor] = {}


def _half_signs(x: torch.Tensor) -> torch.Tensor:
    """``[-1]*(D/2) + [1]*(D/2)`` for ``x`` (made once, outside inference mode: autograd may
    save it)."""
    key = (x.shape[-1], x.dtype, x.device)
    signs = _SIGNS.get(key)
    if signs is None:
        with torch.inference_mode(False), torch.no_grad():
            signs = torch.ones(x.shape[-1], dtype=x.dtype, device=x.device)
            signs[:x.shape[-1] // 2] = -1
        _SIGNS[key] = signs
    return signs


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    """``[x1, x2] -> [-x2, x1]``: a ``roll`` and an exact product with +-1 (two ops, not
    ``cat``'s four)."""
    return x.roll(x.shape[-1] // 2, dims=-1).mul_(_half_signs(x))


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x [B,heads,S,D]`` by its positions' angles (``cos, sin [B,1,S,D]``)."""
    return x * cos + _rotate_half(x) * sin
