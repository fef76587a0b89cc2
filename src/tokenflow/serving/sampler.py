"""From one request's logits row to its next token, with log-probabilities and errors.

The runner computes a step's logits, ``{request_id: [V]}``; :func:`sample_requests` turns
each row into a :class:`SampledToken` with the request's own parameters and its own seeded
generator (:func:`tokenflow.inference.sampling.sample`, the call
:func:`tokenflow.inference.generate` makes), so a request's tokens do not depend on its
batch. Each row is sampled on its own inside
``try``: if one request's sampling raises, that request gets an ``error`` and the others
their tokens (the engine then finishes it with ``finish_reason="error"``).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from tokenflow.inference.sampling import is_greedy, sample
from .request import Request

__all__ = ["SampledToken", "sample_token", "sample_requests", "greedy_tokens"]


@dataclass
class SampledToken:
    """One request's result of a step: ``token`` (int, None on error), ``logprobs``
    (``{token_id: logprob}`` or None when not asked for) and ``error`` (the message of the
    exception raised while sampling, or None)."""

    token: int | None
    logprobs: dict[int, float] | None = None
    error: str | None = None


def sample_token(logits: torch.Tensor, req: Request, greedy: int | None = None
                 ) -> SampledToken:
    """The next token of ``req`` from its logits row ``[V]``.

    Greedy (``temperature < GREEDY_TEMPERATURE``) rows take the argmax of the logits as they
    are, as :func:`tokenflow.inference.generate` does (or ``greedy``, that argmax computed
    already, by :func:`greedy_tokens`); other rows go through
    :func:`tokenflow.inference.sampling.sample` with ``req.generator``.

    Log-probabilities (when ``req.params.logprobs`` is an int ``n``): ``log_softmax`` of the
    raw float32 logits, before temperature and the filters (vLLM's default
    ``"raw_logprobs"``): the chosen token's and the ``n`` largest, in a dict ordered from the
    most likely down (the chosen token last when it is not among the ``n``).

    Raises:
        whatever sampling raises (e.g. ``ValueError`` when ``logits / temperature``
        overflows float32); :func:`sample_requests` catches it.
    """
    p = req.params
    if greedy is not None:
        token = greedy
    elif is_greedy(p.temperature) and bool(torch.isfinite(logits).all()):
        token = int(logits.argmax())
    else:
        token = int(sample(logits[None], p.temperature, p.top_k, p.top_p, p.min_p,
                           req.generator)[0])
    logprobs = None
    if p.logprobs is not None:
        lp = torch.log_softmax(logits.float(), dim=-1)                  # [V]
        top = torch.topk(lp, p.logprobs) if p.logprobs else None
        logprobs = {} if top is None else dict(zip(top.indices.tolist(), top.values.tolist()))
        logprobs.setdefault(token, float(lp[token]))
    return SampledToken(token, logprobs)


def sample_requests(reqs: list[Request], logits: dict) -> dict:
    """:func:`sample_token` for each request, each in its own ``try``.

    Args:
        reqs: the requests whose chunk samples this step.
        logits: ``{request_id: logits [V]}``.

    Returns:
        ``{request_id: SampledToken}``; a request whose sampling raised gets
        ``SampledToken(None, error="<ExceptionType>: <message>")``.
    """
    out, greedy = {}, greedy_tokens(reqs, logits)
    for r in reqs:
        try:
            out[r.request_id] = sample_token(logits[r.request_id], r, greedy.get(r.request_id))
        except Exception as e:                      # noqa: BLE001 (isolate one request)
            out[r.request_id] = SampledToken(None, error=f"{type(e).__name__}: {e}")
    return out


def greedy_tokens(reqs: list[Request], logits: dict) -> dict:
    """The argmax of every greedy request's logits row, for the whole step at once: one
    ``sum`` and one ``argmax`` over the rows stacked ``[N, V]`` instead of a few small ops
    per row (the same tokens: an argmax does not depend on the other rows).

    A row counts as finite when its sum is: one ``inf`` or ``NaN`` anywhere makes the sum
    ``inf`` or ``NaN``, so one reduction per row replaces an elementwise ``isfinite``
    (several times slower on the CPU). A row of finite values whose sum overflows is left
    to :func:`sample_token`, which checks its entries one by one and takes the same argmax.

    Returns:
        ``{request_id: token}`` for the greedy rows whose sum is finite; the others
        (sampled rows, rows with ``inf`` / ``NaN``) are left to :func:`sample_token`, and
        so is every row if the rows cannot be stacked (a missing or misshapen row raises
        there, for that request alone).
    """
    ids = [r.request_id for r in reqs if is_greedy(r.params.temperature)]
    try:
        rows = torch.stack([logits[i] for i in ids]) if ids else None          # [N, V]
    except (KeyError, RuntimeError, TypeError):
        return {}
    if rows is None or rows.dim() != 2:
        return {}
    finite = torch.isfinite(rows.sum(dim=-1)).tolist()                         # [N]
    return {i: t for i, t, ok in zip(ids, rows.argmax(dim=-1).tolist(), finite) if ok}
