"""Rotary position embedding (RoPE) and its long-context scalings.

RoPE (Su et al., RoFormer, arXiv:2104.09864) rotates pair ``i`` of a head by ``p * inv_freq[i]``
at position ``p``, with ``inv_freq[i] = rope_theta ** (-2i / D)``; the pairs are the two halves
of the head (HF's "rotate half" layout). ``config.rope_scaling`` changes ``inv_freq`` (and may
scale ``cos``/``sin``) exactly as ``transformers.modeling_rope_utils`` does:

* ``linear``: ``inv_freq / factor`` (position interpolation, kaiokendev / Chen et al. 2023).
* ``llama3``: low frequencies divided by ``factor``, high ones kept, a smooth ramp in between
  (Llama 3.1; HF ``_compute_llama3_parameters``).
* ``yarn``: per-frequency blend of interpolation and extrapolation, and ``cos``/``sin`` scaled
  by an attention factor (Peng et al., YaRN, arXiv:2309.00071; HF ``_compute_yarn_parameters``;
  DeepSeek-V2/V3 use it). :func:`yarn_softmax_scale` is DeepSeek's extra ``mscale**2`` on the
  softmax scale (HF ``yarn_apply_mscale``).

The rotated dimension is ``config.head_dim`` (GQA) or ``config.qk_rope_head_dim`` (MLA, where
only that slice of each head is rotated).
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
    """YaRN ``inv_freq`` and attention factor (HF ``_compute_yarn_parameters``); ``pos_freqs``
    is ``rope_theta ** (2i / dim)``."""
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
    """Llama 3.1 ``inv_freq`` (HF ``_compute_llama3_parameters``)."""
    factor, lo, hi = s["factor"], s["low_freq_factor"], s["high_freq_factor"]
    old = s["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > old / lo, inv_freq / factor, inv_freq)
    smooth = (old / wavelen - lo) / (hi - lo)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < old / hi) * ~(wavelen > old / lo)
    return torch.where(medium, smoothed, scaled)


def rope_inv_freq(config) -> tuple[torch.Tensor, float]:
    """``(inv_freq [D/2], attention_factor)`` for ``config``'s RoPE kind.

    ``D`` is the rotated dimension (``qk_rope_head_dim`` for MLA, else ``head_dim``);
    ``attention_factor`` multiplies ``cos`` and ``sin`` (1.0 except for YaRN). Follows
    ``transformers.modeling_rope_utils`` (default, linear, llama3, yarn); the config has been
    validated, so an unknown ``rope_type`` cannot reach here.
    """
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
    """Softmax scale ``head_dim ** -0.5``, times ``mscale(factor, mscale_all_dim) ** 2`` when the
    config has a scaled RoPE with ``mscale_all_dim`` (DeepSeek-V2/V3; HF ``yarn_apply_mscale``,
    used by ``DeepseekV3Attention``)."""
    scale = head_dim ** -0.5
    s = config.rope_scaling
    if s and s.get("mscale_all_dim"):
        m = _yarn_mscale(_yarn_factor(config, s), s["mscale_all_dim"])
        scale = scale * m * m
    return scale


class RotaryEmbedding(nn.Module):
    """Precomputed RoPE ``cos``/``sin`` tables ``[max_position_embeddings, D]``.

    ``inv_freq`` from :func:`rope_inv_freq` (plain RoPE: ``rope_theta ** (-2i / D)``); position
    ``p`` rotates pair ``i`` by ``p * inv_freq[i]`` (RoFormer eq. 34, HF layout: the two halves
    of the head are paired). YaRN's attention factor is folded into the tables, as HF does.
    """

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
    """``[-1]*(D/2) + [1]*(D/2)`` in ``x``'s dtype and device (built once per kind, outside
    inference mode so that autograd may save it)."""
    key = (x.shape[-1], x.dtype, x.device)
    signs = _SIGNS.get(key)
    if signs is None:
        with torch.inference_mode(False), torch.no_grad():
            signs = torch.ones(x.shape[-1], dtype=x.dtype, device=x.device)
            signs[:x.shape[-1] // 2] = -1
        _SIGNS[key] = signs
    return signs


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    """``[x1, x2] -> [-x2, x1]`` over the last dim: the halves swapped (one ``roll``), then
    the new first half negated (a product with +-1, exact). Same values as
    ``cat([-x2, x1])``, in two ops instead of four (a decode step calls it on every layer)."""
    return x.roll(x.shape[-1] // 2, dims=-1).mul_(_half_signs(x))


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x [B,heads,S,D]`` by its positions' angles (``cos, sin [B,1,S,D]``)."""
    return x * cos + _rotate_half(x) * sin
