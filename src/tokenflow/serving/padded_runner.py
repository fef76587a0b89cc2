"""The packed step replaced, kept to be measured against: chunks left-padded to ``[B, S_max]``.

See :mod:`tokenflow.serving.runner`.
"""
from __future__ import annotations

import torch

from .paged_runner import PagedRunner
from .scheduler import ScheduledChunk

__all__ = ["PaddedRunner"]


class PaddedRunner(PagedRunner):
    """:class:`PagedRunner` with the step before packing (see the module docstring):
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
