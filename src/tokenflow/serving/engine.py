"""The engine: ``add_request`` -> ``step`` (schedule, run, update) -> results, with metrics.

The serving pipeline of the seed's section 8 (request queue -> prefill -> KV cache -> decode
loop -> sampling -> response), as in nano-vllm's ``LLMEngine``::

    engine = LLMEngine(model, num_blocks=64, block_size=16)
    outputs = engine.run([prompt_ids_1, prompt_ids_2], SamplingParams(max_new_tokens=8))

Each :meth:`LLMEngine.step` asks the :class:`~.scheduler.Scheduler` for a plan, lets the
:class:`~.runner.ModelRunner` compute it and sample, and hands the sampled tokens back to
the scheduler. A request that can never run (empty prompt, bad ids or sampling parameters,
longer than the model or the block pool) is rejected on its own: its result has
``finish_reason="rejected"`` and the reason, and the others run normally.
"""
from __future__ import annotations

import dataclasses
import statistics
import time
from dataclasses import dataclass

from tqdm.auto import tqdm

from .block_manager import BlockManager
from .request import Request, RequestOutput, SamplingParams
from .runner import ContiguousKVStorage, ModelRunner, PagedKVStorage
from .scheduler import Scheduler

__all__ = ["LLMEngine", "StepRecord"]


@dataclass
class StepRecord:
    """What one step did: ``prefill`` ``[(request_id, tokens)]`` (prompt chunks and
    recomputes), ``decode`` ``[request_id]`` (one token each), ``preempted`` ids,
    ``num_tokens`` computed, ``seconds`` of wall time, ``num_free_blocks`` after it."""

    index: int
    prefill: list
    decode: list
    preempted: list
    num_tokens: int
    seconds: float
    num_free_blocks: int


class LLMEngine:
    """A continuous-batching engine over one :class:`~tokenflow.model.transformer.TokenFlowModel`.

    Args:
        model: the model (eval mode; any dtype / device).
        num_blocks: KV blocks in the pool (int >= 1).
        block_size: token slots per block (int >= 1; vLLM's default is 16).
        max_num_seqs: most requests running at once (int >= 1).
        max_num_batched_tokens: token budget of one step (int >= 1); longer prompts are
            prefilled in chunks.
        enable_prefix_caching: reuse the blocks of a shared prompt prefix (bool).
        batch_decode: run the chunks of a step as one batched forward (bool; the paged
            storage batches prefill chunks and decode rows, the contiguous one decode rows).
        static_batching: admit a new batch only when the running one has finished (bool;
            default False = continuous batching; see :class:`~.scheduler.Scheduler`).
        kv_storage: ``"paged"`` (default, :class:`~.runner.PagedKVStorage`: one block pool,
            prefix blocks shared) or ``"contiguous"`` (:class:`~.runner.ContiguousKVStorage`:
            a cache per request, prefix hits recomputed).

    Attributes:
        scheduler, block_manager, runner: the three parts.
        steps: a :class:`StepRecord` per step.
        outputs: ``request_id -> RequestOutput`` of every finished or rejected request.

    Raises:
        ValueError: a bad setting (the message names it).
    """

    def __init__(self, model, num_blocks: int = 64, block_size: int = 16,
                 max_num_seqs: int = 8, max_num_batched_tokens: int = 256,
                 enable_prefix_caching: bool = True, batch_decode: bool = True,
                 static_batching: bool = False, kv_storage: str = "paged"):
        for name, v in (("enable_prefix_caching", enable_prefix_caching),
                        ("batch_decode", batch_decode)):
            if not isinstance(v, bool):
                raise ValueError(f"{name} must be a bool, got {v!r}")
        if kv_storage not in ("paged", "contiguous"):
            raise ValueError(f"kv_storage must be 'paged' or 'contiguous', got {kv_storage!r}")
        self.model = model
        self.block_manager = BlockManager(num_blocks, block_size, enable_prefix_caching)
        self.scheduler = Scheduler(self.block_manager, max_num_seqs, max_num_batched_tokens,
                                   static_batching)
        storage = PagedKVStorage(model, num_blocks, block_size, batch_decode) \
            if kv_storage == "paged" else ContiguousKVStorage(model, batch_decode)
        self.runner = ModelRunner(model, block_size, storage)
        self.steps: list[StepRecord] = []
        self.outputs: dict[object, RequestOutput] = {}
        self._new_outputs: list[RequestOutput] = []
        self._next_id = 0

    # ------------------------------------------------------------------ requests
    def _rejection(self, prompt, params) -> str | None:
        """Why a request can never run, or None."""
        c, bs = self.model.config, self.block_manager.block_size
        if not prompt:
            return "empty prompt: prompt_token_ids must hold at least one token id"
        if any(isinstance(t, bool) or not isinstance(t, int) for t in prompt):
            return "prompt_token_ids must be a list of ints"
        if not all(0 <= t < c.vocab_size for t in prompt):
            return f"prompt_token_ids must be in [0, vocab_size={c.vocab_size})"
        try:
            params.validate()
        except (TypeError, ValueError) as e:
            return f"bad sampling parameters: {e}"
        total = len(prompt) + params.max_new_tokens
        if total > c.max_position_embeddings:
            return (f"prompt ({len(prompt)}) + max_new_tokens ({params.max_new_tokens}) = "
                    f"{total} exceeds max_position_embeddings={c.max_position_embeddings}")
        if -(-total // bs) > self.block_manager.num_blocks:
            return (f"prompt + max_new_tokens = {total} tokens need {-(-total // bs)} blocks "
                    f"of {bs}; the pool has only num_blocks={self.block_manager.num_blocks}")
        return None

    def add_request(self, prompt_token_ids, params: SamplingParams | dict | None = None,
                    request_id=None, arrival_time: float | None = None):
        """Queue one request; returns its id.

        Args:
            prompt_token_ids: list of ints (or a 1-D integer tensor).
            params: :class:`SamplingParams`, a dict of its fields, or None (defaults).
            request_id: any hashable; default the next integer.
            arrival_time: ``time.perf_counter()`` seconds; default now.

        Raises:
            ValueError: ``request_id`` already used. (A bad prompt or bad parameters do not
                raise: the request is rejected and its result says why.)
        """
        if request_id is None:
            request_id, self._next_id = self._next_id, self._next_id + 1
        if request_id in self.outputs or any(
                r.request_id == request_id for r in self.scheduler.running + list(
                    self.scheduler.waiting)):
            raise ValueError(f"request_id {request_id!r} is already in use")
        if hasattr(prompt_token_ids, "tolist"):
            prompt_token_ids = prompt_token_ids.tolist()
        prompt = list(prompt_token_ids)
        try:
            params = SamplingParams(**params) if isinstance(params, dict) else \
                (params or SamplingParams())
            if params.eos_token_id is None:
                params = dataclasses.replace(params, eos_token_id=self.model.config.eos_token_id)
        except TypeError as e:
            params, reason = SamplingParams(), f"bad sampling parameters: {e}"
        else:
            reason = self._rejection(prompt, params)
        req = Request(request_id, prompt, params, arrival_time)
        if reason is not None:
            req.finish_reason, req.finish_time = "rejected", time.perf_counter()
            self._finish(req, reason)
        else:
            req.generator = params.make_generator()
            self.scheduler.add(req)
        return request_id

    def _finish(self, req: Request, reason: str | None = None) -> None:
        out = RequestOutput.from_request(req, reason)
        self.outputs[req.request_id] = out
        self._new_outputs.append(out)

    def has_unfinished(self) -> bool:
        """True while a request waits or runs."""
        return self.scheduler.has_unfinished()

    # ------------------------------------------------------------------ the loop
    def step(self) -> list[RequestOutput]:
        """Schedule, compute and sample one step.

        Returns:
            the results that became available (finished or rejected requests).
        """
        if self.scheduler.has_unfinished():
            t0 = time.perf_counter()
            plan = self.scheduler.schedule()
            prefill = [(c.request.request_id, c.num_tokens) for c in plan.chunks
                       if not c.is_decode]
            decode = [c.request.request_id for c in plan.chunks if c.is_decode]
            sampled = self.runner.execute(plan)
            for req in self.scheduler.update(plan, sampled):
                self.runner.free(req.request_id)
                self._finish(req)
            self.steps.append(StepRecord(
                len(self.steps), prefill, decode, [r.request_id for r in plan.preempted],
                plan.num_tokens, time.perf_counter() - t0, self.block_manager.num_free_blocks))
        new, self._new_outputs = self._new_outputs, []
        return new

    def run(self, prompts: list, params=None, use_tqdm: bool = True) -> list[RequestOutput]:
        """Add ``prompts`` (lists of ids), step until all are done, return their results in
        order. ``params``: one :class:`SamplingParams` / dict for all, or a list of them."""
        if not isinstance(params, list):
            params = [params] * len(prompts)
        if len(params) != len(prompts):
            raise ValueError(f"params must be one value or a list of len(prompts)="
                             f"{len(prompts)}, got {len(params)}")
        ids = [self.add_request(p, sp) for p, sp in zip(prompts, params)]
        with tqdm(total=len(ids), desc="requests", disable=not use_tqdm) as bar:
            bar.update(len(self.step()))
            while self.has_unfinished():
                bar.update(len(self.step()))
        return [self.outputs[i] for i in ids]

    # ------------------------------------------------------------------ metrics
    def metrics(self) -> dict:
        """Totals over this engine's life.

        Returns:
            dict: ``num_requests``, ``num_rejected``, ``num_steps``, ``elapsed_s`` (sum of
            step times), ``num_generated_tokens``, ``num_computed_tokens``,
            ``throughput_tok_s`` (generated tokens / elapsed), ``mean_ttft_s``,
            ``mean_tpot_s``, ``mean_e2e_s`` (over finished requests), ``num_preemptions``,
            ``prefix_cache_hit_rate`` (hit / looked-up full blocks),
            ``num_recomputed_tokens`` (prefix hits the storage recomputed: 0 when paged).
        """
        done = [o for o in self.outputs.values() if o.finish_reason != "rejected"]
        elapsed = sum(s.seconds for s in self.steps)
        gen = sum(len(o.output_token_ids) for o in done)

        def mean(xs):
            xs = [x for x in xs if x is not None]
            return statistics.fmean(xs) if xs else None

        bm = self.block_manager
        return dict(
            num_requests=len(self.outputs), num_rejected=len(self.outputs) - len(done),
            num_steps=len(self.steps), elapsed_s=elapsed, num_generated_tokens=gen,
            num_computed_tokens=sum(s.num_tokens for s in self.steps),
            throughput_tok_s=gen / elapsed if elapsed > 0 else None,
            mean_ttft_s=mean(o.ttft for o in done), mean_tpot_s=mean(o.tpot for o in done),
            mean_e2e_s=mean(o.e2e_latency for o in done),
            num_preemptions=self.scheduler.num_preemptions,
            prefix_cache_hit_rate=(bm.num_hit_blocks / bm.num_queried_blocks
                                   if bm.num_queried_blocks else 0.0),
            num_recomputed_tokens=getattr(self.runner.storage, "num_recomputed_tokens", 0))
