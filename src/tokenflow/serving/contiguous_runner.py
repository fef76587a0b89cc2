"""The baseline runner strategy: one contiguous KV cache per request, one forward per chunk.

See :mod:`tokenflow.serving.runner`.
"""
from __future__ import annotations

import torch

from tokenflow.model.kv_cache import KVCache
from .scheduler import ScheduledChunk

__all__ = ["ContiguousRunner"]


class ContiguousRunner:
    """Per-request contiguous KV caches, one ordinary forward per chunk (see the module
    docstring).

    Args:
        model: a :class:`~tokenflow.model.transformer.TokenFlowModel` (eval mode).

    Attributes:
        caches: ``request_id -> KVCache`` of the requests that hold KV.
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
        """Tokens whose K/V this runner holds for the request."""
        return self.caches[request_id].length

    @torch.inference_mode()
    def forward(self, chunks: list[ScheduledChunk]) -> dict:
        """Compute every chunk; return ``{request_id: logits [V]}`` for chunks that sample.

        Raises:
            KeyError: a chunk's request holds no KV (call :meth:`allocate` first).
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
