"""The engine: ``add_request`` -> ``step`` (schedule, run, update) -> results, with metrics.

The serving pipeline of chapter 5 (request queue -> prefill -> KV cache -> decode
loop -> sampling -> response), as in nano-vllm's ``LLMEngine``::

    engine = LLMEngine(model, num_blocks=64, block_size=16)
    outputs = engine.run([prompt_ids_1, prompt_ids_2], SamplingParams(max_new_tokens=8))

Each :meth:`LLMEngine.step` asks the :class:`~.scheduler.Scheduler` for a plan, lets the
:class:`~.runner.ModelRunner` compute it and sample, and hands the sampled tokens back to
the scheduler. Bad arguments (a wrong type, an id outside the vocabulary, a bad sampling
value) raise ``TypeError`` / ``ValueError`` naming the argument when the request is added,
and nothing is queued. A well-formed request that can never run (longer than the model or
the block pool) is rejected on its own: its result has ``finish_reason="rejected"`` and the
reason, and the others run normally. A request whose step raises finishes with
``finish_reason="error"``; :meth:`LLMEngine.abort` stops one at once.
"""
from __future__ import annotations

import dataclasses
import statistics
import time
from dataclasses import dataclass, field

from tqdm.auto import tqdm

from .block_manager import BlockManager
from .request import (Request, RequestOutput, RequestStatus, SamplingParams, check_arrival_time,
                      check_prompt)
from .runner import ContiguousRunner, ModelRunner, PaddedRunner, PagedRunner
from .sampler import SampledToken
from .scheduler import Scheduler

__all__ = ["LLMEngine", "StepRecord"]


@dataclass
class StepRecord:
    """What one step did: ``prefill`` ``[(request_id, tokens)]`` (prompt chunks and
    recomputes), ``decode`` ``[request_id]`` (one token each), ``preempted`` ids,
    ``num_tokens`` scheduled, ``seconds`` of wall time, ``num_free_blocks`` after it,
    ``num_positions`` the forward computed (= ``num_tokens`` on the packed paged storage;
    the contiguous one adds recomputed prefix-cache hits), and ``sampled`` ``[request_id]``
    (the requests that got a token in this step: decodes and last prompt chunks)."""

    index: int
    prefill: list
    decode: list
    preempted: list
    num_tokens: int
    seconds: float
    num_free_blocks: int
    num_positions: int = 0
    sampled: list = field(default_factory=list)


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
        batch_decode: run the chunks of a step as one packed forward (bool; default True;
            False: one forward per chunk, for comparison; the contiguous storage always
            runs one forward per chunk).
        static_batching: admit a new batch only when the running one has finished (bool;
            default False = continuous batching; see :class:`~.scheduler.Scheduler`).
        kv_storage: ``"paged"`` (default, :class:`~.runner.PagedRunner`: one block pool,
            prefix blocks shared) or ``"contiguous"`` (:class:`~.runner.ContiguousRunner`:
            a cache per request, prefix hits recomputed) or ``"padded"``
            (:class:`~.runner.PaddedRunner`: the paged pool with the step before packing,
            chunks left-padded into ``[B, S_max]``; for comparison).

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
        if kv_storage not in ("paged", "padded", "contiguous"):
            raise ValueError(f"kv_storage must be 'paged', 'padded' or 'contiguous', "
                             f"got {kv_storage!r}")
        self.model = model
        self.block_manager = BlockManager(num_blocks, block_size, enable_prefix_caching)
        self.scheduler = Scheduler(self.block_manager, max_num_seqs, max_num_batched_tokens,
                                   static_batching)
        strategy = ContiguousRunner(model) if kv_storage == "contiguous" else \
            (PaddedRunner if kv_storage == "padded" else PagedRunner)(
                model, num_blocks, block_size, batch_decode)
        self.runner = ModelRunner(model, block_size, strategy)
        self.steps: list[StepRecord] = []
        self.outputs: dict[object, RequestOutput] = {}
        self._new_outputs: list[RequestOutput] = []
        self._next_id = 0
        self._ids: set = set()             # every request id added so far
        self._children: dict = {}          # request id of an n > 1 request -> sample ids

    # ------------------------------------------------------------------ requests
    def _check_request(self, prompt_token_ids, params, request_id, arrival_time,
                       taken: set) -> list[Request]:
        """Check and copy one request's arguments into :class:`Request` objects (not
        queued): one, or the ``n`` samples ``(request_id, i)`` of an ``n > 1`` request."""
        c = self.model.config
        prompt = check_prompt(prompt_token_ids, c.vocab_size)
        params = SamplingParams.checked(params, c)

        def ids(rid) -> list:                        # the request's id and its samples'
            return [rid] + [(rid, i) for i in range(params.n if params.n > 1 else 0)]

        def in_use(rid) -> list:
            return [i for i in ids(rid) if i in self._ids or i in taken]

        if request_id is None:
            request_id = self._next_id
            while in_use(request_id):
                request_id += 1                      # never an id the caller chose
        try:
            hash(request_id)
        except TypeError:
            raise TypeError(f"request_id must be hashable, got {type(request_id).__name__}"
                            ) from None
        used = in_use(request_id)
        if used:
            raise ValueError(f"request_id {used[0]!r} is already in use")
        arrival_time = check_arrival_time(arrival_time)
        if params.n == 1:
            return [Request(request_id, prompt, params, arrival_time)]
        if arrival_time is None:
            arrival_time = time.perf_counter()
        samples = [Request((request_id, i), prompt, dataclasses.replace(
            params, n=1, seed=None if params.seed is None else (params.seed + i) % 2**64),
            arrival_time) for i in range(params.n)]
        for r in samples:
            r.parent_id, r.prompt_source = request_id, samples[0] if r.request_id[1] else None
        return samples

    @staticmethod
    def _ids_of(reqs: list[Request]) -> list:
        """The ids a checked request takes: its own, or its parent's and its samples'."""
        return [r.request_id for r in reqs] + [reqs[0].parent_id] * (
            reqs[0].parent_id is not None)

    def _rejection(self, req: Request) -> str | None:
        """Why a well-formed request can never run on this engine, or None."""
        c, bs = self.model.config, self.block_manager.block_size
        n, new = len(req.prompt_token_ids), req.params.max_new_tokens
        total = n + new
        if total > c.max_position_embeddings:
            return (f"prompt ({n}) + max_new_tokens ({new}) = {total} exceeds "
                    f"max_position_embeddings={c.max_position_embeddings}")
        if -(-total // bs) > self.block_manager.num_blocks:
            return (f"prompt + max_new_tokens = {total} tokens need {-(-total // bs)} blocks "
                    f"of {bs}; the pool has only num_blocks={self.block_manager.num_blocks}")
        return None

    def _queue(self, req: Request) -> None:
        """Queue a checked request, or finish it as rejected when it can never run."""
        self._ids.add(req.request_id)
        if req.parent_id is not None:
            self._ids.add(req.parent_id)
            self._children.setdefault(req.parent_id, []).append(req.request_id)
        while self._next_id in self._ids:
            self._next_id += 1
        reason = self._rejection(req)
        if reason is not None:
            req.finish_reason, req.finish_time = "rejected", time.perf_counter()
            req.status = RequestStatus.FINISHED
            self._finish(req, reason)
        else:
            req.generator = req.params.make_generator()
            self.scheduler.add(req)

    def add_request(self, prompt_token_ids, params: SamplingParams | dict | None = None,
                    request_id=None, arrival_time: float | None = None):
        """Check, copy and queue one request; returns its id.

        Everything is checked and turned into plain Python values here, before anything is
        queued; the request keeps its own copy of ``params`` (later changes to the caller's
        object do not reach it).

        Args:
            prompt_token_ids: list of ints (numpy integers accepted) or a 1-D integer tensor
                / array, ids in ``[0, vocab_size)``.
            params: :class:`SamplingParams`, a dict of its fields, or None (defaults).
                ``eos_token_id=None`` takes the model config's (an int or a list).
            request_id: any hashable not used before in this engine; default the smallest
                integer not yet used (never one the caller chose). With ``params.n > 1`` the
                samples get the ids ``(request_id, i)`` (their results are in
                :attr:`outputs` under them; :meth:`abort` of ``request_id`` aborts all).
            arrival_time: ``time.perf_counter()`` seconds, in ``[0, now]`` (a request
                arrives when it is added or before; TTFT and E2E count from it); default
                now.

        Raises:
            TypeError: an argument (or a field of ``params``) of the wrong type, an unknown
                field name, an unhashable ``request_id``.
            ValueError: a value out of range (empty prompt, id outside the vocabulary, bad
                sampling value, ``seed`` outside ``[0, 2**64 - 1]``, NaN / negative /
                future ``arrival_time``), or ``request_id`` already used. The messages name the
                argument. (A request that is fine but too long for the model or the block
                pool does not raise: it finishes as ``"rejected"``, its result says why.)
        """
        reqs = self._check_request(prompt_token_ids, params, request_id, arrival_time, set())
        for req in reqs:
            self._queue(req)
        return reqs[0].request_id if reqs[0].parent_id is None else reqs[0].parent_id

    def sample_ids(self, request_id) -> list:
        """The ids the results of an added request are stored under in :attr:`outputs`:
        ``[(request_id, 0), ..., (request_id, n - 1)]`` for an ``n > 1`` request, else
        ``[request_id]``.

        Raises:
            KeyError: ``request_id`` was never added to this engine.
        """
        if request_id in self._children:
            return list(self._children[request_id])
        if request_id not in self._ids:
            raise KeyError(f"request_id {request_id!r} was never added to this engine")
        return [request_id]

    def abort(self, request_id) -> bool:
        """Stop a waiting or running request now (vLLM's ``abort_request``): its blocks go
        back to the free list at once, its result (``finish_reason="abort"``, the tokens so
        far) is in :attr:`outputs` and returned by the next :meth:`step`.

        Returns:
            True if it (or, for an ``n > 1`` request, one of its samples) was aborted; False
            if the id is unknown or already finished.
        """
        if request_id in self._children:
            return any([self.abort(c) for c in self._children[request_id]])
        req = next((r for r in list(self.scheduler.waiting) + self.scheduler.running
                    if r.request_id == request_id), None)
        if req is None:
            return False
        self.scheduler.finish(req, "abort")
        self.runner.free(request_id)
        self._finish(req)
        return True

    def _finish(self, req: Request, reason: str | None = None) -> None:
        out = RequestOutput.from_request(req, reason)
        self.outputs[req.request_id] = out
        self._new_outputs.append(out)

    def _fail(self, req: Request, message: str) -> None:
        """Finish ``req`` with ``finish_reason="error"``; blocks and storage freed."""
        self.scheduler.finish(req, "error")
        try:
            self.runner.free(req.request_id)
        except Exception:                            # noqa: BLE001 (storage of a failed step)
            pass
        self._finish(req, message)

    def has_unfinished(self) -> bool:
        """True while a request waits or runs."""
        return self.scheduler.has_unfinished()

    # ------------------------------------------------------------------ the loop
    def step(self) -> list[RequestOutput]:
        """Schedule, compute and sample one step.

        An exception while sampling one request finishes that request with
        ``finish_reason="error"`` (its result's ``reason`` says what); the others go on. An
        exception in the model forward cannot be pinned on one request: every request of
        that step finishes with ``"error"``. Either way the blocks come back and the engine
        can step on.

        Returns:
            the results that became available (finished, aborted or rejected requests).
        """
        if self.scheduler.has_unfinished():
            t0 = time.perf_counter()
            plan = self.scheduler.schedule()                                  # plan
            record = self._record_of(plan)
            sampled = self._execute(plan)                                     # execute
            tokens = self._update(plan, sampled)                              # update
            self._record(record, time.perf_counter() - t0, tokens)            # record
        new, self._new_outputs = self._new_outputs, []
        return new

    def _record_of(self, plan) -> StepRecord:
        """The :class:`StepRecord` of a scheduled plan, before it runs (times filled after)."""
        return StepRecord(len(self.steps),
                          [(c.request.request_id, c.num_tokens) for c in plan.chunks
                           if not c.is_decode],
                          [c.request.request_id for c in plan.chunks if c.is_decode],
                          [r.request_id for r in plan.preempted], plan.num_tokens, 0.0, 0)

    def _record(self, record: StepRecord, seconds: float, tokens: dict) -> None:
        """Complete the step's record after it ran and keep it in :attr:`steps`."""
        record.seconds, record.sampled = seconds, list(tokens)
        record.num_free_blocks = self.block_manager.num_free_blocks
        record.num_positions = self.runner.num_positions
        self.steps.append(record)

    def _execute(self, plan) -> dict:
        """Run the plan: ``{request_id: SampledToken}``. A failed forward cannot be pinned
        on one request: every chunk of the step gets the error."""
        try:
            return self.runner.execute(plan)
        except Exception as e:                       # noqa: BLE001 (the whole step failed)
            msg = f"the step's forward failed: {type(e).__name__}: {e}"
            return {c.request.request_id: SampledToken(None, error=msg) for c in plan.chunks}

    def _update(self, plan, sampled: dict) -> dict:
        """Finish the requests whose row failed, hand the sampled tokens to the scheduler,
        finish the requests that are done. Returns ``{request_id: token}`` of this step."""
        failed = {rid for rid, s in sampled.items() if s.error is not None}
        for c in [c for c in plan.chunks if c.request.request_id in failed]:
            self._fail(c.request, sampled[c.request.request_id].error)
        plan.chunks = [c for c in plan.chunks if c.request.request_id not in failed]
        tokens = {}
        for c in plan.chunks:
            s = sampled.get(c.request.request_id)
            if c.samples:
                tokens[c.request.request_id] = s.token
                if s.logprobs is not None:
                    c.request.output_logprobs.append(s.logprobs)
        for req in self.scheduler.update(plan, tokens):
            self.runner.free(req.request_id)
            self._finish(req)
        return tokens


    def run(self, prompts: list, params=None, use_tqdm: bool = True) -> list[RequestOutput]:
        """Add ``prompts`` (lists of ids), step until all are done, return their results in
        order (a prompt with ``n > 1`` samples gives its ``n`` results in its place).
        ``params``: one :class:`SamplingParams` / dict / None for all, or a list of them.

        Every request is checked before any is queued: if one is bad, nothing is queued.

        Raises:
            TypeError, ValueError: as :meth:`add_request`, with the request's index.
        """
        if not isinstance(prompts, (list, tuple)):
            raise TypeError(f"prompts must be a list of prompts, got {type(prompts).__name__}")
        if isinstance(params, (list, tuple)):
            if len(params) != len(prompts):
                raise ValueError(f"params must be one value or a list of len(prompts)="
                                 f"{len(prompts)}, got {len(params)}")
        else:
            params = [params] * len(prompts)
        reqs, taken = [], set()
        for i, (p, sp) in enumerate(zip(prompts, params)):
            try:
                new = self._check_request(p, sp, None, None, taken)
            except (TypeError, ValueError) as e:
                raise type(e)(f"request {i}: {e}") from None
            taken.update(self._ids_of(new))
            reqs += new
        for req in reqs:
            self._queue(req)
        ids = [r.request_id for r in reqs]
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
            ``mean_tpot_s``, ``mean_e2e_s`` (means over every request that ran, aborted and
            failed ones included, each with the times of the tokens it got, see
            :class:`~.request.RequestOutput`; rejected ones are left out; a request without
            a value, e.g. no TPOT with one token, is left out of that mean), ``num_preemptions``,
            ``prefix_cache_hit_rate`` (hit / looked-up full blocks at first admissions:
            reuse across requests), ``preempted_prefix_cache_hit_rate`` (the same at the
            re-admissions of preempted requests, which find their own freed blocks; 0.0
            without preemptions),
            ``num_recomputed_tokens`` (prefix hits the storage recomputed: 0 when paged),
            ``num_aborted``, ``num_errors`` (requests finished as ``"abort"`` / ``"error"``).
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
            preempted_prefix_cache_hit_rate=(
                bm.num_preempted_hit_blocks / bm.num_preempted_queried_blocks
                if bm.num_preempted_queried_blocks else 0.0),
            num_recomputed_tokens=getattr(self.runner.strategy, "num_recomputed_tokens", 0),
            num_aborted=sum(o.finish_reason == "abort" for o in done),
            num_errors=sum(o.finish_reason == "error" for o in done))
