"""Staggered arrivals and what each request did at each step: the engine seen over time.

A server does not get all its requests at once. :func:`run_with_arrivals` adds each request
when the engine has run a given number of steps (a *step clock*: time is counted in engine
steps, so the batches formed do not depend on how fast this machine is), and
:func:`request_timeline` reads the engine's :class:`~.engine.StepRecord` list back into one
row per request: waiting, prefill or decode at each step. Chapter 05 draws it.
"""
from __future__ import annotations

from dataclasses import dataclass

from .request import RequestOutput

__all__ = ["WAIT", "PREFILL", "DECODE", "run_with_arrivals", "RequestTimeline",
           "request_timeline", "corpus_lines", "mixed_workload", "corpus_next_chars"]

WAIT, PREFILL, DECODE = "wait", "prefill", "decode"
"""States of a request in one step: queued or not scheduled / computing prompt tokens (or
recomputing after a preemption) / computing one new token."""


def run_with_arrivals(engine, prompts: list, params, arrival_steps: list[int]) -> tuple:
    """Add request ``i`` (ids ``0..n-1``) just before step ``arrival_steps[i]`` and step
    until all are done. When the engine is idle before the next arrival, that arrival comes
    at once (the clock skips idle time, as no step runs in it).

    Args:
        engine: an :class:`~.engine.LLMEngine` with no steps run yet.
        prompts: lists of token ids.
        params: one :class:`~.request.SamplingParams` (or dict) for all, or a list of them.
        arrival_steps: ints >= 0, one per prompt.

    Returns:
        ``(outputs, arrivals)``: the :class:`~.request.RequestOutput` list in prompt order
        (a prompt with ``n > 1`` samples gives its ``n`` results in its place, as
        :meth:`~.engine.LLMEngine.run`), and ``{request_id: step}`` of the step each request
        really arrived before (for ``n > 1``, each sample's id ``(i, j)``).

    Raises:
        ValueError: lengths differ, a bad arrival step, or an engine that has already run.
    """
    n = len(prompts)
    params = params if isinstance(params, list) else [params] * n
    if len(params) != n or len(arrival_steps) != n:
        raise ValueError(f"params and arrival_steps must have len(prompts)={n} entries, got "
                         f"{len(params)} and {len(arrival_steps)}")
    if any(isinstance(a, bool) or not isinstance(a, int) or a < 0 for a in arrival_steps):
        raise ValueError(f"arrival_steps must be ints >= 0, got {arrival_steps!r}")
    if engine.steps or engine.has_unfinished() or engine.outputs:
        raise ValueError("engine must be fresh (no requests added, no steps run)")
    order = sorted(range(n), key=lambda i: (arrival_steps[i], i))
    arrivals, k = {}, 0
    while k < n or engine.has_unfinished():
        now = len(engine.steps)
        if k < n and not engine.has_unfinished():
            now = max(now, arrival_steps[order[k]])        # idle: jump to the next arrival
        while k < n and arrival_steps[order[k]] <= now:
            i = order[k]
            engine.add_request(prompts[i], params[i], request_id=i)
            for rid in engine.sample_ids(i):
                arrivals[rid] = len(engine.steps)
            k += 1
        engine.step()
    return [engine.outputs[rid] for i in range(n) for rid in engine.sample_ids(i)], arrivals


@dataclass
class RequestTimeline:
    """One request over the engine's steps.

    Fields:
        request_id; arrival (step index it arrived before); states (``{step index: WAIT |
        PREFILL | DECODE}`` from arrival to its last step); first_token_step (the step that
        sampled its first token) and finish_step, or None.
    """

    request_id: object
    arrival: int
    states: dict
    first_token_step: int | None
    finish_step: int | None

    @property
    def ttft_steps(self) -> int | None:
        """Steps from arrival to the first token, both counted."""
        return None if self.first_token_step is None else self.first_token_step - self.arrival + 1

    def count(self, state: str) -> int:
        """Steps spent in ``state``."""
        return sum(s == state for s in self.states.values())


def request_timeline(engine, arrivals: dict, outputs: list[RequestOutput] | None = None
                     ) -> list[RequestTimeline]:
    """Rebuild each request's per-step states from ``engine.steps``.

    A request is ``PREFILL`` in a step that computes some of its prompt (or recomputes it),
    ``DECODE`` in one that computes one new token, ``WAIT`` in the other steps between its
    arrival and its last step. Its first token comes from the first step that sampled for it
    (``StepRecord.sampled``): the last chunk of its prompt (a long prompt may be prefilled
    over several steps; a request preempted later, even before its first decode, is
    prefilled again, which does not move its first token; the engine's
    ``first_token_time`` is stamped in the same step).

    Args:
        engine: the engine after the run.
        arrivals: ``{request_id: step}`` as :func:`run_with_arrivals` returns it.
        outputs: optional; rejected requests among them are left out.

    Returns:
        a :class:`RequestTimeline` per request, in ``arrivals`` order.
    """
    rejected = {o.request_id for o in outputs or [] if o.finish_reason == "rejected"}
    rows = {}
    for rid, a in arrivals.items():
        if rid not in rejected:
            rows[rid] = RequestTimeline(rid, a, {}, None, None)
    for s in engine.steps:
        for rid, _ in s.prefill:
            rows[rid].states[s.index] = PREFILL
        for rid in s.decode:
            rows[rid].states[s.index] = DECODE
        for rid in s.sampled:
            if rows[rid].first_token_step is None:
                rows[rid].first_token_step = s.index
    for r in rows.values():
        done = sorted(r.states)
        r.finish_step = done[-1] if done else None
        if r.finish_step is not None:
            for i in range(r.arrival, r.finish_step + 1):
                r.states.setdefault(i, WAIT)
            r.states = dict(sorted(r.states.items()))
    return list(rows.values())


def corpus_lines() -> list[str]:
    """The non-empty lines of the book's corpus (``tokenflow/data/corpus.txt``): short
    Chinese and English sentences."""
    from importlib import resources
    text = (resources.files("tokenflow") / "data" / "corpus.txt").read_text(encoding="utf-8")
    return [s.strip() for s in text.splitlines() if s.strip()]


def mixed_workload(tokenizer, num_requests: int = 24, seed: int = 0, max_gap: int = 3,
                   max_len: int = 128) -> tuple[list, list, list]:
    """A small mixed serving workload from the corpus: varied prompts, output lengths and
    arrival steps, reproducible from ``seed``.

    Request ``i``'s prompt is 0-5 random corpus lines followed by one more line cut before
    its last character (a sentence to complete, like 北京是中国的首); its output length is
    4-24 tokens, 40-56 for every fourth request (a few long answers among short ones, as in
    chat traffic), generated with ``ignore_eos`` so that it is exactly that long; it arrives
    0 to ``max_gap`` steps after the previous one.

    Returns:
        ``(prompts, params, arrival_steps)``: token-id lists, :class:`SamplingParams`
        (greedy), ints; ready for :func:`run_with_arrivals`.

    Raises:
        ValueError: ``num_requests < 1``, ``max_gap < 0``, or ``max_len`` too short to hold
            a prompt token and the longest output (``max_len < 57``).
    """
    import torch
    from .request import SamplingParams
    if isinstance(num_requests, bool) or not isinstance(num_requests, int) or num_requests < 1:
        raise ValueError(f"num_requests must be an int >= 1, got {num_requests!r}")
    if isinstance(max_gap, bool) or not isinstance(max_gap, int) or max_gap < 0:
        raise ValueError(f"max_gap must be an int >= 0, got {max_gap!r}")
    if isinstance(max_len, bool) or not isinstance(max_len, int) or max_len < 57:
        raise ValueError(f"max_len must be an int >= 57 (one prompt token + up to 56 new "
                         f"tokens), got {max_len!r}")
    g = torch.Generator().manual_seed(seed)
    rand = lambda lo, hi: int(torch.randint(lo, hi + 1, (1,), generator=g))  # noqa: E731
    lines = corpus_lines()
    prompts, params, arrivals, t = [], [], [], 0
    for i in range(num_requests):
        new = rand(40, 56) if i % 4 == 3 else rand(4, 24)
        context = [lines[rand(0, len(lines) - 1)] for _ in range(rand(0, 5))]
        ask = lines[rand(0, len(lines) - 1)]
        ids = tokenizer.encode(" ".join(context + [ask[:-2]]))
        prompts.append(ids[-(max_len - new):])
        params.append(SamplingParams(max_new_tokens=new, ignore_eos=True))
        arrivals.append(t)
        t += rand(0, max_gap)
    return prompts, params, arrivals


def corpus_next_chars(text: str) -> set[str]:
    """The characters that the corpus puts right after ``text``'s cut-off last sentence: ``text``
    ends with the start of one or more corpus lines (the longest such start, beginning at the
    start of ``text`` or after a space, as :func:`mixed_workload` joins its lines), and each
    of those lines goes on with one character. Empty when no corpus line starts that way.

    Raises:
        TypeError: ``text`` is not a str.
    """
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    best, found = 0, set()
    for line in corpus_lines():
        for k in range(len(line) - 1, best - 1, -1):
            if k and text.endswith(line[:k]) and (k == len(text) or text[-k - 1] == " "):
                if k > best:
                    best, found = k, set()
                found.add(line[k])
                break
    return found
