"""A request and what it gets back: prompt ids, sampling parameters, status, result.

Follows vLLM's ``SamplingParams`` / ``RequestOutput`` and nano-vllm's ``Sequence``: one object
per request that the scheduler moves between queues and the block manager gives blocks to.
Token counts (the scheduler's bookkeeping):

* ``token_ids = prompt_token_ids + output_token_ids``; ``num_tokens = len(token_ids)``.
* ``num_computed_tokens``: tokens whose K/V the cache holds (0 after a preemption).
* ``num_cached_tokens``: prompt tokens the prefix cache supplied at the first admission
  (vLLM's ``num_cached_tokens``: a recompute after a preemption does not change it).
* ``block_table``: ids of the KV blocks holding this request's tokens, in order.
"""
from __future__ import annotations

import dataclasses
import enum
import math
import numbers
import time
from dataclasses import dataclass

import torch

from tokenflow.inference.sampling import check_sampling_args, check_token_ids

__all__ = ["SamplingParams", "RequestStatus", "Request", "RequestOutput", "check_prompt",
           "check_arrival_time"]


def _int(name: str, v, lo: int, hi: int | None = None, none: bool = False) -> int | None:
    """``v`` as a plain int in ``[lo, hi]`` (numpy integers accepted; bools, floats,
    Fractions and strings rejected)."""
    if v is None and none:
        return None
    if isinstance(v, bool) or not isinstance(v, numbers.Integral):
        allowed = " or None" if none else ""
        raise TypeError(f"{name} must be an int{allowed}, got {type(v).__name__} {v!r}")
    if v < lo or (hi is not None and v > hi):
        top = "" if hi is None else f", <= {hi}"
        raise ValueError(f"{name} must be an int >= {lo}{top}, got {v!r}")
    return int(v)


def _bool(name: str, v) -> bool:
    """``v`` as a plain bool (``numpy.bool_`` accepted; ints and strings rejected)."""
    if isinstance(v, bool) or (type(v).__module__ == "numpy" and
                               type(v).__name__ in ("bool", "bool_")):
        return bool(v)
    raise TypeError(f"{name} must be a bool, got {type(v).__name__} {v!r}")


SEED_MAX = 2**64 - 1
"""Largest ``seed``: ``torch.Generator.manual_seed`` takes ``[0, 2**64 - 1]`` (and wraps
negative seeds onto that range, so they are refused here)."""


@dataclass
class SamplingParams:
    """How one request is continued (vLLM's ``SamplingParams``, our names).

    Fields:
        max_new_tokens: tokens to generate at most (int >= 1).
        temperature, top_k, top_p, min_p: as :func:`tokenflow.inference.sampling.filter_logits`;
            ``temperature=0`` is greedy.
        seed: seeds this request's own ``torch.Generator`` (int in ``[0, 2**64 - 1]``; None:
            a random seed), so the draws do not depend on other requests in the batch.
        ignore_eos: keep generating after the end-of-sequence token (vLLM ``ignore_eos``;
            ``stop_token_ids`` still stop).
        eos_token_id: end-of-sequence id or list of ids (stop at any); None: the model
            config's (which may be a list too).
        stop_token_ids: more ids to stop at (vLLM ``stop_token_ids``): finish reason
            ``"stop"``; the stop id is the last output token, as an EOS is.
        logprobs: None, or how many most likely tokens to report with each output token
            (int >= 0; 0 = the chosen token only), vLLM's ``logprobs``. The values are
            ``log_softmax`` of the model's raw logits at that position, **before**
            temperature, top-k, top-p and min-p (vLLM's default ``"raw_logprobs"``).
        n: how many samples of this prompt (int >= 1). The engine fans them out into ``n``
            child requests ``(request_id, 0) .. (request_id, n - 1)`` (as vLLM v1's
            ``ParentRequest`` does), child ``i`` seeded with ``seed + i``; children 1.. wait
            until child 0 has computed the prompt, then share its full prompt blocks
            through the prefix cache (reference counts), so the prompt is stored once.

    Construction checks the fields (:meth:`normalized`); the engine checks and copies them
    again when a request is added, so a later change to this object reaches no request
    already added.
    """

    max_new_tokens: int = 16
    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None
    seed: int | None = None
    ignore_eos: bool = False
    eos_token_id: int | list[int] | None = None
    stop_token_ids: list[int] | None = None
    logprobs: int | None = None
    n: int = 1

    def __post_init__(self):
        self.normalized()

    def normalized(self, vocab_size: int | None = None) -> "SamplingParams":
        """A checked copy with plain Python values: ints, floats (``Fraction(1, 2)``,
        ``numpy.float32(0.5)`` -> ``0.5``), bools, and tuples for ``eos_token_id`` (when
        set) and ``stop_token_ids``.

        Args:
            vocab_size: when given, token ids (``eos_token_id``, ``stop_token_ids``) must be
                in ``[0, vocab_size)`` and ``logprobs <= vocab_size``.

        Raises:
            TypeError: a field of the wrong type (a string, None where a number is needed, a
                bool for a number, a non-integer for an int field); the message names it.
            ValueError: a field out of range: NaN or infinite numbers, ``max_new_tokens < 1``,
                ``seed`` outside ``[0, 2**64 - 1]``, ids outside the vocabulary.
        """
        check_sampling_args(self.temperature, self.top_k, self.top_p, self.min_p)
        ids = {}
        for name in ("eos_token_id", "stop_token_ids"):
            v = getattr(self, name)
            if v is None:
                ids[name] = None if name == "eos_token_id" else ()
            elif vocab_size is not None:
                ids[name] = check_token_ids(v, vocab_size, name)
            else:                                    # the types now, the range when added
                ids[name] = check_token_ids(v, 2**63, name)
        if isinstance(self.stop_token_ids, int) and not isinstance(self.stop_token_ids, bool):
            raise TypeError(f"stop_token_ids must be a list of ints, got {self.stop_token_ids!r}")
        V = vocab_size
        return SamplingParams.__new__(SamplingParams)._fill(
            max_new_tokens=_int("max_new_tokens", self.max_new_tokens, 1),
            temperature=float(self.temperature),
            top_k=None if self.top_k is None else int(self.top_k),
            top_p=None if self.top_p is None else float(self.top_p),
            min_p=None if self.min_p is None else float(self.min_p),
            seed=_int("seed", self.seed, 0, SEED_MAX, none=True),
            ignore_eos=_bool("ignore_eos", self.ignore_eos),
            eos_token_id=ids["eos_token_id"], stop_token_ids=ids["stop_token_ids"],
            logprobs=_int("logprobs", self.logprobs, 0, V, none=True),
            n=_int("n", self.n, 1))

    @classmethod
    def checked(cls, params, config) -> "SamplingParams":
        """``params`` (a :class:`SamplingParams`, a dict of its fields or None) as a checked,
        plain-valued copy, with the EOS ids filled in from ``config`` (an int or a list
        there) when the request leaves them unset.

        Raises:
            TypeError: not one of those kinds, or an unknown field name.
            ValueError: as :meth:`normalized` with ``config.vocab_size``.
        """
        if params is None:
            params = cls()
        elif isinstance(params, dict):
            try:
                params = cls(**params)
            except TypeError as e:
                raise TypeError(f"params: {e}") from None
        elif not isinstance(params, cls):
            raise TypeError(f"params must be a SamplingParams, a dict of its fields or None, "
                            f"got {type(params).__name__} {params!r}")
        if params.eos_token_id is None:
            params = dataclasses.replace(params, eos_token_id=config.eos_token_id)
        return params.normalized(config.vocab_size)

    def _fill(self, **fields) -> "SamplingParams":
        for k, v in fields.items():
            setattr(self, k, v)
        return self

    def validate(self) -> None:
        """Raise ``ValueError``/``TypeError`` naming the first bad field (see
        :meth:`normalized`)."""
        self.normalized()

    def make_generator(self) -> torch.Generator:
        """A CPU ``torch.Generator`` seeded with ``seed`` (or a random seed when None)."""
        g = torch.Generator()
        if self.seed is None:
            g.seed()
        else:
            g.manual_seed(self.seed)
        return g


def check_prompt(prompt_token_ids, vocab_size: int) -> list[int]:
    """The prompt as a list of plain ints in ``[0, vocab_size)``.

    Raises:
        TypeError: not a list / tuple of ints or a 1-D integer tensor / array (None, a
            string, floats, bools, nested lists).
        ValueError: empty, not 1-D, or an id outside the vocabulary.
    """
    name, V = "prompt_token_ids", vocab_size
    if hasattr(prompt_token_ids, "tolist") and hasattr(prompt_token_ids, "dtype"):
        if getattr(prompt_token_ids, "ndim", 1) != 1:
            raise ValueError(f"{name} must be 1-D, got shape "
                             f"{tuple(prompt_token_ids.shape)}")
        prompt_token_ids = prompt_token_ids.tolist()           # tensor / ndarray -> ints
    if not isinstance(prompt_token_ids, (list, tuple)):
        raise TypeError(f"{name} must be a list of ints (or a 1-D integer tensor), got "
                        f"{type(prompt_token_ids).__name__}")
    for t in prompt_token_ids:
        if isinstance(t, bool) or not isinstance(t, numbers.Integral):
            raise TypeError(f"{name} must hold ints, got {type(t).__name__} {t!r}")
    if not prompt_token_ids:
        raise ValueError(f"{name} must hold at least one token id (empty prompt)")
    bad = [t for t in prompt_token_ids if not 0 <= t < V]
    if bad:
        raise ValueError(f"{name} must be in [0, vocab_size={V}), got {int(bad[0])}")
    return [int(t) for t in prompt_token_ids]


def check_arrival_time(arrival_time) -> float | None:
    """``arrival_time`` (``time.perf_counter()`` seconds in ``[0, now]``, or None) as a float.

    Raises:
        TypeError: not a number (a bool, a string).
        ValueError: NaN, infinite, negative or in the future.
    """
    if arrival_time is None:
        return None
    if isinstance(arrival_time, bool) or not isinstance(arrival_time, numbers.Real):
        raise TypeError(f"arrival_time must be a number of seconds "
                        f"(time.perf_counter()) or None, got {arrival_time!r}")
    if not math.isfinite(arrival_time) or arrival_time < 0:
        raise ValueError(f"arrival_time must be finite and >= 0, got {arrival_time!r}")
    now = time.perf_counter()
    if arrival_time > now:
        raise ValueError(f"arrival_time must not be in the future: got {arrival_time!r}"
                         f", time.perf_counter() is {now!r} (a request arrives when "
                         f"it is added or before)")
    return float(arrival_time)


class RequestStatus(enum.Enum):
    """Where a request is: ``WAITING`` (queued or preempted), ``RUNNING`` (has blocks),
    ``FINISHED`` (done: eos / stop / length / abort / error / rejected)."""
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class Request:
    """One request as the scheduler sees it (nano-vllm's ``Sequence``).

    Args:
        request_id: any hashable id, unique within an engine.
        prompt_token_ids: the prompt, a list of ints (validated by the engine, not here).
        params: its :class:`SamplingParams` (validated by the engine).
        arrival_time: ``time.perf_counter()`` seconds; default now.

    Attributes:
        status, output_token_ids, num_computed_tokens, num_cached_tokens, block_table,
        generator (per-request ``torch.Generator``), num_preemptions, finish_reason,
        first_token_time, last_token_time, finish_time (perf_counter seconds or None),
        output_logprobs
        (one ``{token_id: logprob}`` per output token when ``params.logprobs`` is set).
        eos_ids, stop_ids: tuples of the ids that finish it as ``"eos"`` / ``"stop"``.
        prompt_source: for sample 1.. of an ``n > 1`` request, sample 0 (whose computed
            prompt blocks it waits for and shares), else None.
        parent_id: for the samples of an ``n > 1`` request, that request's id, else None.
    """

    def __init__(self, request_id, prompt_token_ids: list[int], params: SamplingParams,
                 arrival_time: float | None = None):
        self.request_id = request_id
        self.prompt_token_ids = list(prompt_token_ids)
        self.params = params
        self.arrival_time = time.perf_counter() if arrival_time is None else arrival_time
        self.output_token_ids: list[int] = []
        self.status = RequestStatus.WAITING
        self.num_computed_tokens = 0
        self.num_cached_tokens = 0
        self.block_table: list[int] = []
        self.generator: torch.Generator | None = None
        self.num_preemptions = 0
        self.finish_reason: str | None = None
        self.first_token_time: float | None = None
        self.last_token_time: float | None = None
        self.finish_time: float | None = None
        self.output_logprobs: list[dict[int, float]] = []
        eos = params.eos_token_id
        self.eos_ids: tuple = () if eos is None else tuple(eos) if isinstance(
            eos, (list, tuple)) else (eos,)
        self.stop_ids: tuple = tuple(params.stop_token_ids or ())
        self.prompt_source: Request | None = None
        self.parent_id = None

    @property
    def token_ids(self) -> list[int]:
        """Prompt followed by the tokens generated so far."""
        return self.prompt_token_ids + self.output_token_ids

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def max_num_tokens(self) -> int:
        """Longest this request can get: prompt + ``max_new_tokens``."""
        return len(self.prompt_token_ids) + self.params.max_new_tokens

    def num_blocks(self, block_size: int, num_tokens: int | None = None) -> int:
        """Blocks of ``block_size`` tokens needed for ``num_tokens`` (default: all so far)."""
        n = self.num_tokens if num_tokens is None else num_tokens
        return math.ceil(n / block_size)

    def __repr__(self) -> str:
        return (f"Request({self.request_id!r}, {self.status.value}, tokens={self.num_tokens}, "
                f"computed={self.num_computed_tokens}, blocks={self.block_table})")


@dataclass
class RequestOutput:
    """The result of one request (vLLM's ``RequestOutput``, flattened).

    Fields:
        request_id, prompt_token_ids, output_token_ids (the generated ids; ends with the
            end-of-sequence id when ``finish_reason == "eos"``, as
            :func:`tokenflow.inference.generate`).
        finish_reason: ``"eos"``, ``"stop"`` (a ``stop_token_ids`` id), ``"length"``
            (``max_new_tokens`` reached), ``"abort"`` (:meth:`LLMEngine.abort`), ``"error"``
            (computing its step raised; ``reason`` says what) or ``"rejected"`` (never run:
            too long for the model or the block pool; ``reason`` says why).
        reason: the rejection or error message, else None.
        arrival_time, first_token_time, finish_time: ``time.perf_counter()`` seconds
            (``finish_time``: when it finished, was aborted or failed).
        num_cached_tokens: prompt tokens the prefix cache supplied at its first admission
            (at most the prompt length - 1; a recompute after a preemption is not counted).
        num_preemptions: how often the request lost its blocks and was recomputed.
        logprobs: None, or one dict per output token: ``{token_id: logprob}`` for the
            ``params.logprobs`` most likely tokens and the chosen one, most likely first
            (raw model log-probabilities, see :class:`SamplingParams`).
        last_token_time: when its last output token was sampled (``time.perf_counter()``
            seconds, None without tokens); equals ``finish_time`` unless it was aborted or
            failed after its last token.

    An aborted (or failed) request keeps the times of the tokens it got: its TTFT is the
    time to its first token and its TPOT runs from its first to its last token, as for any
    request (None without a first / second token); the idle time up to ``abort()`` is in
    ``e2e_latency`` only. :meth:`LLMEngine.metrics` averages these over every request that
    ran, aborted and failed ones included.
    """

    request_id: object
    prompt_token_ids: list[int]
    output_token_ids: list[int]
    finish_reason: str
    reason: str | None = None
    arrival_time: float = 0.0
    first_token_time: float | None = None
    finish_time: float | None = None
    num_cached_tokens: int = 0
    num_preemptions: int = 0
    logprobs: list | None = None
    last_token_time: float | None = None

    @property
    def ttft(self) -> float | None:
        """Time to first token, seconds: first token time - arrival time."""
        if self.first_token_time is None:
            return None
        return self.first_token_time - self.arrival_time

    @property
    def tpot(self) -> float | None:
        """Time per output token after the first, seconds: (last token time - first token
        time) / (tokens - 1), vLLM's ``(last_token_ts - first_token_ts) /
        (num_generation_tokens - 1)``. None with fewer than 2 tokens."""
        n = len(self.output_token_ids)
        if n < 2 or self.last_token_time is None or self.first_token_time is None:
            return None
        return (self.last_token_time - self.first_token_time) / (n - 1)

    @property
    def e2e_latency(self) -> float | None:
        """End-to-end latency, seconds: finish time - arrival time."""
        if self.finish_time is None:
            return None
        return self.finish_time - self.arrival_time

    @classmethod
    def from_request(cls, req: Request, reason: str | None = None) -> "RequestOutput":
        """Snapshot of a finished :class:`Request`."""
        return cls(req.request_id, list(req.prompt_token_ids), list(req.output_token_ids),
                   req.finish_reason, reason, req.arrival_time, req.first_token_time,
                   req.finish_time, req.num_cached_tokens, req.num_preemptions,
                   None if req.params.logprobs is None else
                   [dict(d) for d in req.output_logprobs], req.last_token_time)
