"""A request and what it gets back: prompt ids, sampling parameters, status, result.

Follows vLLM's ``SamplingParams`` / ``RequestOutput`` and nano-vllm's ``Sequence``: one object
per request that the scheduler moves between queues and the block manager gives blocks to.
Token counts (the scheduler's bookkeeping):

* ``token_ids = prompt_token_ids + output_token_ids``; ``num_tokens = len(token_ids)``.
* ``num_computed_tokens``: tokens whose K/V the cache holds (0 after a preemption).
* ``num_cached_tokens``: how many of them the prefix cache supplied at admission.
* ``block_table``: ids of the KV blocks holding this request's tokens, in order.
"""
from __future__ import annotations

import enum
import math
import time
from dataclasses import dataclass

import torch

from tokenflow.inference.sampling import check_sampling_args

__all__ = ["SamplingParams", "RequestStatus", "Request", "RequestOutput"]


@dataclass
class SamplingParams:
    """How one request is continued (vLLM's ``SamplingParams``, our names).

    Fields:
        max_new_tokens: tokens to generate at most (int >= 1).
        temperature, top_k, top_p, min_p: as :func:`tokenflow.inference.sampling.filter_logits`;
            ``temperature=0`` is greedy.
        seed: seeds this request's own ``torch.Generator`` (None: a random seed), so the
            draws do not depend on other requests in the batch.
        ignore_eos: keep generating after the end-of-sequence token (vLLM ``ignore_eos``).
        eos_token_id: end-of-sequence id; None: the model config's.
    """

    max_new_tokens: int = 16
    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None
    seed: int | None = None
    ignore_eos: bool = False
    eos_token_id: int | None = None

    def validate(self) -> None:
        """Raise ``ValueError``/``TypeError`` naming the first bad field (called by the
        engine for every request; a failure rejects that request only)."""
        if isinstance(self.max_new_tokens, bool) or not isinstance(self.max_new_tokens, int) \
                or self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be an int >= 1, got {self.max_new_tokens!r}")
        check_sampling_args(self.temperature, self.top_k, self.top_p, self.min_p)
        for name in ("seed", "eos_token_id"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
                raise ValueError(f"{name} must be an int >= 0 or None, got {v!r}")

    def make_generator(self) -> torch.Generator:
        """A CPU ``torch.Generator`` seeded with ``seed`` (or a random seed when None)."""
        g = torch.Generator()
        if self.seed is None:
            g.seed()
        else:
            g.manual_seed(self.seed)
        return g


class RequestStatus(enum.Enum):
    """Where a request is: ``WAITING`` (queued or preempted), ``RUNNING`` (has blocks),
    ``FINISHED`` (done: eos / length / rejected)."""
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
        first_token_time, finish_time (perf_counter seconds or None).
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
        self.finish_time: float | None = None

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
            end-of-sequence id when ``finish_reason == "eos"``, as :func:`tokenflow.inference.generate`).
        finish_reason: ``"eos"``, ``"length"`` (``max_new_tokens`` reached) or
            ``"rejected"`` (never run; ``reason`` says why).
        reason: the rejection message, else None.
        arrival_time, first_token_time, finish_time: ``time.perf_counter()`` seconds.
        num_cached_tokens: prompt tokens the prefix cache supplied (at the last admission).
        num_preemptions: how often the request lost its blocks and was recomputed.
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

    @property
    def ttft(self) -> float | None:
        """Time to first token, seconds: first token time - arrival time."""
        if self.first_token_time is None:
            return None
        return self.first_token_time - self.arrival_time

    @property
    def tpot(self) -> float | None:
        """Time per output token after the first, seconds (None with < 2 tokens)."""
        n = len(self.output_token_ids)
        if n < 2 or self.finish_time is None or self.first_token_time is None:
            return None
        return (self.finish_time - self.first_token_time) / (n - 1)

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
                   req.finish_time, req.num_cached_tokens, req.num_preemptions)
