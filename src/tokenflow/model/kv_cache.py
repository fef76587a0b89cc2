"""The KV cache: the interface every storage implements (ARCHITECTURE.md, section 2) and the
contiguous storage :class:`KVCache` (gpt-fast's ``KVCache``, HF's ``StaticCache``; the paged
one is :mod:`tokenflow.serving.paged_kv_cache`). Once per pass the model asks for a
:class:`CacheStep` (``begin_step``); each layer makes one ``update(layer, step, *entries)``.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from tokenflow.config import ModelConfig
from tokenflow.validate import integer

__all__ = ["CacheStep", "CacheStorage", "KVCache", "cache_entries", "uncached_step",
           "attention_mask_for"]


def cache_entries(config: ModelConfig) -> tuple[tuple[str, int, int], ...]:
    """``(name, heads, dim)`` of each entry one token stores per layer: GQA ``k``, ``v``
    ``(n_kv, D)``; MLA ``latent`` ``(1, kv_lora_rank)``, ``k_rope`` ``(1, qk_rope_head_dim)``."""
    c = config
    if c.is_mla:
        return (("latent", 1, c.kv_lora_rank), ("k_rope", 1, c.qk_rope_head_dim))
    return (("k", c.num_key_value_heads, c.head_dim), ("v", c.num_key_value_heads, c.head_dim))


def attention_mask_for(valid: torch.Tensor, start: int, S: int) -> torch.Tensor:
    """Bool mask ``[B,1,S,S_k]`` (True: may attend) for queries at slots ``[start, start+S)``
    over keys at ``[0, S_k)``, ``S_k = start + S``: causal, real keys only
    (``valid [B,S_k]``), and each query sees itself (a padding query's row is never empty: no
    NaN). Without padding it carries ``sdpa_hint`` (``"none"``: nothing masked, ``"causal"``),
    so SDPA may skip it."""
    S_k = start + S
    if S == 1:                               # decode: every filled slot is "not after" the query
        v = valid[:, :S_k]                                               # [B, S_k]
        if bool(v.all()):                                              # no padding: all True
            mask = torch.ones(valid.shape[0], 1, 1, S_k, dtype=torch.bool, device=valid.device)
            mask.sdpa_hint = "none"
            return mask
        mask = v.clone()
        mask[:, start] = True                                          # sees itself
        return mask[:, None, None, :]                                  # [B, 1, 1, S_k]
    if start == 0 and bool(valid[:, :S_k].all()):                       # no padding: plain causal
        mask = torch.ones(valid.shape[0], 1, S, S_k, dtype=torch.bool, device=valid.device)
        mask = mask.tril_()                                            # [B, 1, S, S_k]
        mask.sdpa_hint = "causal"
        return mask
    q_slot = torch.arange(start, S_k, device=valid.device)[:, None]     # [S, 1]
    k_slot = torch.arange(S_k, device=valid.device)[None, :]            # [1, S_k]
    causal = k_slot <= q_slot                                          # [S, S_k]
    mask = causal[None] & valid[:, None, :S_k]                           # [B, S, S_k]
    mask = mask | (k_slot == q_slot)[None]
    return mask[:, None]                                               # [B, 1, S, S_k]


@dataclass
class CacheStep:
    """What one forward pass writes and reads, made once by the storage and handed to every
    layer (nano-vllm's ``Context``, ``nanovllm/utils/context.py``; vLLM's attention metadata).
    A layout leaves the others' fields at their defaults.

    Every step: ``start`` (new tokens take slots ``[start, start+S)``; 0 when packed),
    ``positions [B,S]`` int64 (RoPE, from a row's first real token; padding 0; packed
    ``[1, T]``), ``mask [B,1,S,L]`` (:func:`attention_mask_for`; ``None`` when packed).

    Paged: ``slot_mapping`` (pool slot of each real new token, vLLM's), ``slots [B, L]``
    (pool slot of each laid-out token; padding slot 0, masked), ``is_new [B, S]``, ``rows``
    (per-step storage data for every layer).

    Packed (``n`` sequences end to end, ``T`` tokens, :meth:`attend_each`): the first
    ``num_decode`` have one new token; contexts are gathered in whole blocks, the decode rows
    ``decode_len`` slots wide. ``cu_q``, ``cu_k``: ``n+1`` ints (``cu_seqlens_q/k``; lists,
    so slicing costs no sync), ``seqlens_k`` (``L_i``), ``context_blocks``, ``masks``
    (``[num_decode,1,1,decode_len]`` then ``[1,1,S_i,L_i]`` per chunk).
    """

    start: int
    positions: torch.Tensor
    mask: torch.Tensor | None
    slot_mapping: torch.Tensor | None = None
    slots: torch.Tensor | None = None
    is_new: torch.Tensor | None = None
    rows: dict = field(default_factory=dict)
    cu_q: list | None = None
    cu_k: list = field(default_factory=list)
    seqlens_k: list = field(default_factory=list)
    context_blocks: list = field(default_factory=list)
    num_decode: int = 0
    decode_len: int = 0
    masks: list = field(default_factory=list)

    packed = property(lambda self: self.cu_q is not None, doc="True for a packed step.")
    num_tokens = property(lambda self: self.positions.shape[1], doc="T, positions computed.")
    cu_seqlens_q = property(lambda self: torch.tensor(self.cu_q, device=self.positions.device),
                            doc="``cu_q`` as an ``[n+1]`` int64 tensor.")
    cu_seqlens_k = property(lambda self: torch.tensor(self.cu_k, device=self.positions.device),
                            doc="``cu_k`` as an ``[n+1]`` int64 tensor.")

    def attend_each(self, attend, queries: tuple, entries: tuple) -> torch.Tensor:
        """Each sequence's queries (``[1, heads, T, .]``) over its own context only:
        ``attend(*q, *e, mask) -> [B, heads, S, dim]`` on the decode rows in one call, then
        per chunk; ``entries`` ``[heads * cu_k[n], .]`` from ``update``. -> ``[1, heads, T, dim]``.
        """
        out, n, L = [], self.num_decode, self.decode_len
        cu_q, cu_k = self.cu_q, self.cu_k
        heads = [e.shape[0] // cu_k[-1] for e in entries]
        if n:                                   # decode rows: [n, heads, 1 | L, .], one call
            q_d = [q.transpose(0, 2)[:n] for q in queries]                    # [n, h, 1, .]
            e_d = [e[:n * h * L].view(n, h, L, -1) for e, h in zip(entries, heads)]
            out.append(attend(*q_d, *e_d, self.masks[0]).transpose(0, 2))     # [1, h, n, dim]
        for i, mask in zip(range(n, len(cu_q) - 1), self.masks[1 if n else 0:]):
            q_i = [q[:, :, cu_q[i]:cu_q[i + 1]] for q in queries]          # [1, h, S_i, .]
            width, L_i = cu_k[i + 1] - cu_k[i], self.seqlens_k[i]     # whole blocks, real
            e_i = [e[h * cu_k[i]:h * cu_k[i + 1]].view(1, h, width, -1)[:, :, :L_i]
                   for e, h in zip(entries, heads)]                        # [1, h, L_i, .]
            out.append(attend(*q_i, *e_i, mask))                           # [1, h, S_i, dim]
        return torch.cat(out, dim=2) if len(out) > 1 else out[0]           # [1, h, T, dim]


PackedCacheStep = CacheStep                   # the earlier name of a packed CacheStep


def uncached_step(attention_mask: torch.Tensor | None, input_ids: torch.Tensor) -> CacheStep:
    """The :class:`CacheStep` of a pass without a cache: ``start = 0``, positions
    ``cumsum(mask) - 1`` (0 for padding)."""
    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids, dtype=torch.bool)
    m = attention_mask.to(torch.long)
    positions = (torch.cumsum(m, dim=1) - 1).clamp(min=0)                 # [B, S]
    return CacheStep(0, positions, attention_mask_for(attention_mask.to(torch.bool), 0,
                                                      input_ids.shape[1]))


class CacheStorage:
    """The cache interface a storage (contiguous, paged) implements; ``length`` is the slots
    claimed (every row), ``num_real [B]`` the real tokens per row."""

    config: ModelConfig
    batch_size: int
    dtype: torch.dtype
    device: torch.device
    entries: tuple[tuple[str, int, int], ...]
    length: int
    num_real: torch.Tensor

    def begin_step(self, attention_mask: torch.Tensor | None, batch_size: int, S: int
                   ) -> CacheStep:
        """Claim slots for ``S`` new tokens per row (``attention_mask [B,S]``: 1 real, 0 left
        padding, ``None`` all real), once per pass. Raises ``ValueError`` (batch size, no room).
        """
        raise NotImplementedError

    def update(self, layer_idx: int, step: CacheStep, *new: torch.Tensor
               ) -> tuple[torch.Tensor, ...]:
        """Write one layer's new entries (``[B, heads, S, dim]`` each, in :attr:`entries`
        order) and return every filled slot's, ``[B, heads, L, dim]`` each."""
        raise NotImplementedError

    def read(self, layer_idx: int, stop: int) -> tuple[torch.Tensor, ...]:
        """One layer's entries of slots ``[0, stop)``, without writing."""
        raise NotImplementedError

    def reset(self) -> None:
        """Forget every token, keeping the memory."""
        raise NotImplementedError

    def nbytes(self) -> int:
        """Bytes allocated for the entries across all layers."""
        raise NotImplementedError

    def bytes_per_token(self) -> int:
        """Bytes per token, all layers and entries (equals the cost model's
        ``kv_cache_bytes_per_token``, tested)."""
        raise NotImplementedError

    def check_model(self, config: ModelConfig, dtype: torch.dtype, device: torch.device) -> None:
        """Raise ``ValueError`` unless a model of this config, dtype and device can use it."""
        if self.entries != cache_entries(config) or \
                self.config.num_hidden_layers != config.num_hidden_layers:
            raise ValueError(f"kv_cache was built for another model: it stores {self.entries} "
                             f"x {self.config.num_hidden_layers} layers, the model needs "
                             f"{cache_entries(config)} x {config.num_hidden_layers}")
        if self.dtype != dtype:
            raise ValueError(f"kv_cache dtype {self.dtype} does not match the model's "
                             f"parameters ({dtype}); build the cache with dtype={dtype}")
        if self.device != device:
            raise ValueError(f"kv_cache device {self.device} does not match the model's "
                             f"parameters ({device}); build the cache with device={device}")


class KVCache(CacheStorage):
    """Contiguous storage: one ``[B, heads, max_len, dim]`` tensor per layer and entry (``k``,
    ``v`` or ``latent``, ``k_rope``); ``max_len`` tokens per row (default and most
    ``max_position_embeddings``); ``valid [B, max_len]`` marks real tokens. ``dtype`` and
    ``device`` must be the model's. Raises ``ValueError`` for ``batch_size`` or ``max_len``.
    """

    def __init__(self, config: ModelConfig, batch_size: int, max_len: int | None = None,
                 dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"):
        if max_len is None:
            max_len = config.max_position_embeddings
        integer("batch_size", batch_size, 1)
        integer("max_len", max_len, 1, config.max_position_embeddings,
                hi_name="max_position_embeddings")
        self.config, self.batch_size, self.max_len = config, batch_size, max_len
        self.entries = cache_entries(config)
        self.layers = [tuple(torch.zeros(batch_size, heads, max_len, dim, dtype=dtype,
                                         device=device) for _, heads, dim in self.entries)
                       for _ in range(config.num_hidden_layers)]
        self.valid = torch.zeros(batch_size, max_len, dtype=torch.bool, device=device)
        self.num_real = torch.zeros(batch_size, dtype=torch.long, device=device)
        self.dtype, self.device = dtype, self.valid.device
        self.length = 0

    def _entry(self, name: str) -> list[torch.Tensor]:
        names = [n for n, _, _ in self.entries]
        if name not in names:
            raise AttributeError(f"this cache stores {names}, not {name!r}")
        i = names.index(name)
        return [bufs[i] for bufs in self.layers]

    k = property(lambda self: self._entry("k"), doc="GQA keys, one tensor per layer.")
    v = property(lambda self: self._entry("v"), doc="GQA values, one tensor per layer.")
    latent = property(lambda self: self._entry("latent"), doc="MLA latents, per layer.")
    k_rope = property(lambda self: self._entry("k_rope"), doc="MLA RoPE keys, per layer.")

    # ---------------------------------------------------------------- the interface
    def begin_step(self, attention_mask: torch.Tensor | None, batch_size: int, S: int
                   ) -> CacheStep:
        """:meth:`CacheStorage.begin_step`: slots ``[length, length+S)``."""
        if batch_size != self.batch_size:
            raise ValueError(f"input batch size {batch_size} does not match the cache's "
                             f"{self.batch_size}")
        if self.length + S > self.max_len:
            raise ValueError(
                f"sequence too long for the KV cache: {self.length} cached + {S} new tokens > "
                f"max_len={self.max_len}")
        start = self.length
        if attention_mask is None:                   # all real (the decode loop's case)
            if S == 1:
                positions = self.num_real[:, None].clone()                    # [B, 1]
            else:
                positions = self.num_real[:, None] + torch.arange(S, device=self.device)
            self.valid[:, start:start + S] = True
            self.num_real += S
        else:
            mask = attention_mask.to(torch.bool)
            positions = self.num_real[:, None] + torch.cumsum(mask.long(), dim=1) - 1
            positions = positions.clamp(min=0)                                 # [B, S]
            self.valid[:, start:start + S] = mask
            self.num_real += mask.long().sum(dim=1)
        self.length += S
        return CacheStep(start, positions, attention_mask_for(self.valid, start, S))

    def update(self, layer_idx: int, step: CacheStep, *new: torch.Tensor
               ) -> tuple[torch.Tensor, ...]:
        bufs = self.layers[layer_idx]
        start, S = step.start, new[0].shape[2]
        for buf, x in zip(bufs, new):
            buf.narrow(2, start, S).copy_(x)          # buf[:, :, start:start+S] = x
        return tuple(buf.narrow(2, 0, start + S) for buf in bufs)        # buf[:, :, :end]

    def read(self, layer_idx: int, stop: int) -> tuple[torch.Tensor, ...]:
        return tuple(buf.narrow(2, 0, stop) for buf in self.layers[layer_idx])

    def reset(self) -> None:
        self.valid.zero_()
        self.num_real.zero_()
        self.length = 0

    # ---------------------------------------------------------------- reporting
    def nbytes(self) -> int:
        """Bytes allocated (capacity, not only the filled part)."""
        return sum(t.nbytes for bufs in self.layers for t in bufs)

    def nbytes_used(self) -> int:
        """Bytes of the filled slots: ``nbytes() * length / max_len``."""
        return self.nbytes() * self.length // self.max_len

    def bytes_per_token(self) -> int:
        return self.nbytes() // (self.max_len * self.batch_size)

    def __repr__(self) -> str:
        c, B, L = self.config, self.batch_size, self.max_len
        if c.is_mla:
            return (f"KVCache(layers={c.num_hidden_layers}, MLA per layer: latent "
                    f"[{B}, 1, {L}, {c.kv_lora_rank}] + RoPE key [{B}, 1, {L}, "
                    f"{c.qk_rope_head_dim}], filled={self.length})")
        return (f"KVCache(layers={c.num_hidden_layers}, shape per layer K/V="
                f"[{B}, {c.num_key_value_heads}, {L}, {c.head_dim}], filled={self.length})")
