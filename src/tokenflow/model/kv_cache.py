"""The KV cache: the interface every storage implements, and the contiguous storage.

The interface (ARCHITECTURE.md, section 2): once per forward pass the model asks the cache for
a :class:`CacheStep` (``begin_step``); each attention layer then makes one ``update(layer,
step, *entries)`` call, which writes the new tokens' entries and returns those of every filled
slot, ``[B, heads, L, dim]`` each. An entry (:func:`cache_entries`) is ``k`` and ``v`` for
grouped-query attention, ``latent`` and ``k_rope`` for multi-head latent attention.

:class:`KVCache` is the contiguous storage (gpt-fast's ``KVCache``, HF's ``StaticCache``; the
paged one is :mod:`tokenflow.serving.paged_kv_cache`). Its ``bytes_per_token()``, measured
from the tensors, equals :func:`tokenflow.analysis.costmodel.kv_cache_bytes_per_token`
(tested): GQA ``2 * layers * n_kv * D * bytes``, MLA ``layers * (kv_lora_rank +
qk_rope_head_dim) * bytes``.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from tokenflow.config import ModelConfig
from tokenflow.validate import integer

__all__ = ["CacheStep", "CacheStorage", "KVCache", "cache_entries", "uncached_step",
           "attention_mask_for"]


def cache_entries(config: ModelConfig) -> tuple[tuple[str, int, int], ...]:
    """What one token stores per layer: ``(name, heads, dim)`` of each entry.

    GQA: ``(("k", n_kv, D), ("v", n_kv, D))``. MLA: ``(("latent", 1, kv_lora_rank),
    ("k_rope", 1, qk_rope_head_dim))`` (DeepSeek-V2 report, arXiv:2405.04434, section 2.1.2:
    the cache holds ``c_t^KV`` and ``k_t^R``).
    """
    c = config
    if c.is_mla:
        return (("latent", 1, c.kv_lora_rank), ("k_rope", 1, c.qk_rope_head_dim))
    return (("k", c.num_key_value_heads, c.head_dim), ("v", c.num_key_value_heads, c.head_dim))


def attention_mask_for(valid: torch.Tensor, start: int, S: int) -> torch.Tensor:
    """Boolean mask ``[B,1,S,L]`` (True = may attend) for ``S`` queries at cache slots
    ``[start, start+S)`` over keys at slots ``[0, L)``, ``L = start + S``.

    A query sees a key when the key's slot is not after its own (causal, correct also when
    the query is shorter than the keys: decode and chunked prefill) and the key is a real
    token (``valid [B,L]``, False for left padding). Every query also sees itself, so a
    padding query never has an empty row (which would make NaNs that leak through V).

    Speed note: when nothing but causality masks a key (no padding, and ``S == 1`` or
    ``start == 0``), the returned tensor carries the attribute ``sdpa_hint`` (``"none"``: no
    key is masked; ``"causal"``: the plain lower-triangular mask), which lets attention call
    SDPA without a mask tensor (``is_causal=True``), a faster kernel with the same result.
    The mask values are the same either way.
    """
    L = start + S
    if S == 1:                               # decode: every filled slot is "not after" the query
        v = valid[:, :L]                                               # [B, L]
        if bool(v.all()):                                              # no padding: all True
            mask = torch.ones(valid.shape[0], 1, 1, L, dtype=torch.bool, device=valid.device)
            mask.sdpa_hint = "none"
            return mask
        mask = v.clone()
        mask[:, start] = True                                          # sees itself
        return mask[:, None, None, :]                                  # [B, 1, 1, L]
    if start == 0 and bool(valid[:, :L].all()):                       # no padding: plain causal
        mask = torch.ones(valid.shape[0], 1, S, L, dtype=torch.bool, device=valid.device)
        mask = mask.tril_()                                            # [B, 1, S, L]
        mask.sdpa_hint = "causal"
        return mask
    q_slot = torch.arange(start, L, device=valid.device)[:, None]     # [S, 1]
    k_slot = torch.arange(L, device=valid.device)[None, :]            # [1, L]
    causal = k_slot <= q_slot                                          # [S, L]
    mask = causal[None] & valid[:, None, :L]                           # [B, S, L]
    mask = mask | (k_slot == q_slot)[None]
    return mask[:, None]                                               # [B, 1, S, L]


@dataclass
class CacheStep:
    """What one forward pass writes and reads: built once by the storage (``begin_step``, or
    :meth:`~tokenflow.PagedKVCache.packed_step`) and handed to every layer, which passes it
    back to ``update`` (nano-vllm's ``Context``, ``nanovllm/utils/context.py``; vLLM's
    attention metadata). One class for the three layouts; a layout leaves the others' fields
    at their defaults.

    Every step:
        start: slot of the first new token; the new tokens go to slots ``[start, start+S)``
            of every row (0 for a packed step).
        positions: ``[B,S]`` int64 RoPE position of each new token (counted from the row's
            first real token; padding gets 0). A packed step: ``[1, T]``, each token's index
            in its own sequence; the model runs the ``T`` tokens as one row ``[1, T, H]``.
        mask: ``[B,1,S,L]`` bool, what each query may see (:func:`attention_mask_for`),
            ``L = start + S`` slots after this step; ``None`` for a packed step (its masks are
            per sequence, :attr:`masks`).

    Paged storage (:class:`~tokenflow.PagedKVCache`), where the tokens live:
        slot_mapping: int64 pool slot each real new token is written to, ``[N]`` row by row
            (``[T]`` for a packed step); vLLM's ``slot_mapping``.
        slots: ``[B, L]`` int64 pool slot of each laid-out token of a ``[B, S]`` step
            (``block * block_size + offset``; padding points at slot 0 and is masked).
        is_new: ``[B, S]`` bool, the real new tokens of a ``[B, S]`` step (False for left
            padding).
        rows: storage data computed once per step for every layer (the pool rows to gather
            and to write, per head count).

    A packed step (``n`` sequences' new tokens end to end, ``T`` in all, no padded position;
    read by :meth:`attend_each`). The first ``num_decode`` sequences have one new token each
    (decode rows); the others are prompt chunks. Their contexts (cached + new tokens,
    ``L_i``) are gathered in that order, **whole blocks** at a time, as a paged-attention
    kernel walks a block table: one ``[heads, blocks * block_size, dim]`` piece per sequence,
    so the layers cut them out with views. The decode rows all read as many blocks as the
    longest of them (``decode_len`` slots, ``L_i`` real tokens at the left) in one batched
    call; each chunk's context is cut to its ``L_i`` tokens and read by a call of its own.
        cu_q: ``n+1`` ints (``cu_seqlens_q``), sequence ``i``'s new tokens are
            ``[cu_q[i], cu_q[i+1])`` of ``T``; ``None`` for a ``[B, S]`` step.
        cu_k: ``n+1`` ints (``cu_seqlens_k``), its gathered context (whole blocks) is
            ``[cu_k[i], cu_k[i+1])``. Plain lists: the layers slice with them, and a tensor
            would cost a sync per read (:attr:`cu_seqlens_q` / :attr:`cu_seqlens_k` give
            the tensors a GPU kernel would take).
        seqlens_k: ``n`` ints, ``L_i``.
        context_blocks: per sequence, the ids of the blocks gathered for it (a decode row
            with fewer blocks than the others is padded with block 0, masked).
        num_decode, decode_len: decode rows first, and the width of their windows.
        masks: ``[num_decode, 1, 1, decode_len]`` for the decode rows (if any), then per
            chunk ``[1, 1, S_i, L_i]`` (causal; :func:`attention_mask_for`).
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

    @property
    def packed(self) -> bool:
        """True for a packed step (sequences end to end, read by :meth:`attend_each`)."""
        return self.cu_q is not None

    @property
    def num_tokens(self) -> int:
        """``T``: the positions this step computes (the sum of its sequences' new tokens)."""
        return self.positions.shape[1]

    @property
    def cu_seqlens_q(self) -> torch.Tensor:
        """``cu_q`` as an ``[n+1]`` int64 tensor."""
        return torch.tensor(self.cu_q, device=self.positions.device)

    @property
    def cu_seqlens_k(self) -> torch.Tensor:
        """``cu_k`` as an ``[n+1]`` int64 tensor."""
        return torch.tensor(self.cu_k, device=self.positions.device)

    def attend_each(self, attend, queries: tuple, entries: tuple) -> torch.Tensor:
        """Attention where each sequence's queries see only its own context.

        Args:
            attend: ``attend(*q, *e, mask) -> [B, heads, S, dim]``, the layer's attention
                on a batch of ``B`` sequences (``q [B, heads, S, .]``, ``e [B, heads, L, .]``).
            queries: tensors ``[1, heads, T, .]`` (new tokens end to end).
            entries: tensors ``[heads * cu_k[n], .]`` (from ``update``): the sequences'
                gathered contexts one after the other, each ``[heads, cu_k[i+1] - cu_k[i],
                .]`` with its ``L_i`` real tokens first.

        Returns:
            ``[1, heads, T, dim]``: the sequences' outputs, end to end again.
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


PackedCacheStep = CacheStep
"""The earlier name of a packed :class:`CacheStep` (``step.packed`` tells them apart)."""


def uncached_step(attention_mask: torch.Tensor | None, input_ids: torch.Tensor) -> CacheStep:
    """The :class:`CacheStep` of a forward pass without a cache: the ``S`` new tokens attend
    among themselves (``start = 0``), positions ``cumsum(mask) - 1`` (0 for padding)."""
    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids, dtype=torch.bool)
    m = attention_mask.to(torch.long)
    positions = (torch.cumsum(m, dim=1) - 1).clamp(min=0)                 # [B, S]
    return CacheStep(0, positions, attention_mask_for(attention_mask.to(torch.bool), 0,
                                                      input_ids.shape[1]))


class CacheStorage:
    """The cache interface: what a storage (contiguous, paged) must implement.

    Attributes every storage has: ``config``, ``batch_size``, ``dtype``, ``device``,
    ``entries`` (:func:`cache_entries` of the config), ``length`` (slots claimed so far;
    the same for every row), ``num_real [B]`` (real tokens per row).

    Methods to implement: :meth:`begin_step`, :meth:`update`, :meth:`read`, :meth:`reset`,
    :meth:`nbytes`, :meth:`bytes_per_token`. :meth:`check_model` is shared.
    """

    config: ModelConfig
    batch_size: int
    dtype: torch.dtype
    device: torch.device
    entries: tuple[tuple[str, int, int], ...]
    length: int
    num_real: torch.Tensor

    def begin_step(self, attention_mask: torch.Tensor | None, batch_size: int, S: int
                   ) -> CacheStep:
        """Claim slots for ``S`` new tokens per row and describe the step.

        ``attention_mask [B,S]`` (1 real, 0 left padding; ``None``: all real). Called once per
        forward pass, before any layer writes.

        Raises:
            ValueError: batch size differs from the cache's, or the tokens do not fit.
        """
        raise NotImplementedError

    def update(self, layer_idx: int, step: CacheStep, *new: torch.Tensor
               ) -> tuple[torch.Tensor, ...]:
        """Write the new tokens' entries of one layer (one tensor per entry of
        :attr:`entries`, each ``[B, heads, S, dim]``) and return every filled slot's entries,
        ``[B, heads, L, dim]`` each, in the same order, for attention to read."""
        raise NotImplementedError

    def read(self, layer_idx: int, stop: int) -> tuple[torch.Tensor, ...]:
        """The entries of slots ``[0, stop)`` of one layer (``[B, heads, stop, dim]`` each),
        without writing."""
        raise NotImplementedError

    def reset(self) -> None:
        """Forget every token (length 0), keeping the allocated memory."""
        raise NotImplementedError

    def nbytes(self) -> int:
        """Bytes allocated for the entries across all layers."""
        raise NotImplementedError

    def bytes_per_token(self) -> int:
        """Bytes one token occupies, all layers and entries; equals
        :func:`tokenflow.analysis.costmodel.kv_cache_bytes_per_token` at this dtype."""
        raise NotImplementedError

    def check_model(self, config: ModelConfig, dtype: torch.dtype, device: torch.device) -> None:
        """Raise ``ValueError`` unless a model with this config, parameter dtype and device can
        use the cache (checked once per forward pass, before any layer runs)."""
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
    """Contiguous cache storage: preallocated per-layer entries for a batch of sequences.

    Args:
        config: the model config (layers; KV heads and head_dim, or the MLA ranks).
        batch_size: B.
        max_len: capacity in tokens per sequence (prompt + generated); defaults to
            ``config.max_position_embeddings`` and may not exceed it.
        dtype, device: storage dtype and device (must match the model's parameters).

    Attributes:
        k, v: GQA: lists of ``[B, n_kv, max_len, D]`` tensors, one per layer.
        latent, k_rope: MLA: lists of ``[B, 1, max_len, kv_lora_rank]`` and
            ``[B, 1, max_len, qk_rope_head_dim]`` tensors, one per layer.
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
        """See :meth:`CacheStorage.begin_step`: the new tokens take slots
        ``[length, length+S)``."""
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
        """See :meth:`CacheStorage.update`: slots ``[step.start, step.start+S)``."""
        bufs = self.layers[layer_idx]
        start, S = step.start, new[0].shape[2]
        for buf, x in zip(bufs, new):
            buf.narrow(2, start, S).copy_(x)          # buf[:, :, start:start+S] = x
        return tuple(buf.narrow(2, 0, start + S) for buf in bufs)        # buf[:, :, :end]

    def read(self, layer_idx: int, stop: int) -> tuple[torch.Tensor, ...]:
        """See :meth:`CacheStorage.read`."""
        return tuple(buf.narrow(2, 0, stop) for buf in self.layers[layer_idx])

    def reset(self) -> None:
        """See :meth:`CacheStorage.reset`: the next ``prefill`` starts a new sequence."""
        self.valid.zero_()
        self.num_real.zero_()
        self.length = 0

    # ---------------------------------------------------------------- reporting
    def nbytes(self) -> int:
        """Bytes allocated for the entries across all layers (capacity, not just the filled
        part)."""
        return sum(t.nbytes for bufs in self.layers for t in bufs)

    def nbytes_used(self) -> int:
        """Bytes of the filled slots: ``nbytes() * length / max_len``."""
        return self.nbytes() * self.length // self.max_len

    def bytes_per_token(self) -> int:
        """Bytes one token occupies in this cache, all layers and entries."""
        return self.nbytes() // (self.max_len * self.batch_size)

    def __repr__(self) -> str:
        c, B, L = self.config, self.batch_size, self.max_len
        if c.is_mla:
            return (f"KVCache(layers={c.num_hidden_layers}, MLA per layer: latent "
                    f"[{B}, 1, {L}, {c.kv_lora_rank}] + RoPE key [{B}, 1, {L}, "
                    f"{c.qk_rope_head_dim}], filled={self.length})")
        return (f"KVCache(layers={c.num_hidden_layers}, shape per layer K/V="
                f"[{B}, {c.num_key_value_heads}, {L}, {c.head_dim}], filled={self.length})")
