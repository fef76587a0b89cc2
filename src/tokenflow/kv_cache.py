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

__all__ = ["KVCache", "kv_cache_size", "format_bytes"]


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

    def _reserve_all_real(self, batch_size: int, S: int) -> tuple[int, torch.Tensor]:
        """:meth:`reserve` for ``S`` new tokens that are all real (no ``attention_mask``): the
        same bookkeeping and result as ``reserve(torch.ones(batch_size, S))`` with fewer
        tensor ops (the decode loop calls it once per token)."""
        if batch_size != self.batch_size:
            raise ValueError(f"input batch size {batch_size} does not match the cache's "
                             f"{self.batch_size}")
        if self.length + S > self.max_len:
            raise ValueError(
                f"sequence too long for the KV cache: {self.length} cached + {S} new tokens > "
                f"max_len={self.max_len}")
        start = self.length
        if S == 1:
            positions = self.num_real[:, None].clone()                  # [B, 1]
        else:
            positions = self.num_real[:, None] + torch.arange(S, device=self.num_real.device)
        self.valid[:, start:start + S] = True
        self.num_real += S
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


# --------------------------------------------------------------------- sizes (chapter 02)
def format_bytes(n: float) -> str:
    """``n`` bytes in binary units with 2 decimals, e.g. ``131072 -> "128.00 KiB"``.

    Raises:
        ValueError: if ``n`` is negative or not a number.
    """
    if isinstance(n, bool) or not isinstance(n, (int, float)) or n < 0:
        raise ValueError(f"n must be a number of bytes >= 0, got {n!r}")
    units = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"]
    x, i = float(n), 0
    while x >= 1024 and i < len(units) - 1:
        x, i = x / 1024, i + 1
    return f"{int(n)} B" if i == 0 else f"{x:.2f} {units[i]}"


def kv_cache_size(config: ModelConfig, batch_size: int, seq_len: int,
                  num_key_value_heads: int | None = None,
                  dtype: torch.dtype = torch.float32) -> dict:
    """Build a real :class:`KVCache` on PyTorch's ``meta`` device (shapes and dtypes, no
    memory) and report its size next to the closed formula.

    Works for real-scale configs too (e.g. ``costmodel.reference_config("Llama-3-8B")``),
    since meta tensors allocate nothing.

    Args:
        config: the model config.
        batch_size: B >= 1.
        seq_len: S tokens per sequence, ``1 <= S <= config.max_position_embeddings``.
        num_key_value_heads: K/V heads to use instead of the config's (must divide
            ``num_attention_heads``; equal to it is MHA, 1 is MQA).
        dtype: storage dtype (bytes per element = ``dtype.itemsize``).

    Returns:
        dict with ``shape`` (per layer, of K and of V: ``[B, n_kv, S, D]``), ``num_tensors``
        (``2 * layers``), ``num_key_value_heads``, ``bytes_per_element``, ``nbytes`` (sum of the
        tensors' ``nbytes``, bytes), ``bytes_per_token`` (``KVCache.bytes_per_token()``),
        ``formula_bytes_per_token`` (:func:`tokenflow.costmodel.kv_cache_bytes_per_token`) and
        ``formula_nbytes`` (``formula_bytes_per_token * B * S``).

    Raises:
        ValueError: on ``batch_size < 1``, ``seq_len`` out of range, or a
            ``num_key_value_heads`` that does not divide ``num_attention_heads``.
    """
    from .costmodel import kv_cache_bytes_per_token
    if isinstance(seq_len, bool) or not isinstance(seq_len, int) or \
            not 1 <= seq_len <= config.max_position_embeddings:
        raise ValueError(f"seq_len must be an int in [1, max_position_embeddings="
                         f"{config.max_position_embeddings}], got {seq_len!r}")
    if num_key_value_heads is not None and num_key_value_heads != config.num_key_value_heads:
        if isinstance(num_key_value_heads, bool) or not isinstance(num_key_value_heads, int) \
                or num_key_value_heads < 1 \
                or config.num_attention_heads % num_key_value_heads != 0:
            raise ValueError(f"num_key_value_heads must be an int >= 1 dividing "
                             f"num_attention_heads={config.num_attention_heads}, "
                             f"got {num_key_value_heads!r}")
        config = config.replace(num_key_value_heads=num_key_value_heads)
    cache = KVCache(config, batch_size, seq_len, dtype=dtype, device="meta")
    itemsize = torch.empty((), dtype=dtype).element_size()
    per_token = kv_cache_bytes_per_token(config, itemsize)
    return dict(shape=list(cache.k[0].shape), num_tensors=len(cache.k) + len(cache.v),
                num_key_value_heads=config.num_key_value_heads, bytes_per_element=itemsize,
                nbytes=cache.nbytes(), bytes_per_token=cache.bytes_per_token(),
                formula_bytes_per_token=per_token,
                formula_nbytes=per_token * batch_size * seq_len)
