"""The runner: turns a step plan into model calls and sampled tokens. Never schedules.

Three pieces:

* :class:`PagedKVStorage`, the engine's default tensor storage: one
  :class:`~tokenflow.PagedKVCache` (block pools) for all requests, addressed through the
  block tables the block manager hands out. Every scheduled chunk of a step (prefill chunks
  and decode rows alike) runs in **one** model forward: the chunks are left-padded into
  ``input_ids [B, S_max]`` and the cache is told each row's block table, cached and new
  token counts (:meth:`~tokenflow.PagedKVCache.prepare`). Prefix-cache hits are **shared**:
  the cached blocks already hold the prefix's K/V, so a request starts computing after them
  (``num_recomputed_tokens`` stays 0).
* :class:`ContiguousKVStorage`, the simpler teaching version (``LLMEngine(...,
  kv_storage="contiguous")``): one contiguous :class:`~tokenflow.KVCache` (batch 1,
  ``max_len`` = the request's block allocation) per running request. Prefill chunks run one
  request per call; decode rows of several requests run as one batched call on a left-padded
  copy of their caches (the "decode group", see the class). It cannot share tensors between
  requests, so prefix-cache hits are **recomputed** with the request's first chunk (counted
  in ``num_recomputed_tokens``).
* :class:`ModelRunner`: asks the storage for logits, then samples each request's token with
  its own parameters and its own seeded generator (:func:`.sampler.sample_requests`), so a
  request's tokens do not depend on its batch.

Both storages have the same methods: ``allocate``, ``free``, ``forward(chunks)``,
``num_computed``, ``in`` and ``len``.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from tokenflow.inference.generate import decode_step
from tokenflow.model.kv_cache import KVCache
from .paged_kv_cache import PagedKVCache
from .request import Request
from .sampler import sample_requests
from .scheduler import ScheduledChunk, StepPlan

__all__ = ["PagedKVStorage", "ContiguousKVStorage", "ModelRunner"]


class PagedKVStorage:
    """All requests' K/V in one :class:`~tokenflow.PagedKVCache` (see the module docstring).

    Args:
        model: a :class:`~tokenflow.model.transformer.TokenFlowModel` (eval mode).
        num_blocks, block_size: the pool, as in the :class:`~.block_manager.BlockManager`
            whose block tables this storage reads.
        batch_decode: run all chunks of a step as one forward (default) or one forward per
            chunk (same results; for comparison).

    Attributes:
        cache: the :class:`~tokenflow.PagedKVCache`.
        computed: ``request_id -> tokens whose K/V are in the request's blocks``.
        num_recomputed_tokens: always 0 (prefix-cache hits are shared, not recomputed).
    """

    def __init__(self, model, num_blocks: int, block_size: int, batch_decode: bool = True):
        self.model = model
        self.batch_decode = batch_decode
        p = next(model.parameters())
        self.cache = PagedKVCache(model.config, num_blocks, block_size, p.dtype, p.device)
        self.computed: dict[object, int] = {}
        self.num_recomputed_tokens = 0

    def allocate(self, request_id, max_len: int) -> None:
        """Start tracking ``request_id`` (its blocks come from the block manager;
        ``max_len`` is unused here)."""
        self.computed[request_id] = 0

    def free(self, request_id) -> None:
        """Stop tracking the request (its blocks go back through the block manager)."""
        self.computed.pop(request_id, None)

    def __contains__(self, request_id) -> bool:
        return request_id in self.computed

    def __len__(self) -> int:
        return len(self.computed)

    def num_computed(self, request_id) -> int:
        """Tokens whose K/V this request's blocks hold (prefix-cache hits included)."""
        return self.computed[request_id]

    @torch.inference_mode()
    def forward(self, chunks: list[ScheduledChunk]) -> dict:
        """Compute every chunk; return ``{request_id: logits [V]}`` for chunks that sample.

        Raises:
            KeyError: a chunk's request has no storage (call :meth:`allocate` first).
        """
        logits = {}
        for group in [chunks] if self.batch_decode else [[c] for c in chunks]:
            logits.update(self._run(group))
        return logits

    def _run(self, chunks: list[ScheduledChunk]) -> dict:
        """One forward over ``chunks``: tokens ``[start, start + num_tokens)`` of each
        request, left-padded to the longest; tokens before ``start`` are in the blocks."""
        S, pad = max(c.num_tokens for c in chunks), self.model.config.pad_token_id
        rows = [[pad] * (S - c.num_tokens) + c.request.token_ids[c.start:c.start + c.num_tokens]
                for c in chunks]
        missing = [c.request.request_id for c in chunks if c.request.request_id not in self]
        if missing:
            raise KeyError(f"requests {missing} hold no storage: call allocate() first")
        self.cache.prepare([c.request.block_table for c in chunks], [c.start for c in chunks],
                           [c.num_tokens for c in chunks])
        ids = torch.tensor(rows, device=self.cache.device)                  # [B, S]
        out = self.model(ids, kv_cache=self.cache, logits_to_keep=1)[:, -1]  # [B, V]
        for c in chunks:
            self.computed[c.request.request_id] = c.start + c.num_tokens
        return {c.request.request_id: out[b] for b, c in enumerate(chunks) if c.samples}


class ContiguousKVStorage:
    """Per-request contiguous KV caches (see the module docstring).

    Decode batching: the decode rows of a step are copied, left-padded, into one batch
    :class:`~tokenflow.KVCache` (the *decode group*). While the same requests keep decoding
    step after step, the group is reused as it is and their new K/V stay there; when the set
    of decode rows changes, the new slots are copied back to each request's own cache
    (:meth:`_flush`) and a new group is built. So the copies happen when requests join or
    leave, not every step.

    Args:
        model: a :class:`~tokenflow.model.transformer.TokenFlowModel` (eval mode).
        batch_decode: run the decode rows of a step as one batched forward (default) or one
            call per request.

    Attributes:
        caches: ``request_id -> KVCache`` of the requests that hold storage.
        num_recomputed_tokens: prefix-cache tokens recomputed so far.
    """

    def __init__(self, model, batch_decode: bool = True):
        self.model = model
        self.batch_decode = batch_decode
        self.caches: dict[object, KVCache] = {}
        self.num_recomputed_tokens = 0
        p = next(model.parameters())
        self.dtype, self.device = p.dtype, p.device
        self._group: list = []                  # request ids of the decode group's rows
        self._batch: KVCache | None = None      # their [B, n_kv, L, D] caches, left-padded
        self._group_start = 0                   # first slot of tokens decoded in the group

    def allocate(self, request_id, max_len: int) -> None:
        """A fresh empty cache of ``max_len`` slots for ``request_id``."""
        self.caches[request_id] = KVCache(self.model.config, 1, max_len, dtype=self.dtype,
                                          device=self.device)

    def free(self, request_id) -> None:
        """Drop the request's cache (finished or preempted); unknown ids are ignored."""
        if request_id in self._group:
            self._flush()                       # the group must not outlive a member
        self.caches.pop(request_id, None)

    def __contains__(self, request_id) -> bool:
        return request_id in self.caches

    def __len__(self) -> int:
        return len(self.caches)

    def num_computed(self, request_id) -> int:
        """Tokens whose K/V this storage holds for the request."""
        n = self.caches[request_id].length
        if request_id in self._group:
            n += self._batch.length - self._group_start
        return n

    @torch.inference_mode()
    def forward(self, chunks: list[ScheduledChunk]) -> dict:
        """Compute every chunk; return ``{request_id: logits [V]}`` for chunks that sample.

        Raises:
            KeyError: a chunk's request has no storage (call :meth:`allocate` first).
        """
        logits, decode_rows = {}, []
        for c in chunks:
            rid = c.request.request_id
            if self.batch_decode and c.num_tokens == 1 and self.num_computed(rid) == c.start:
                decode_rows.append(c)
                continue
            if rid in self._group:
                self._flush()
            cache = self.caches[rid]
            self.num_recomputed_tokens += c.start - cache.length   # prefix-cache hit
            ids = torch.tensor([c.request.token_ids[cache.length:c.start + c.num_tokens]],
                               device=self.device)                      # [1, S]
            with torch.inference_mode():        # a chunk continues its cached sequence
                out = self.model(ids, kv_cache=cache, logits_to_keep=1)[:, -1]  # [1, V]
            if c.samples:
                logits[rid] = out[0]
        if decode_rows:
            rids = [c.request.request_id for c in decode_rows]
            if rids != self._group or self._batch.length == self._batch.max_len:
                self._flush()
                self._build_group(rids)
            ids = torch.tensor([[c.request.token_ids[c.start]] for c in decode_rows],
                               device=self.device)                      # [B, 1]
            out = decode_step(self.model, ids, self._batch)             # [B, V]
            logits.update(zip(rids, out))
        return logits

    def _build_group(self, rids: list) -> None:
        """Copy the requests' caches, right-aligned (left padding), into one batch cache
        with room for as many new tokens as the fullest own cache can take back."""
        caches = [self.caches[r] for r in rids]
        lengths = [c.length for c in caches]
        L = max(lengths)
        room = min(c.max_len - c.length for c in caches)
        batch = KVCache(self.model.config, len(rids), L + room, dtype=self.dtype,
                        device=self.device)
        mask = torch.tensor([[0] * (L - n) + [1] * n for n in lengths])          # [B, L]
        step = batch.begin_step(mask, len(rids), L)
        for layer in range(self.model.config.num_hidden_layers):      # row b: slots L-n..L
            rows = [[F.pad(e, (0, 0, L - n, 0)) for e in c.read(layer, n)]  # [1, heads, L, dim]
                    for c, n in zip(caches, lengths)]
            batch.update(layer, step, *(torch.cat(col) for col in zip(*rows)))  # [B, ., L, .]
        self._group, self._batch, self._group_start = rids, batch, L

    def _flush(self) -> None:
        """Copy the tokens decoded in the group back to each (still held) own cache."""
        if not self._group:
            return
        start, end = self._group_start, self._batch.length
        for b, rid in enumerate(self._group):
            if end == start:
                break
            c = self.caches[rid]
            step = c.begin_step(None, 1, end - start)                   # claims slots n..
            for layer in range(self.model.config.num_hidden_layers):
                new = self._batch.read(layer, end)
                c.update(layer, step, *(e[b:b + 1, :, start:end] for e in new))  # [1, ., m, .]
        self._group, self._batch = [], None


class ModelRunner:
    """Runs a :class:`~tokenflow.serving.scheduler.StepPlan` and samples.

    Args:
        model: the :class:`~tokenflow.model.transformer.TokenFlowModel`.
        block_size: tokens per KV block (sizes each request's storage).
        storage: the tensor storage; default :class:`ContiguousKVStorage`.
    """

    def __init__(self, model, block_size: int, storage=None, batch_decode: bool = True):
        self.model = model
        self.block_size = block_size
        self.storage = storage if storage is not None else ContiguousKVStorage(model,
                                                                              batch_decode)

    def _capacity(self, req: Request) -> int:
        limit = self.model.config.max_position_embeddings
        return min(math.ceil(req.max_num_tokens / self.block_size) * self.block_size, limit)

    def execute(self, plan: StepPlan) -> dict:
        """Free the preempted requests' storage, compute the plan, sample.

        Returns:
            ``{request_id: SampledToken}`` for each chunk that samples
            (:func:`~.sampler.sample_requests`: token, logprobs, or the error of that row).
        """
        for req in plan.preempted:
            self.storage.free(req.request_id)
        for c in plan.chunks:
            if c.request.request_id not in self.storage:
                self.storage.allocate(c.request.request_id, self._capacity(c.request))
        logits = self.storage.forward(plan.chunks)
        return sample_requests([c.request for c in plan.chunks if c.samples], logits)

    def free(self, request_id) -> None:
        """Release a finished request's storage."""
        self.storage.free(request_id)
