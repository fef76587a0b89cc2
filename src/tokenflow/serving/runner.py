"""The runner: turns a step plan into one packed forward and sampled tokens. Never schedules.

**A step is packed, not padded** (nano-vllm's ``prepare_prefill`` / ``prepare_decode``,
vLLM's and SGLang's flattened batches). The scheduled chunks of a step (prompt chunks and
one-token decode rows alike) are laid end to end::

    chunks      B: decode token 9   C: decode token 4   A: prompt tokens 0..5
    input_ids   [b9 | c4 | a0 a1 a2 a3 a4 a5]                         T = 8
    positions   [9  | 4  | 0  1  2  3  4  5 ]
    cu_seqlens_q  [0, 1, 2, 8]

(decode rows first: attention reads them as one batch; see
:class:`~tokenflow.model.kv_cache.PackedCacheStep`).

One forward runs the ``T`` tokens as ``[T, H]`` (``[B, S, H]`` with the batch laid
flat), so a decode row costs one position and a prompt chunk its own length: the positions
computed equal the scheduled tokens, asserted every step. Attention reads each sequence's own
context from its blocks (:meth:`~tokenflow.PagedKVCache.packed_step`), and the LM head runs
only on the last token of each chunk that samples.

Four pieces:

* :class:`PagedKVStorage`, the engine's storage: one :class:`~tokenflow.PagedKVCache` for all
  requests, addressed through the block tables the block manager hands out. Prefix-cache
  hits are **shared**: the cached blocks already hold the prefix's K/V, so a request starts
  computing after them (``num_recomputed_tokens`` stays 0).
* :class:`PaddedKVStorage` (``kv_storage="padded"``), the step packing replaced, kept to be
  measured against (chapter 05, ``benchmarks/bench_serving.py``): the same pool, but the
  chunks left-padded to the longest into ``input_ids [B, S_max]`` and run through the
  model's ordinary ``[B, S]`` forward, so a step with one 200-token chunk and seven decode
  rows computes 8 x 200 positions for 207 tokens.
* :class:`ContiguousKVStorage`, the baseline it is checked against (``LLMEngine(...,
  kv_storage="contiguous")``): one contiguous :class:`~tokenflow.KVCache` per request, one
  ordinary ``model(ids [1, S], kv_cache=...)`` call per chunk (the ``[B, S]`` view). It cannot
  share tensors between requests, so prefix-cache hits are **recomputed** (counted in
  ``num_recomputed_tokens``). The tests check that both give ``generate``'s tokens, and
  chapter 05 compares what sharing saves.
* :class:`ModelRunner`: asks the storage for logits, then samples each request's token with
  its own parameters and its own seeded generator (:func:`.sampler.sample_requests`), so a
  request's tokens do not depend on its batch.

The storages have the same methods: ``allocate``, ``free``, ``forward(chunks)``,
``num_computed``, ``in`` and ``len``, and the attribute ``num_positions`` (positions the
last ``forward`` computed).
"""
from __future__ import annotations

import math

import torch

from tokenflow.model.kv_cache import KVCache, PackedCacheStep
from .paged_kv_cache import PagedKVCache
from .request import Request
from .sampler import sample_requests
from .scheduler import ScheduledChunk, StepPlan

__all__ = ["PagedKVStorage", "PaddedKVStorage", "ContiguousKVStorage", "ModelRunner",
           "prepare_packed"]


def prepare_packed(cache: PagedKVCache, chunks: list[ScheduledChunk]
                   ) -> tuple[torch.Tensor, PackedCacheStep, torch.Tensor]:
    """Lay a step's chunks end to end (see the module docstring). ``chunks`` must list the
    one-token rows (decode) first: the cache attends them as one batch.

    Returns:
        ``(input_ids [T], step, logits_indices [N])``: the new tokens of every chunk in
        order; the :class:`~tokenflow.model.kv_cache.PackedCacheStep` (positions, slot
        mapping, ``cu_seqlens``, block tables); the index in ``T`` of the last token of each
        chunk that samples.
    """
    ids = [t for c in chunks for t in c.request.token_ids[c.start:c.start + c.num_tokens]]
    step = cache.packed_step([c.request.block_table for c in chunks],
                             [c.start for c in chunks], [c.num_tokens for c in chunks])
    ends, end = [], 0
    for c in chunks:
        end += c.num_tokens
        if c.samples:
            ends.append(end - 1)                                     # its last token in T
    return (torch.tensor(ids, device=cache.device), step,
            torch.tensor(ends, dtype=torch.long, device=cache.device))  # [T], ., [N]


class PagedKVStorage:
    """All requests' K/V in one :class:`~tokenflow.PagedKVCache` (see the module docstring).

    Args:
        model: a :class:`~tokenflow.model.transformer.TokenFlowModel` (eval mode).
        num_blocks, block_size: the pool, as in the :class:`~.block_manager.BlockManager`
            whose block tables this storage reads.
        batch_decode: run all chunks of a step as one packed forward (default) or one
            forward per chunk (same results; for comparison).

    Attributes:
        cache: the :class:`~tokenflow.PagedKVCache`.
        computed: ``request_id -> tokens whose K/V are in the request's blocks``.
        num_positions: positions the last :meth:`forward` computed (= its scheduled tokens).
        num_recomputed_tokens: always 0 (prefix-cache hits are shared, not recomputed).
    """

    pads = False                        # computes no padded position (asserted every step)

    def __init__(self, model, num_blocks: int, block_size: int, batch_decode: bool = True):
        self.model = model
        self.batch_decode = batch_decode
        p = next(model.parameters())
        self.cache = PagedKVCache(model.config, num_blocks, block_size, p.dtype, p.device)
        self.computed: dict[object, int] = {}
        self.num_positions = 0
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
            RuntimeError: the forward computed another number of positions than the
                chunks' tokens (checked every step).
        """
        missing = [c.request.request_id for c in chunks if c.request.request_id not in self]
        if missing:
            raise KeyError(f"requests {missing} hold no storage: call allocate() first")
        logits, self.num_positions = {}, 0
        for group in [chunks] if self.batch_decode else [[c] for c in chunks]:
            logits.update(self._run(group))
        scheduled = sum(c.num_tokens for c in chunks)
        if not self.pads and self.num_positions != scheduled:
            raise RuntimeError(f"the step computed {self.num_positions} positions for "
                               f"{scheduled} scheduled tokens: a padded or missing position")
        return logits

    def _run(self, chunks: list[ScheduledChunk]) -> dict:
        """One packed forward over ``chunks`` (tokens ``[start, start + num_tokens)`` of
        each request; tokens before ``start`` are in its blocks)."""
        chunks = sorted(chunks, key=lambda c: c.num_tokens > 1)   # decode rows first (stable)
        ids, step, keep = prepare_packed(self.cache, chunks)               # [T], ., [N]
        out = self.model.forward_packed(ids, step, self.cache, keep)       # [N, V]
        self.num_positions += step.num_tokens
        for c in chunks:
            self.computed[c.request.request_id] = c.start + c.num_tokens
        sampling = [c.request.request_id for c in chunks if c.samples]
        return dict(zip(sampling, out))


class PaddedKVStorage(PagedKVStorage):
    """:class:`PagedKVStorage` with the step before packing (see the module docstring):
    every chunk left-padded to the longest, one ``model(input_ids [B, S_max],
    kv_cache=...)`` call (:meth:`~tokenflow.PagedKVCache.prepare`), the LM head on the
    last column. ``num_positions`` counts ``B * S_max``. Same tokens as the packed step."""

    pads = True

    def _run(self, chunks: list[ScheduledChunk]) -> dict:
        S, pad = max(c.num_tokens for c in chunks), self.model.config.pad_token_id
        rows = [[pad] * (S - c.num_tokens) + c.request.token_ids[c.start:c.start + c.num_tokens]
                for c in chunks]
        self.cache.prepare([c.request.block_table for c in chunks], [c.start for c in chunks],
                           [c.num_tokens for c in chunks])
        ids = torch.tensor(rows, device=self.cache.device)                 # [B, S_max]
        out = self.model(ids, kv_cache=self.cache, logits_to_keep=1)[:, -1]  # [B, V]
        self.num_positions += ids.numel()
        for c in chunks:
            self.computed[c.request.request_id] = c.start + c.num_tokens
        return {c.request.request_id: out[b] for b, c in enumerate(chunks) if c.samples}


class ContiguousKVStorage:
    """Per-request contiguous KV caches, one ordinary forward per chunk (see the module
    docstring).

    Args:
        model: a :class:`~tokenflow.model.transformer.TokenFlowModel` (eval mode).

    Attributes:
        caches: ``request_id -> KVCache`` of the requests that hold storage.
        num_positions: positions the last :meth:`forward` computed (scheduled tokens plus
            recomputed prefix-cache hits).
        num_recomputed_tokens: prefix-cache tokens recomputed so far.
    """

    def __init__(self, model):
        self.model = model
        self.caches: dict[object, KVCache] = {}
        self.num_positions = 0
        self.num_recomputed_tokens = 0
        p = next(model.parameters())
        self.dtype, self.device = p.dtype, p.device

    def allocate(self, request_id, max_len: int) -> None:
        """A fresh empty cache of ``max_len`` slots for ``request_id``."""
        self.caches[request_id] = KVCache(self.model.config, 1, max_len, dtype=self.dtype,
                                          device=self.device)

    def free(self, request_id) -> None:
        """Drop the request's cache (finished or preempted); unknown ids are ignored."""
        self.caches.pop(request_id, None)

    def __contains__(self, request_id) -> bool:
        return request_id in self.caches

    def __len__(self) -> int:
        return len(self.caches)

    def num_computed(self, request_id) -> int:
        """Tokens whose K/V this storage holds for the request."""
        return self.caches[request_id].length

    @torch.inference_mode()
    def forward(self, chunks: list[ScheduledChunk]) -> dict:
        """Compute every chunk; return ``{request_id: logits [V]}`` for chunks that sample.

        Raises:
            KeyError: a chunk's request has no storage (call :meth:`allocate` first).
        """
        logits, self.num_positions = {}, 0
        for c in chunks:
            rid = c.request.request_id
            cache = self.caches[rid]
            self.num_recomputed_tokens += c.start - cache.length   # prefix-cache hit
            ids = torch.tensor([c.request.token_ids[cache.length:c.start + c.num_tokens]],
                               device=self.device)                      # [1, S]
            out = self.model(ids, kv_cache=cache, logits_to_keep=1)[0, -1]  # [V]
            self.num_positions += ids.shape[1]
            if c.samples:
                logits[rid] = out
        return logits


class ModelRunner:
    """Runs a :class:`~tokenflow.serving.scheduler.StepPlan` and samples.

    Args:
        model: the :class:`~tokenflow.model.transformer.TokenFlowModel`.
        block_size: tokens per KV block (sizes each request's contiguous storage).
        storage: the tensor storage; default :class:`ContiguousKVStorage`.

    Attributes:
        num_positions: positions the last :meth:`execute` computed.
    """

    def __init__(self, model, block_size: int, storage=None):
        self.model = model
        self.block_size = block_size
        self.storage = storage if storage is not None else ContiguousKVStorage(model)
        self.num_positions = 0

    def _capacity(self, req: Request) -> int:
        limit = self.model.config.max_position_embeddings
        return min(math.ceil(req.max_num_tokens / self.block_size) * self.block_size, limit)

    def execute(self, plan: StepPlan) -> dict:
        """Free the preempted requests' storage, compute the plan, sample.

        Returns:
            ``{request_id: SampledToken}`` for each chunk that samples
            (:func:`~.sampler.sample_requests`: token, logprobs, or the error of that row).
        """
        self.num_positions = 0
        for req in plan.preempted:
            self.storage.free(req.request_id)
        for c in plan.chunks:
            if c.request.request_id not in self.storage:
                self.storage.allocate(c.request.request_id, self._capacity(c.request))
        logits = self.storage.forward(plan.chunks)
        self.num_positions = self.storage.num_positions
        return sample_requests([c.request for c in plan.chunks if c.samples], logits)

    def free(self, request_id) -> None:
        """Release a finished request's storage."""
        self.storage.free(request_id)
