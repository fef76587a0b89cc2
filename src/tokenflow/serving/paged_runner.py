"""The engine's runner strategy: every step one packed forward over one paged KV pool.

See :mod:`tokenflow.serving.runner` for the packed step's layout and the other strategies.
"""
from __future__ import annotations

import torch

from tokenflow.model.kv_cache import CacheStep
from .paged_kv_cache import PagedKVCache
from .scheduler import ScheduledChunk

__all__ = ["PagedRunner", "prepare_packed"]


def prepare_packed(cache: PagedKVCache, chunks: list[ScheduledChunk]
                   ) -> tuple[torch.Tensor, CacheStep, torch.Tensor]:
    """Lay a step's chunks end to end (see the module docstring). ``chunks`` must list the
    one-token rows (decode) first: the cache attends them as one batch.

    Returns:
        ``(input_ids [T], step, logits_indices [N])``: the new tokens of every chunk in
        order; the packed :class:`~tokenflow.model.kv_cache.CacheStep` (positions, slot
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


class PagedRunner:
    """All requests' K/V in one :class:`~tokenflow.PagedKVCache` (see the module docstring).

    Args:
        model: a :class:`~tokenflow.model.transformer.TokenFlowModel` (eval mode).
        num_blocks, block_size: the pool, as in the :class:`~.block_manager.BlockManager`
            whose block tables this runner reads.
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
            KeyError: a chunk's request holds no KV (call :meth:`allocate` first).
            RuntimeError: the forward computed another number of positions than the
                chunks' tokens (checked every step).
        """
        missing = [c.request.request_id for c in chunks if c.request.request_id not in self]
        if missing:
            raise KeyError(f"requests {missing} hold no KV: call allocate() first")
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
