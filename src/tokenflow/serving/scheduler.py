"""The scheduler: continuous batching over a token budget. Decides; never touches tensors.

Each :meth:`Scheduler.schedule` call plans one engine step (vLLM v1's unified scheduler,
nano-vllm's check/act pairs):

1. **Running requests first**, oldest first: each gets the tokens it still has to compute,
   capped by what is left of ``max_num_batched_tokens`` (a decode: 1 token; a long prompt:
   a chunk of it, the rest next step = *chunked prefill*). Before that, the block manager
   must cover its tokens (``can_append`` / ``append_slot``); if the pool is empty, the
   *newest* running request is preempted (its blocks freed, ``num_computed_tokens`` reset,
   put back at the front of ``waiting``, recomputed later, as vLLM does), possibly the
   request itself.
2. **Then waiting requests**, in arrival order, while the budget lasts, fewer than
   ``max_num_seqs`` run and the pool can hold all their tokens (``can_allocate`` /
   ``allocate``; prefix-cache hits count as already computed). None is admitted in a step
   that preempted. Samples 1.. of an ``n > 1`` request wait until sample 0 has computed
   the prompt: then its full blocks are in the prefix cache, and they share them.

With ``static_batching=True`` step 2 happens only in a step that starts with nothing running:
a batch is formed, runs until its last request has finished, and only then is the next batch
admitted (the way servers batched before continuous batching, Yu et al. 2022, Orca, OSDI).
Finished requests still leave at once; their seats stay empty until the batch is done.

After the runner has computed the plan, :meth:`Scheduler.update` advances the counts, appends
the sampled tokens, finishes requests on end-of-sequence or ``max_new_tokens`` and frees
their blocks.
"""
from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

from .block_manager import BlockManager
from .request import Request, RequestStatus

__all__ = ["ScheduledChunk", "StepPlan", "Scheduler"]


@dataclass
class ScheduledChunk:
    """One request's share of a step: compute its tokens ``[start, start + num_tokens)``.

    ``samples`` is True when the chunk ends at the request's last token, so its logits
    give the next token; a middle chunk of a chunked prefill only fills the cache.
    """

    request: Request
    start: int
    num_tokens: int

    @property
    def samples(self) -> bool:
        return self.start + self.num_tokens == self.request.num_tokens

    @property
    def is_decode(self) -> bool:
        """One new token after generated ones (not part of a prompt or of a recompute)."""
        r = self.request
        return self.num_tokens == 1 and self.samples and len(r.output_token_ids) > 0


@dataclass
class StepPlan:
    """What one step computes (``chunks``, in order) and whom it preempted."""

    chunks: list[ScheduledChunk] = field(default_factory=list)
    preempted: list[Request] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return sum(c.num_tokens for c in self.chunks)


class Scheduler:
    """Moves requests between ``waiting`` and ``running`` (continuous batching).

    Args:
        block_manager: the :class:`BlockManager` of the KV pool.
        max_num_seqs: most requests running at once (int >= 1).
        max_num_batched_tokens: token budget of one step (int >= 1).
        static_batching: admit new requests only when no request runs (bool; default False,
            continuous batching).

    Raises:
        ValueError: a count is not an int >= 1, or ``static_batching`` not a bool (the
            message names the setting).
    """

    def __init__(self, block_manager: BlockManager, max_num_seqs: int,
                 max_num_batched_tokens: int, static_batching: bool = False):
        for name, v in (("max_num_seqs", max_num_seqs),
                        ("max_num_batched_tokens", max_num_batched_tokens)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be an int >= 1, got {v!r}")
        if not isinstance(static_batching, bool):
            raise ValueError(f"static_batching must be a bool, got {static_batching!r}")
        self.static_batching = static_batching
        self.block_manager = block_manager
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.num_preemptions = 0

    def add(self, req: Request) -> None:
        """Queue a (validated) request at the back of ``waiting``."""
        req.status = RequestStatus.WAITING
        self.waiting.append(req)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    # ------------------------------------------------------------------ planning
    def schedule(self) -> StepPlan:
        """Plan one step (see the module docstring). May return an empty plan only when
        nothing is waiting or running."""
        plan = StepPlan()
        budget = self.max_num_batched_tokens
        may_admit = not (self.static_batching and self.running)
        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            while not self.block_manager.can_append(req):
                victim = self.running[-1]
                self._preempt(victim, plan)
                if victim is req:
                    break
            if req.status is not RequestStatus.RUNNING:
                break                                      # it preempted itself
            self.block_manager.append_slot(req)
            n = min(req.num_tokens - req.num_computed_tokens, budget)
            plan.chunks.append(ScheduledChunk(req, req.num_computed_tokens, n))
            budget -= n
            i += 1
        if may_admit and not plan.preempted:
            self._admit(plan, budget)
        return plan

    def _admit(self, plan: StepPlan, budget: int) -> None:
        """Move waiting requests to running while budget, seats and blocks allow."""
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            req = self.waiting[0]
            src = req.prompt_source        # sample i > 0 of n > 1
            if src is not None and src.status is not RequestStatus.FINISHED and \
                    src.num_computed_tokens < len(src.prompt_token_ids):
                break                           # its prompt is not cached yet
            if not self.block_manager.can_allocate(req):
                break
            self.waiting.popleft()
            req.num_computed_tokens = self.block_manager.allocate(req)
            req.status = RequestStatus.RUNNING
            self.running.append(req)
            n = min(req.num_tokens - req.num_computed_tokens, budget)
            plan.chunks.append(ScheduledChunk(req, req.num_computed_tokens, n))
            budget -= n

    def _preempt(self, req: Request, plan: StepPlan) -> None:
        """Free ``req``'s blocks and queue it first in ``waiting``; it is recomputed from
        its tokens (prompt + generated so far) when it is admitted again."""
        self.running.remove(req)
        self.block_manager.free(req)
        req.status = RequestStatus.WAITING
        req.num_computed_tokens = 0
        req.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(req)
        plan.preempted.append(req)

    # ------------------------------------------------------------------ after the step
    def update(self, plan: StepPlan, sampled: dict) -> list[Request]:
        """Apply a computed step: advance ``num_computed_tokens``, register full blocks in
        the prefix cache, append ``sampled[request_id]`` for chunks that sample, and finish
        requests (``finish_reason`` ``"eos"``, ``"stop"`` or ``"length"``; blocks freed).

        Returns:
            the requests that finished in this step.
        """
        now = time.perf_counter()
        finished = []
        for chunk in plan.chunks:
            req = chunk.request
            req.num_computed_tokens += chunk.num_tokens
            self.block_manager.cache_full_blocks(req)
            if not chunk.samples:
                continue
            token = sampled[req.request_id]
            req.output_token_ids.append(token)
            if req.first_token_time is None:
                req.first_token_time = now
            req.last_token_time = now
            reason = self._finish_reason(req, token)
            if reason is not None:
                req.finish_reason, req.finish_time = reason, now
                req.status = RequestStatus.FINISHED
                self.running.remove(req)
                self.block_manager.free(req)
                finished.append(req)
        return finished

    def finish(self, req: Request, reason: str) -> None:
        """Finish ``req`` now, wherever it is (waiting or running): ``finish_reason =
        reason`` (``"abort"``, ``"error"``), blocks freed at once.

        Raises:
            ValueError: ``req`` is neither waiting nor running.
        """
        if req in self.running:
            self.running.remove(req)
            self.block_manager.free(req)
        elif req in self.waiting:
            self.waiting.remove(req)
        else:
            raise ValueError(f"request {req.request_id!r} is neither waiting nor running")
        req.finish_reason, req.finish_time = reason, time.perf_counter()
        req.status = RequestStatus.FINISHED

    @staticmethod
    def _finish_reason(req: Request, token: int) -> str | None:
        """``"eos"`` (an end-of-sequence id, unless ``ignore_eos``), ``"stop"`` (a
        ``stop_token_ids`` id), ``"length"`` (``max_new_tokens`` reached) or None. A stop
        id that is also the last allowed token still counts as a stop."""
        if not req.params.ignore_eos and token in req.eos_ids:
            return "eos"
        if token in req.stop_ids:
            return "stop"
        if len(req.output_token_ids) >= req.params.max_new_tokens:
            return "length"
        return None
