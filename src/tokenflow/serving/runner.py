"""The runner: turns a step plan into model calls and sampled tokens. Never schedules.

Two pieces:

* :class:`ContiguousKVStorage`, the tensor storage of this phase: one contiguous
  :class:`~tokenflow.KVCache` (batch 1, ``max_len`` = the request's block allocation,
  ``ceil((prompt + max_new_tokens) / block_size) * block_size``) per running request.
  Prefill chunks run one request per call (``prefill`` on its cache); decode rows of several
  requests run as **one** batched call: their caches are copied, left-padded, into a temporary
  batch cache, and the new K/V row is copied back. Prefix-cache hits are **recomputed**: the
  scheduler counts the cached tokens as computed (as it must for the paged storage, where
  blocks are really shared), and this storage, which cannot share tensors between requests,
  runs those tokens together with the request's first chunk (counted in
  ``num_recomputed_tokens``). A later paged storage replaces this class with the same three
  methods (``allocate``, ``free``, ``forward``) and reads the block tables instead.
* :class:`ModelRunner`: asks the storage for logits, then samples each request's token with
  its own parameters and its own seeded generator (:func:`tokenflow.sampling.sample`, the
  call :func:`tokenflow.generate` makes), so a request's tokens do not depend on its batch.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ..generate import decode_step, prefill
from ..kv_cache import KVCache
from ..sampling import sample
from .request import Request
from .scheduler import ScheduledChunk, StepPlan

__all__ = ["ContiguousKVStorage", "ModelRunner"]


class ContiguousKVStorage:
    """Per-request contiguous KV caches (see the module docstring).

    Args:
        model: a :class:`~tokenflow.model.TokenFlowModel` (eval mode).
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

    def allocate(self, request_id, max_len: int) -> None:
        """A fresh empty cache of ``max_len`` slots for ``request_id``."""
        self.caches[request_id] = KVCache(self.model.config, 1, max_len, dtype=self.dtype,
                                          device=self.device)

    def free(self, request_id) -> None:
        """Drop the request's cache (finished or preempted); unknown ids are ignored."""
        self.caches.pop(request_id, None)

    def __contains__(self, request_id) -> bool:
        return request_id in self.caches

    @torch.inference_mode()
    def forward(self, chunks: list[ScheduledChunk]) -> dict:
        """Compute every chunk; return ``{request_id: logits [V]}`` for chunks that sample.

        Raises:
            KeyError: a chunk's request has no storage (call :meth:`allocate` first).
        """
        logits, decode_rows = {}, []
        for c in chunks:
            cache = self.caches[c.request.request_id]
            if self.batch_decode and c.num_tokens == 1 and cache.length == c.start:
                decode_rows.append(c)
                continue
            missing = c.start - cache.length             # prefix-cache hit: recompute it
            self.num_recomputed_tokens += missing
            ids = torch.tensor([c.request.token_ids[cache.length:c.start + c.num_tokens]],
                               device=self.device)                      # [1, S]
            out = prefill(self.model, ids, cache)                       # [1, V]
            if c.samples:
                logits[c.request.request_id] = out[0]
        if decode_rows:
            out = self._decode(decode_rows)                             # [B, V]
            for b, c in enumerate(decode_rows):
                logits[c.request.request_id] = out[b]
        return logits

    def _decode(self, rows: list[ScheduledChunk]) -> torch.Tensor:
        """One decode token for each row in one forward; returns ``[B, V]`` logits."""
        caches = [self.caches[c.request.request_id] for c in rows]
        ids = torch.tensor([[c.request.token_ids[c.start]] for c in rows],
                           device=self.device)                          # [B, 1]
        if len(rows) == 1:
            return decode_step(self.model, ids, caches[0])
        lengths = [c.length for c in caches]
        L = max(lengths)
        batch = KVCache(self.model.config, len(rows), L + 1, dtype=self.dtype,
                        device=self.device)
        mask = torch.tensor([[0] * (L - n) + [1] * n for n in lengths])  # [B, L] left padding
        batch.reserve(mask)
        for layer in range(self.model.config.num_hidden_layers):
            k = torch.cat([F.pad(c.k[layer][:, :, :n], (0, 0, L - n, 0))
                           for c, n in zip(caches, lengths)])           # [B, n_kv, L, D]
            v = torch.cat([F.pad(c.v[layer][:, :, :n], (0, 0, L - n, 0))
                           for c, n in zip(caches, lengths)])
            batch.write(layer, 0, k, v)
        logits = decode_step(self.model, ids, batch)                    # [B, V]
        one = torch.ones(1, 1, dtype=torch.long)
        for b, (c, n) in enumerate(zip(caches, lengths)):
            c.reserve(one)                                              # claim slot n
            for layer in range(self.model.config.num_hidden_layers):
                c.write(layer, n, batch.k[layer][b:b + 1, :, L:L + 1],
                        batch.v[layer][b:b + 1, :, L:L + 1])            # [1, n_kv, 1, D]
        return logits


class ModelRunner:
    """Runs a :class:`~tokenflow.serving.scheduler.StepPlan` and samples.

    Args:
        model: the :class:`~tokenflow.model.TokenFlowModel`.
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
            ``{request_id: next token id (int)}`` for each chunk that samples.
        """
        for req in plan.preempted:
            self.storage.free(req.request_id)
        for c in plan.chunks:
            if c.request.request_id not in self.storage:
                self.storage.allocate(c.request.request_id, self._capacity(c.request))
        logits = self.storage.forward(plan.chunks)
        sampled = {}
        for c in plan.chunks:
            if c.samples:
                r = c.request
                p = r.params
                tok = sample(logits[r.request_id][None], p.temperature, p.top_k, p.top_p,
                             p.min_p, r.generator)                      # [1]
                sampled[r.request_id] = int(tok[0])
        return sampled

    def free(self, request_id) -> None:
        """Release a finished request's storage."""
        self.storage.free(request_id)
