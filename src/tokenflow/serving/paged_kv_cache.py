"""The paged KV cache: the storage of the serving engine, behind the same interface.

**The interface** is :mod:`tokenflow.model.kv_cache`'s (ARCHITECTURE.md): the model asks the
cache for a :class:`~tokenflow.model.kv_cache.CacheStep` once per forward pass (``begin_step``) and
each attention layer makes one ``update(layer, step, *entries)`` call, which writes the new
tokens' entries and returns the entries to attend over, ``[B, heads, L, dim]`` each. The
entries are those of :func:`~tokenflow.model.kv_cache.cache_entries` (GQA ``k``, ``v``; MLA
``latent``, ``k_rope``), so attention (:mod:`tokenflow.model.attention`, :mod:`tokenflow.model.mla`)
does not know which storage it talks to.

**The storage** (vLLM's PagedAttention, Kwon et al. 2023, arXiv:2309.06180, section 4.1): per
layer and entry one preallocated pool ``[num_blocks, heads, block_size, dim]`` (the
contiguous cache's ``[B, heads, max_len, dim]`` with sequences cut into blocks). A sequence
owns a *block table* (from :class:`tokenflow.serving.BlockManager`); its token ``i`` lives in
slot ``block_table[i // block_size] * block_size + i % block_size``. Blocks of a shared
prompt prefix appear in several block tables: their entries are computed once.

**One step.** Before the forward pass the runner calls :meth:`PagedKVCache.prepare` with the
batch's block tables, how many tokens of each sequence are already cached and how many are
new (a prefill chunk or one decode token: ragged). The new tokens come as ``input_ids
[B, S]``, ``S`` = the longest row, each row left-padded. ``begin_step`` lays every sequence
out right-aligned in ``L = max(cached + new)`` slots, as the contiguous cache does with
left padding, so the mask is :func:`~tokenflow.model.kv_cache.attention_mask_for` of the same
``valid [B, L]`` table; the new tokens are the last ``S`` slots. ``update`` writes the real
new tokens to their pool slots (``slot_mapping``) and **gathers** each row's ``L`` slots
through its block table into a ``[B, heads, L, dim]`` tensor (one ``index_select`` on the
pool viewed as rows of ``dim`` values, :func:`pool_rows`). The gather copies the context once
per layer; real engines read the blocks inside the attention kernel instead (vLLM's
paged-attention kernel, FlashInfer). Here readability wins: no custom kernel.

**A packed step** (what the serving engine runs; nano-vllm's ``prepare_prefill`` /
``prepare_decode``, vLLM's flattened batch). No row is padded: the ``n`` sequences' new
tokens lie end to end, ``input_ids [T]`` with ``T = sum(num_new)``.
:meth:`PagedKVCache.packed_step` turns the block tables and counts into a
packed :class:`~tokenflow.model.kv_cache.CacheStep`: ``positions [T]``, ``slot_mapping [T]``
(where each new token is written), ``cu_seqlens_q [n+1]`` (where each sequence's new tokens
start in ``T``) and ``cu_seqlens_k [n+1]`` (where its gathered context starts). ``update``
writes the ``T`` new entries and gathers each sequence's context **block by block**, as a
paged-attention kernel walks a block table: the sequence's first ``ceil(L_i / block_size)``
blocks, whole, one index per block and head (:func:`block_rows`), so each context arrives as
one ``[heads, blocks * block_size, dim]`` piece with its ``L_i`` tokens first. Attention then
keeps each sequence to its own piece (``CacheStep.attend_each``, views, no copy): the
decode rows in one batched call (each reads as many blocks as the longest decode context,
the slots after its own ``L_i`` masked: wasted keys, never a wasted position; their pieces
side by side are one ``[n_dec, heads, width, dim]`` tensor), each prompt chunk in a call of
its own, its piece cut to ``L_i``. Every index a layer reads or writes is computed once per
step, in ``packed_step``.

Bytes per token (all layers) are the contiguous cache's; ``bytes_per_token()`` measured from
the pools equals :func:`tokenflow.analysis.costmodel.kv_cache_bytes_per_token` (tested).
"""
from __future__ import annotations

from itertools import accumulate

import torch

from tokenflow.config import ModelConfig
from tokenflow.validate import integer
from tokenflow.model.kv_cache import CacheStep, CacheStorage, attention_mask_for, cache_entries

__all__ = ["PagedKVCache", "pool_rows", "block_rows"]

PagedCacheStep = CacheStep
"""The earlier name of a paged :class:`~tokenflow.model.kv_cache.CacheStep` (one class for
every layout)."""


def pool_rows(slots: torch.Tensor, heads: int, block_size: int) -> torch.Tensor:
    """Row of each (slot, head) in a pool ``[num_blocks, heads, block_size, dim]`` viewed as
    ``[num_blocks * heads * block_size, dim]``: ``block * heads * block_size + head *
    block_size + offset``, with ``block, offset = divmod(slot, block_size)``.

    Shape: ``slots [...]`` -> ``[..., heads]`` int64. With these rows one ``index_select``
    reads (one ``index_copy_`` writes) whole ``dim`` vectors, over 10x faster on CPU than
    indexing the 4-D pool with block and offset tensors.
    """
    head = torch.arange(heads, device=slots.device) * block_size                  # [heads]
    first = (slots // block_size) * (heads * block_size) + slots % block_size     # [...]
    return first[..., None] + head                                                 # [..., heads]


def block_rows(blocks: list[list[int]], heads: int) -> list[int]:
    """Rows to gather whole blocks from a pool ``[num_blocks, heads, block_size, dim]``
    viewed as ``[num_blocks * heads, block_size, dim]``: block ``b``'s head ``h`` is row ``b *
    heads + h``. Listed sequence by sequence, head-major within each (for each head, the
    sequence's blocks in order), so that the gathered ``block_size``-slot pieces of one
    sequence form one ``[heads, blocks * block_size, dim]`` block.

    Shape: ``blocks`` (per sequence, its block ids) -> ``heads * (total blocks)`` ints.
    """
    return [b * heads + h for seq in blocks for h in range(heads) for b in seq]


def _decode_mask(lengths: list[int], width: int, device) -> torch.Tensor:
    """The decode windows' mask ``[n_dec, 1, 1, width]``: slot ``j`` of window ``i`` holds a
    real token when ``j < lengths[i]``. It is :func:`attention_mask_for` of those rows,
    built without its checks: a decode row's new token is its last real slot, so causality
    hides nothing that padding does not. Marked ``sdpa_hint = "none"`` when every context
    fills its window (nothing is masked)."""
    seen = torch.arange(width, device=device) < torch.tensor(lengths, device=device)[:, None]
    mask = seen.view(len(lengths), 1, 1, width)                       # [n_dec, 1, 1, width]
    if min(lengths) == width:
        mask.sdpa_hint = "none"
    return mask


class PagedKVCache(CacheStorage):
    """Paged cache storage: per-layer pools of fixed-size blocks, read through block tables.

    Args:
        config: the model config (layers; KV heads and head_dim, or the MLA ranks).
        num_blocks: blocks in each pool (int >= 1).
        block_size: token slots per block (int >= 1; vLLM's default is 16).
        dtype, device: storage dtype and device (must match the model's parameters).

    Attributes:
        layers: per layer, one pool ``[num_blocks, heads, block_size, dim]`` per entry of
            :attr:`entries` (GQA ``k``, ``v``; MLA ``latent``, ``k_rope``).
        batch_size, length, num_real: of the prepared (or last) step: rows ``B``, slots laid
            out before its new tokens (``L - S``), tokens per row ``[B]``.

    Raises:
        ValueError: if ``num_blocks`` or ``block_size`` is not an int >= 1.
    """

    def __init__(self, config: ModelConfig, num_blocks: int, block_size: int = 16,
                 dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"):
        integer("num_blocks", num_blocks, 1)
        integer("block_size", block_size, 1)
        self.config, self.num_blocks, self.block_size = config, num_blocks, block_size
        self.entries = cache_entries(config)
        self.layers = [tuple(torch.zeros(num_blocks, heads, block_size, dim, dtype=dtype,
                                         device=device) for _, heads, dim in self.entries)
                       for _ in range(config.num_hidden_layers)]
        self.dtype, self.device = dtype, self.layers[0][0].device
        self.reset()

    # ---------------------------------------------------------------- the batch of a step
    def prepare(self, block_tables: list[list[int]], num_computed: list[int],
                num_new: list[int]) -> None:
        """Say which sequences the next forward pass runs (call before each ``model(...)``).

        Args:
            block_tables: per row, the ids of its blocks in token order (covering at least
                ``num_computed + num_new`` tokens).
            num_computed: per row, tokens already in the cache (their slots are read, not
                written; prefix-cache hits count here).
            num_new: per row, new tokens in this pass (>= 1): the row's last ``num_new``
                columns of ``input_ids``; the columns before them are padding.

        Raises:
            ValueError: lists of different lengths, counts out of range, a block table too
                short or a block id outside ``[0, num_blocks)``.
        """
        self._check_batch(block_tables, num_computed, num_new)
        B = len(block_tables)
        width = max(len(t) for t in block_tables)         # short tables padded with block 0
        self._tables = torch.tensor([t + [0] * (width - len(t)) for t in block_tables],
                                    device=self.device)                 # [B, blocks]
        self.num_real = torch.tensor(num_computed, device=self.device)   # [B]
        self._num_new = torch.tensor(num_new, device=self.device)      # [B]
        self.batch_size = B
        self.length = max(c + n for c, n in zip(num_computed, num_new)) - max(num_new)

    def _check_batch(self, block_tables, num_computed, num_new) -> None:
        """Raise ``ValueError`` unless the lists describe a batch this pool can hold."""
        B = len(block_tables)
        if B < 1 or len(num_computed) != B or len(num_new) != B:
            raise ValueError(f"block_tables, num_computed and num_new must have the same length "
                             f">= 1, got {B}, {len(num_computed)}, {len(num_new)}")
        if min(num_computed) < 0 or min(num_new) < 1:
            raise ValueError(f"num_computed must be >= 0 and num_new >= 1, got {num_computed} "
                             f"and {num_new}")
        for b, (table, n) in enumerate(zip(block_tables, num_computed)):
            need = -(-(n + num_new[b]) // self.block_size)
            if len(table) < need or any(not 0 <= i < self.num_blocks for i in table[:need]):
                raise ValueError(f"block_tables[{b}] must hold {need} block ids in [0, "
                                 f"num_blocks={self.num_blocks}), got {table}")

    def packed_step(self, block_tables: list[list[int]], num_computed: list[int],
                    num_new: list[int]) -> CacheStep:
        """Describe a packed step (see the module docstring): sequence ``i`` has
        ``num_computed[i]`` tokens in its blocks and ``num_new[i]`` new ones, which come end
        to end in ``input_ids [T]``. Pass the result to ``model.forward_packed``. The leading
        sequences with one new token are attended as one batch (put decode rows first).

        Args and errors: as :meth:`prepare`.

        Returns:
            a packed :class:`~tokenflow.model.kv_cache.CacheStep` with ``T = sum(num_new)`` new
            tokens.
        """
        self._check_batch(block_tables, num_computed, num_new)
        dev, bs, n = self.device, self.block_size, len(num_new)
        n_dec = next((i for i, m in enumerate(num_new) if m != 1), n)      # decode rows
        total = [c + m for c, m in zip(num_computed, num_new)]               # L_i
        # the whole blocks each sequence reads: its first ceil(L_i / bs); every decode row
        # as many as the longest of them (a shorter table padded with block 0, masked)
        reads = [-(-L // bs) for L in total]
        reads[:n_dec] = [max(reads[:n_dec], default=0)] * n_dec
        blocks = [(t + [0] * k)[:k] for t, k in zip(block_tables, reads)]
        width = reads[0] * bs if n_dec else 0                              # decode_len
        cu_q, cu_k = [0, *accumulate(num_new)], [0, *accumulate(k * bs for k in reads)]
        # each new token: its position p, and its slot table[p // bs] * bs + p % bs
        new_tokens = [(t, p) for t, c, L in zip(block_tables, num_computed, total)
                      for p in range(c, L)]                                # [T]
        slot_mapping = torch.tensor([t[p // bs] * bs + p % bs for t, p in new_tokens],
                                    device=dev)
        masks = [_decode_mask(total[:n_dec], width, dev)] if n_dec else []
        masks += [attention_mask_for(torch.ones(1, L, dtype=torch.bool, device=dev), c, m)
                  for c, m, L in zip(num_computed[n_dec:], num_new[n_dec:], total[n_dec:])]
        positions = torch.tensor([[p for _, p in new_tokens]], device=dev)      # [1, T]
        step = CacheStep(0, positions, None, slot_mapping=slot_mapping, cu_q=cu_q, cu_k=cu_k,
                         seqlens_k=total, context_blocks=blocks, num_decode=n_dec,
                         decode_len=width, masks=masks)
        # every layer's gather (read: whole blocks) and write rows, once; the writes
        # head-major, as the new entries come ([1, heads, T, dim])
        for heads in {h for _, h, _ in self.entries}:
            step.rows[heads] = (torch.tensor(block_rows(blocks, heads), device=dev),
                                pool_rows(slot_mapping, heads, bs).T.reshape(-1))
        return step

    # ---------------------------------------------------------------- the interface
    def begin_step(self, attention_mask: torch.Tensor | None, batch_size: int, S: int
                   ) -> CacheStep:
        """See :meth:`CacheStorage.begin_step`: rows laid out right-aligned in ``L`` slots,
        the ``S`` new tokens in the last ``S``. The padding comes from :meth:`prepare`, so
        ``attention_mask`` must be ``None``.

        Raises:
            ValueError: nothing prepared, an ``attention_mask`` given, or ``batch_size`` /
                ``S`` not those of the prepared batch.
        """
        if self._tables is None:
            raise ValueError("call PagedKVCache.prepare(block_tables, num_computed, num_new) "
                             "before each forward pass")
        S_max = int(self._num_new.max())
        if attention_mask is not None or batch_size != self.batch_size or S != S_max:
            raise ValueError(f"the prepared batch is input_ids [{self.batch_size}, {S_max}] "
                             f"with attention_mask=None, got [{batch_size}, {S}] and "
                             f"{'a mask' if attention_mask is not None else 'no mask'}")
        start, total = self.length, self.num_real + self._num_new           # total [B]
        L = start + S
        token = torch.arange(L, device=self.device) - (L - total[:, None])  # [B, L]
        valid = token >= 0                        # left padding before each row's token 0
        token = token.clamp(min=0)
        block = self._tables.gather(1, token // self.block_size)          # [B, L]
        slots = block * self.block_size + token % self.block_size         # [B, L]
        is_new = token[:, start:] >= self.num_real[:, None]               # [B, S]
        is_new &= valid[:, start:]
        self.num_real, self.length, self._tables, self._slots = total, L, None, slots
        step = CacheStep(start, token[:, start:], attention_mask_for(valid, start, S),
                         slot_mapping=slots[:, start:][is_new], slots=slots, is_new=is_new)
        for heads in {h for _, h, _ in self.entries}:
            read = pool_rows(slots, heads, self.block_size).transpose(1, 2)   # [B, heads, L]
            write = pool_rows(step.slot_mapping, heads, self.block_size)      # [N, heads]
            step.rows[heads] = (read.reshape(-1), write.reshape(-1))
        return step

    def update(self, layer_idx: int, step: CacheStep, *new: torch.Tensor
               ) -> tuple[torch.Tensor, ...]:
        """See :meth:`CacheStorage.update`: write the real new tokens to
        ``step.slot_mapping``, then gather every row's ``L`` slots (``step.slots``).
        A packed step: write the ``T`` new tokens (``new`` are ``[1, heads, T,
        dim]``), return the gathered contexts flat, ``[heads * cu_seqlens_k[-1], dim]``,
        sequence after sequence, each its whole blocks ``[heads, blocks * block_size, dim]``
        (cut by :meth:`~tokenflow.model.kv_cache.CacheStep.attend_each`)."""
        if step.packed:
            return self._update_packed(layer_idx, step, new)
        B, L = step.slots.shape
        out = []
        for pool, x in zip(self.layers[layer_idx], new):
            _, heads, _, dim = pool.shape
            read, write = step.rows[heads]
            flat = pool.view(-1, dim)                        # [num_blocks*heads*bs, dim]
            flat.index_copy_(0, write, x.transpose(1, 2)[step.is_new].reshape(-1, dim))
            out.append(flat.index_select(0, read).view(B, heads, L, dim))  # [B, heads, L, dim]
        return tuple(out)

    def _update_packed(self, layer_idx: int, step: CacheStep, new) -> tuple:
        out = []
        for pool, x in zip(self.layers[layer_idx], new):
            _, heads, bs, dim = pool.shape
            read, write = step.rows[heads]
            pool.view(-1, dim).index_copy_(0, write, x.reshape(-1, dim))         # [heads*T, dim]
            blocks = pool.view(-1, bs, dim).index_select(0, read)   # [heads*cu_k[n]/bs, bs, dim]
            out.append(blocks.view(-1, dim))                        # [heads * cu_k[n], dim]
        return tuple(out)

    def read(self, layer_idx: int, stop: int) -> tuple[torch.Tensor, ...]:
        """See :meth:`CacheStorage.read`: slots ``[0, stop)`` of the last step's layout.

        Raises:
            ValueError: no step has run since the last :meth:`reset`.
        """
        if self._slots is None:
            raise ValueError("nothing to read: no step has run on this PagedKVCache")
        slots, out = self._slots[:, :stop], []                                # [B, stop]
        for pool in self.layers[layer_idx]:
            _, heads, _, dim = pool.shape
            rows = pool_rows(slots, heads, self.block_size).transpose(1, 2)    # [B, heads, stop]
            out.append(pool.view(-1, dim)[rows])                          # [B, heads, stop, dim]
        return tuple(out)

    def reset(self) -> None:
        """See :meth:`CacheStorage.reset`: forget the prepared and the last step (the pools'
        contents belong to the block manager's bookkeeping and stay)."""
        self._tables = self._slots = None
        self.batch_size, self.length = 0, 0
        self.num_real = torch.zeros(0, dtype=torch.long, device=self.device)

    # ---------------------------------------------------------------- reporting
    def nbytes(self) -> int:
        """Bytes allocated for the pools across all layers."""
        return sum(t.nbytes for bufs in self.layers for t in bufs)

    def bytes_per_token(self) -> int:
        """Bytes one token slot occupies, all layers and entries."""
        return self.nbytes() // (self.num_blocks * self.block_size)

    def __repr__(self) -> str:
        c = self.config
        pools = " + ".join(f"{name} [{self.num_blocks}, {heads}, {self.block_size}, {dim}]"
                           for name, heads, dim in self.entries)
        return f"PagedKVCache(layers={c.num_hidden_layers}, pools per layer: {pools})"
