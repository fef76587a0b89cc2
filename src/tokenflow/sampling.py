"""From vocabulary logits to one next-token id: temperature, top-k, top-p, min-p, sample.

Order (the order of Hugging Face transformers' logits warpers in ``generate``:
``TemperatureLogitsWarper`` -> ``TopKLogitsWarper`` -> ``TopPLogitsWarper`` ->
``MinPLogitsWarper``), each step working on the output of the one before:

1. **temperature** ``T``: ``logits / T``. ``T == 0`` means greedy (argmax), no sampling.
2. **top-k**: keep tokens whose logit is ``>=`` the k-th largest (ties at the k-th value are
   all kept, as in HF).
3. **top-p** (nucleus, Holtzman et al. 2019, arXiv:1904.09751): keep the smallest set of the
   most likely tokens whose probability reaches ``p``; the token whose probability crosses
   the threshold is kept, and at least one token always is. Probabilities are those of the
   logits after steps 1-2.
4. **min-p**: drop tokens whose probability is below ``min_p * max_prob``.

Removed tokens get ``-inf``; ``sample`` then draws from ``softmax`` of what is left.
Why the order matters: temperature changes the probabilities, so the nucleus of top-p is
different before and after it; top-k before top-p renormalises over k tokens first.
vLLM's sampler applies temperature, then top-k and top-p together on the same probabilities
(one sort), which can keep a different set when both are given; min-p there is applied
on probabilities before top-k/top-p.
"""
from __future__ import annotations

import math

import torch

__all__ = ["filter_logits", "sample", "check_sampling_args"]


def check_sampling_args(temperature: float = 1.0, top_k: int | None = None,
                        top_p: float | None = None, min_p: float | None = None) -> None:
    """Raise ``ValueError``/``TypeError`` naming the first invalid sampling argument.

    Allowed: ``temperature >= 0`` (finite), ``top_k`` an int ``>= 1`` or None,
    ``top_p`` in ``(0, 1]`` or None, ``min_p`` in ``[0, 1]`` or None.
    """
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)):
        raise TypeError(f"temperature must be a number, got {type(temperature).__name__}")
    if not math.isfinite(temperature) or temperature < 0:
        raise ValueError(f"temperature must be a finite number >= 0, got {temperature}")
    if top_k is not None:
        if isinstance(top_k, bool) or not isinstance(top_k, int):
            raise TypeError(f"top_k must be an int >= 1 or None, got {top_k!r}")
        if top_k < 1:
            raise ValueError(f"top_k must be >= 1 (or None to disable), got {top_k}")
    if top_p is not None:
        if isinstance(top_p, bool) or not isinstance(top_p, (int, float)):
            raise TypeError(f"top_p must be a number in (0, 1] or None, got {top_p!r}")
        if not 0 < top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    if min_p is not None:
        if isinstance(min_p, bool) or not isinstance(min_p, (int, float)):
            raise TypeError(f"min_p must be a number in [0, 1] or None, got {min_p!r}")
        if not 0 <= min_p <= 1:
            raise ValueError(f"min_p must be in [0, 1], got {min_p}")


def _check_logits(logits: torch.Tensor) -> None:
    if not isinstance(logits, torch.Tensor) or not logits.is_floating_point():
        raise TypeError("logits must be a floating-point torch.Tensor of shape [B, V]")
    if logits.dim() != 2 or logits.shape[-1] < 1:
        raise ValueError(f"logits must have shape [B, V], got {list(logits.shape)}")
    if torch.isnan(logits).any():
        raise ValueError("logits contain NaN")


def filter_logits(logits: torch.Tensor, temperature: float = 1.0, top_k: int | None = None,
                  top_p: float | None = None, min_p: float | None = None) -> torch.Tensor:
    """Apply temperature, top-k, top-p and min-p (in that order) to ``logits [B,V]``.

    Args:
        logits: ``[B, V]`` float scores from the LM head.
        temperature: divide logits by it; 0 keeps only the argmax (ties: the first index).
        top_k: keep the ``top_k`` best (ties at the boundary kept); None disables.
        top_p: keep the smallest most-likely set whose probability reaches ``top_p``.
        min_p: keep tokens with probability ``>= min_p * max probability``.

    Returns:
        ``[B, V]`` float32 logits, ``-inf`` where a token was removed. At least one token
        per row survives.

    Raises:
        TypeError, ValueError: invalid argument (see :func:`check_sampling_args`), logits
            not ``[B, V]`` floating point, or NaN in logits.
    """
    check_sampling_args(temperature, top_k, top_p, min_p)
    _check_logits(logits)
    x = logits.float()
    if temperature == 0:
        keep = torch.zeros_like(x, dtype=torch.bool)
        keep.scatter_(1, x.argmax(dim=-1, keepdim=True), True)
        return x.masked_fill(~keep, float("-inf"))
    if temperature != 1:
        x = x / temperature
    if top_k is not None and top_k < x.shape[-1]:
        kth = x.topk(top_k, dim=-1).values[:, -1:]                    # [B, 1]
        x = x.masked_fill(x < kth, float("-inf"))
    if top_p is not None and top_p < 1:
        sorted_x, order = x.sort(dim=-1, descending=True)             # [B, V]
        probs = sorted_x.softmax(dim=-1)
        before = probs.cumsum(dim=-1) - probs                         # mass ranked above
        drop_sorted = before >= top_p                                 # crosser is kept
        drop_sorted[:, 0] = False                                     # keep at least one
        drop = torch.zeros_like(drop_sorted).scatter(1, order, drop_sorted)
        x = x.masked_fill(drop, float("-inf"))
    if min_p is not None and min_p > 0:
        probs = x.softmax(dim=-1)
        thresh = min_p * probs.max(dim=-1, keepdim=True).values
        x = x.masked_fill(probs < thresh, float("-inf"))
    return x


def sample(logits: torch.Tensor, temperature: float = 1.0, top_k: int | None = None,
           top_p: float | None = None, min_p: float | None = None,
           generator: torch.Generator | None = None) -> torch.Tensor:
    """Pick one next-token id per row of ``logits [B,V]``.

    ``temperature == 0`` returns the argmax (greedy); otherwise filters with
    :func:`filter_logits` and draws from ``softmax`` with ``torch.multinomial`` using
    ``generator`` (pass a seeded ``torch.Generator`` for reproducible draws).

    Returns:
        ``[B]`` int64 token ids.

    Raises:
        TypeError, ValueError: as :func:`filter_logits`.
    """
    if temperature == 0:
        check_sampling_args(temperature, top_k, top_p, min_p)
        _check_logits(logits)
        return logits.argmax(dim=-1)
    probs = filter_logits(logits, temperature, top_k, top_p, min_p).softmax(dim=-1)
    return torch.multinomial(probs, num_samples=1, generator=generator).squeeze(-1)
