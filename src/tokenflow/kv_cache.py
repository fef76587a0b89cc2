"""The KV cache: preallocated key/value tensors per layer, written by prefill, read by decode.

Layout per layer: ``k, v: [B, n_kv, max_len, D]`` (the layout of gpt-fast's ``KVCache`` and
of Hugging Face's ``StaticCache``). Slots ``[0, length)`` are filled. ``valid[b, slot]``
says whether a filled slot holds a real token (False for left padding), and ``num_real[b]``
counts the real tokens of row ``b``, which is also the RoPE position of its next token.

Bytes per token (all layers, K and V): ``2 * num_hidden_layers * num_key_value_heads *
head_dim * bytes_per_element``; see :func:`tokenflow.costmodel.kv_cache_bytes_per_token`.
"""
from __future__ import annotations

import torch

from .config import ModelConfig

__all__ = ["KVCache"]


class KVCache:
    """Preallocated per-layer K/V storage for a batch of sequences.

    Args:
        config: the model config (layers, KV heads, head_dim).
        batch_size: B.
        max_len: capacity in tokens per sequence (prompt + generated); defaults to
            ``config.max_position_embeddings`` and may not exceed it.
        dtype, device: storage dtype and device.

    Attributes:
        k, v: lists of ``[B, n_kv, max_len, D]`` tensors, one per layer.
        length: slots filled so far (same for every row; padding fills slots too).
        valid: ``[B, max_len]`` bool, True where a slot holds a real (non-pad) token.
        num_real: ``[B]`` int64, real tokens per row (next RoPE position).

    Raises:
        ValueError: if ``batch_size < 1`` or ``max_len`` is outside
            ``[1, max_position_embeddings]``.
    """

    def __init__(self, config: ModelConfig, batch_size: int, max_len: int | None = None,
                 dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"):
        if max_len is None:
            max_len = config.max_position_embeddings
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be an int >= 1, got {batch_size!r}")
        if not isinstance(max_len, int) or not 1 <= max_len <= config.max_position_embeddings:
            raise ValueError(
                f"max_len must be in [1, max_position_embeddings="
                f"{config.max_position_embeddings}], got {max_len!r}")
        self.config = config
        self.batch_size = batch_size
        self.max_len = max_len
        shape = (batch_size, config.num_key_value_heads, max_len, config.head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=device)
                  for _ in range(config.num_hidden_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device)
                  for _ in range(config.num_hidden_layers)]
        self.valid = torch.zeros(batch_size, max_len, dtype=torch.bool, device=device)
        self.num_real = torch.zeros(batch_size, dtype=torch.long, device=device)
        self.length = 0

    # ---------------------------------------------------------------- bookkeeping
    def reserve(self, attention_mask: torch.Tensor) -> tuple[int, torch.Tensor]:
        """Claim the next ``S`` slots for new tokens and return their RoPE positions.

        Called once per forward pass, before the layers write. ``attention_mask [B,S]``
        (1 = real token, 0 = left padding) marks which new slots are real.

        Returns:
            ``(start, position_ids [B,S])``: the first claimed slot and each new token's
            position, counted from the row's first real token (padding gets position 0).

        Raises:
            ValueError: if the new tokens would overflow ``max_len``.
        """
        B, S = attention_mask.shape
        if B != self.batch_size:
            raise ValueError(f"input batch size {B} does not match the cache's {self.batch_size}")
        if self.length + S > self.max_len:
            raise ValueError(
                f"sequence too long for the KV cache: {self.length} cached + {S} new tokens > "
                f"max_len={self.max_len}")
        mask = attention_mask.to(torch.bool)
        positions = self.num_real[:, None] + torch.cumsum(mask.long(), dim=1) - 1
        positions = positions.clamp(min=0)
        start = self.length
        self.valid[:, start:start + S] = mask
        self.num_real += mask.long().sum(dim=1)
        self.length += S
        return start, positions

    def write(self, layer_idx: int, start: int, k: torch.Tensor, v: torch.Tensor
              ) -> tuple[torch.Tensor, torch.Tensor]:
        """Store ``k, v [B, n_kv, S, D]`` at slots ``[start, start+S)`` of one layer and
        return the filled part ``[B, n_kv, start+S, D]`` for attention to read."""
        S = k.shape[2]
        self.k[layer_idx][:, :, start:start + S] = k
        self.v[layer_idx][:, :, start:start + S] = v
        end = start + S
        return self.k[layer_idx][:, :, :end], self.v[layer_idx][:, :, :end]

    # ---------------------------------------------------------------- reporting
    def nbytes(self) -> int:
        """Bytes allocated for K and V across all layers (capacity, not just the filled part)."""
        return sum(t.nbytes for t in self.k) + sum(t.nbytes for t in self.v)

    def nbytes_used(self) -> int:
        """Bytes of K and V in the filled slots: ``nbytes() * length / max_len``."""
        return self.nbytes() * self.length // self.max_len

    def bytes_per_token(self) -> int:
        """Bytes one token occupies in this cache, all layers, K and V."""
        return self.nbytes() // (self.max_len * self.batch_size)

    def __repr__(self) -> str:
        c = self.config
        return (f"KVCache(layers={c.num_hidden_layers}, shape per layer K/V="
                f"[{self.batch_size}, {c.num_key_value_heads}, {self.max_len}, {c.head_dim}], "
                f"filled={self.length})")
