"""The runner: turns a step plan into one packed forward and sampled tokens. Never schedules.

**A step is packed, not padded** (nano-vllm's ``prepare_prefill`` / ``prepare_decode``,
vLLM's and SGLang's flattened batches). The scheduled chunks of a step (prompt chunks and
one-token decode rows alike) are laid end to end::

    chunks      B: decode token 9   C: decode token 4   A: prompt tokens 0..5
    input_ids   [b9 | c4 | a0 a1 a2 a3 a4 a5]                         T = 8
    positions   [9  | 4  | 0  1  2  3  4  5 ]
    cu_seqlens_q  [0, 1, 2, 8]

(decode rows first: attention reads them as one batch; see
the packed :class:`~tokenflow.model.kv_cache.CacheStep`).

One forward runs the ``T`` tokens as ``[T, H]`` (``[B, S, H]`` with the batch laid
flat), so a decode row costs one position and a prompt chunk its own length: the positions
computed equal the scheduled tokens, asserted every step. Attention reads each sequence's own
context from its blocks (:meth:`~tokenflow.PagedKVCache.packed_step`), and the LM head runs
only on the last token of each chunk that samples.

Three runner strategies (one file each) and the runner that drives them:

* :class:`PagedRunner` (``paged_runner.py``), the engine's strategy: one
  :class:`~tokenflow.PagedKVCache` for all requests, addressed through the block tables
  the block manager hands out. Prefix-cache
  hits are **shared**: the cached blocks already hold the prefix's K/V, so a request starts
  computing after them (``num_recomputed_tokens`` stays 0).
* :class:`PaddedRunner` (``padded_runner.py``, ``kv_storage="padded"``), the step packing
  replaced, kept to be measured against (chapter 05, ``benchmarks/bench_serving.py``): the
  same pool, but the
  chunks left-padded to the longest into ``input_ids [B, S_max]`` and run through the
  model's ordinary ``[B, S]`` forward, so a step with one 200-token chunk and seven decode
  rows computes 8 x 200 positions for 207 tokens.
* :class:`ContiguousRunner` (``contiguous_runner.py``), the baseline it is checked against
  (``LLMEngine(..., kv_storage="contiguous")``): one contiguous :class:`~tokenflow.KVCache`
  per request, one ordinary ``model(ids [1, S], kv_cache=...)`` call per chunk (the
  ``[B, S]`` view). It cannot
  share tensors between requests, so prefix-cache hits are **recomputed** (counted in
  ``num_recomputed_tokens``). The tests check that both give ``generate``'s tokens, and
  chapter 05 compares what sharing saves.
* :class:`ModelRunner`: asks its strategy for logits, then samples each request's token with
  its own parameters and its own seeded generator (:func:`.sampler.sample_requests`), so a
  request's tokens do not depend on its batch.

The strategies (runners, not caches: the cache interface is ``CacheStorage``) have the same
methods: ``allocate``, ``free``, ``forward(chunks)``,
``num_computed``, ``in`` and ``len``, and the attribute ``num_positions`` (positions the
last ``forward`` computed).
"""
from __future__ import annotations

import math

from .contiguous_runner import ContiguousRunner
from .padded_runner import PaddedRunner
from .paged_runner import PagedRunner, prepare_packed
from .request import Request
from .sampler import sample_requests
from .scheduler import StepPlan

__all__ = ["PagedRunner", "PaddedRunner", "ContiguousRunner", "ModelRunner", "prepare_packed"]

PagedKVStorage, PaddedKVStorage, ContiguousKVStorage = PagedRunner, PaddedRunner, ContiguousRunner
"""The runner strategies' earlier names (chapter 05's prose still names them); the cache
interface is :class:`~tokenflow.model.kv_cache.CacheStorage`, these are runners."""


class ModelRunner:
    """Runs a :class:`~tokenflow.serving.scheduler.StepPlan` and samples.

    Args:
        model: the :class:`~tokenflow.model.transformer.TokenFlowModel`.
        block_size: tokens per KV block (sizes each request's contiguous cache).
        strategy: the runner strategy (it owns the KV tensors and runs the forward);
            default :class:`ContiguousRunner`.

    Attributes:
        num_positions: positions the last :meth:`execute` computed.
    """

    def __init__(self, model, block_size: int, strategy=None):
        self.model = model
        self.block_size = block_size
        self.strategy = strategy if strategy is not None else ContiguousRunner(model)
        self.num_positions = 0

    def _capacity(self, req: Request) -> int:
        limit = self.model.config.max_position_embeddings
        return min(math.ceil(req.max_num_tokens / self.block_size) * self.block_size, limit)

    def execute(self, plan: StepPlan) -> dict:
        """Free the preempted requests' KV, compute the plan with the strategy, sample.

        Returns:
            ``{request_id: SampledToken}`` for each chunk that samples
            (:func:`~.sampler.sample_requests`: token, logprobs, or the error of that row).
        """
        self.num_positions = 0
        for req in plan.preempted:
            self.strategy.free(req.request_id)
        for c in plan.chunks:
            if c.request.request_id not in self.strategy:
                self.strategy.allocate(c.request.request_id, self._capacity(c.request))
        logits = self.strategy.forward(plan.chunks)
        self.num_positions = self.strategy.num_positions
        return sample_requests([c.request for c in plan.chunks if c.samples], logits)

    def free(self, request_id) -> None:
        """Release a finished request's KV."""
        self.strategy.free(request_id)
