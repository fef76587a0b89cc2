"""The runner: turns a step plan into model calls and sampled tokens. Never schedules.

Two pieces:

* :class:`ContiguousKVStorage`, the tensor storage of this phase: one contiguous
  :class:`~tokenflow.KVCache` (batch 1, ``max_len`` = the request's block allocation,
  ``ceil((prompt + max_new_tokens) / block_size) * block_size``) per running request.
  Prefill chunks run one request per call (``prefill`` on its cache); decode rows of several
  requests run as **one** batched call on a left-padded copy of their caches that is kept
  while the same requests decode (the "decode group", see the class). Prefix-cache hits are **recomputed**: the
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

from ..generate import decode_step
from ..kv_cache import KVCache
from ..sampling import sample
from .request import Request
from .scheduler import ScheduledChunk, StepPlan

__all__ = ["ContiguousKVStorage", "ModelRunner"]


class ContiguousKVStorage:
    """Per-request contiguous KV caches (see the module docstring).

    Decode batching: the decode rows of a step are copied, left-padded, into one batch
    :class:`~tokenflow.KVCache` (the *decode group*). While the same requests keep decoding
    step after step, the group is reused as it is and their new K/V stay there; when the set
    of decode rows changes, the new slots are copied back to each request's own cache
    (:meth:`_flush`) and a new group is built. So the copies happen when requests join or
    leave, not every step.

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
        batch.reserve(torch.tensor([[0] * (L - n) + [1] * n for n in lengths]))  # [B, L]
        for b, (c, n) in enumerate(zip(caches, lengths)):               # row b: slots L-n..L
            for layer in range(len(c.k)):
                batch.k[layer][b, :, L - n:L] = c.k[layer][0, :, :n]    # [n_kv, n, D]
                batch.v[layer][b, :, L - n:L] = c.v[layer][0, :, :n]
        self._group, self._batch, self._group_start = rids, batch, L

    def _flush(self) -> None:
        """Copy the tokens decoded in the group back to each (still held) own cache."""
        if not self._group:
            return
        start, end = self._group_start, self._batch.length
        for b, rid in enumerate(self._group):
            if end == start:
                break
            c, n = self.caches[rid], self.caches[rid].length
            c.reserve(torch.ones(1, end - start, dtype=torch.long))     # claim slots n..
            for layer in range(len(c.k)):
                c.write(layer, n, self._batch.k[layer][b:b + 1, :, start:end],
                        self._batch.v[layer][b:b + 1, :, start:end])    # [1, n_kv, m, D]
        self._group, self._batch = [], None


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
        reqs = [c.request for c in plan.chunks if c.samples]
        greedy = [r for r in reqs if r.params.temperature == 0]
        sampled = {}
        if greedy:                      # one argmax for all greedy rows, as generate does
            rows = torch.stack([logits[r.request_id] for r in greedy])      # [G, V]
            sampled.update(zip((r.request_id for r in greedy), rows.argmax(-1).tolist()))
        for r in reqs:
            p = r.params
            if p.temperature != 0:
                tok = sample(logits[r.request_id][None], p.temperature, p.top_k, p.top_p,
                             p.min_p, r.generator)                      # [1]
                sampled[r.request_id] = int(tok[0])
        return sampled

    def free(self, request_id) -> None:
        """Release a finished request's storage."""
        self.storage.free(request_id)
