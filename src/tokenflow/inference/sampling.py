"""From vocabulary logits to one next-token id: temperature, top-k, top-p, min-p, sample.

The LM head gives one score (logit) per vocabulary entry, ``[B, V]``. Sampling turns those
scores into one token id per row, ``[B]``. This module does it **exactly as Hugging Face
transformers does** in ``generate(do_sample=True)``: same steps, same order, same tensor
operations, so the kept sets and probabilities agree (``tests/test_sampling.py`` compares
them with transformers' own processors on thousands of random and boundary cases).

Order (``GenerationMixin._get_logits_processor`` in ``transformers/generation/utils.py``
appends ``TemperatureLogitsWarper``, ``TopKLogitsWarper``, ``TopPLogitsWarper``,
``MinPLogitsWarper`` in this order; each works on the output of the one before):

1. **temperature** ``T``: ``logits / T``. ``T == 0`` means greedy: the argmax, no sampling
   (transformers: ``do_sample=False``). Ties: the first (lowest) index, as ``torch.argmax``.
   Temperatures below :data:`GREEDY_TEMPERATURE` (``1e-5``) are greedy too, as in vLLM:
   dividing by such a tiny number can overflow float32 to ``inf`` and make the softmax NaN,
   and the distribution it would sample from is the argmax anyway.
2. **top-k**: keep every token whose logit is ``>=`` the k-th largest. Tokens tied with the
   k-th value are all kept, so more than ``k`` can survive.
3. **top-p** (nucleus sampling, Holtzman et al. 2019, arXiv:1904.09751): keep the smallest
   set of most likely tokens whose probability reaches ``p``. The token whose probability
   crosses ``p`` is kept; the best token is always kept. Computed as transformers does:
   sort ascending, cumulative sum of the softmax, drop the tail whose cumulative mass is
   ``<= 1 - p``. Probabilities are those after steps 1-2 (renormalised over the top-k
   survivors). Among exactly tied tokens at the boundary, ``torch.sort``'s order decides
   which survive; we call the same sort as transformers, so we agree with it.
4. **min-p** (Nguyen et al. 2024, arXiv:2407.01082): drop tokens whose probability (after
   steps 1-3, renormalised) is below ``min_p * max_prob``. The best token is always kept.

Removed tokens get ``-inf``; :func:`sample` draws from ``softmax`` of what is left with
``torch.multinomial``, as transformers' ``_sample`` does.

Why the order matters:

* Temperature before top-p and min-p: dividing by ``T`` changes the probabilities, so the
  nucleus is larger when ``T > 1`` and smaller when ``T < 1``. (Top-k does not care: dividing
  by ``T > 0`` keeps the ranking.)
* Top-k before top-p: top-p then measures mass among the k survivors only. Those
  renormalised probabilities are larger, so the nucleus can be smaller than top-p alone.
* Min-p last (transformers) or first (vLLM): top-p computed after min-p sees renormalised
  probabilities and can keep fewer tokens.

Differences from transformers' defaults: ``top_k=None`` here means "off", whereas
transformers' ``GenerationConfig`` uses ``top_k=50`` when a model's generation config does not
set it; transformers takes ``top_k=0`` as "off" and rejects ``temperature=0`` in the warper
(greedy is ``do_sample=False`` there).

vLLM (read in its GitHub source, v1 engine: ``vllm/v1/sample/sampler.py``,
``vllm/v1/sample/ops/topk_topp_sampler.py``, ``vllm/v1/sample/logits_processor/builtin.py``;
vLLM itself was not run here): requests with temperature below ``1e-5`` are greedy; otherwise
it divides by the temperature, then applies min-p (an "argmax-invariant" logits processor), then
top-k and top-p together on one ascending sort (``apply_top_k_top_p_pytorch``) with the same
comparisons as transformers (ties at the k-th value kept; tail with cumulative mass
``<= 1 - p`` dropped; best token kept). So the kept set can differ from transformers' when
min-p and top-p are both set. The draw itself differs too: vLLM's PyTorch path uses the
exponential-race trick (``argmax(probs / q)``, ``q ~ Exp(1)``, equivalent to Gumbel-max), and on
CUDA GPUs it may sample with FlashInfer kernels, which its docstring calls statistically
equivalent but not identical; same distribution, different random numbers for a given seed.
Newer vLLM versions also have a Triton kernel for the top-k/top-p masks, which we did not
read. Which path a deployment takes depends on its build and hardware.
"""
from __future__ import annotations


import torch

from tokenflow.validate import integer, number, token_id_list

__all__ = ["filter_logits", "sample", "check_sampling_args", "check_token_ids",
           "apply_temperature",
           "apply_top_k", "apply_top_p", "apply_min_p", "filter_steps", "is_greedy",
           "GREEDY_TEMPERATURE"]

_NEG_INF = float("-inf")

GREEDY_TEMPERATURE = 1e-5
"""Temperatures below this act as ``temperature = 0`` (greedy), as vLLM's sampler does
(``_SAMPLING_EPS = 1e-5`` in ``vllm/v1/sample/sampler.py``)."""


def is_greedy(temperature: float) -> bool:
    """True when ``temperature`` (already validated, ``>= 0``) means greedy decoding:
    ``temperature < GREEDY_TEMPERATURE``."""
    return temperature < GREEDY_TEMPERATURE


def check_sampling_args(temperature: float = 1.0, top_k: int | None = None,
                        top_p: float | None = None, min_p: float | None = None) -> None:
    """Raise ``ValueError``/``TypeError`` naming the first invalid sampling argument.

    Allowed: ``temperature >= 0`` (finite; 0 = greedy), ``top_k`` an int ``>= 1`` or None,
    ``top_p`` in ``(0, 1]`` or None, ``min_p`` in ``[0, 1]`` or None (None, ``top_p=1`` and
    ``min_p=0`` switch the filter off).

    Raises:
        TypeError: an argument is not a number (bools are rejected) or ``top_k`` is not an int.
        ValueError: an argument is NaN, infinite or outside its range.
    """
    number("temperature", temperature, 0)
    integer("top_k", top_k, 1, none=True)
    number("top_p", top_p, 0, 1, lo_open=True, none=True)
    number("min_p", min_p, 0, 1, none=True)


def check_token_ids(token_ids, vocab_size: int, name: str = "eos_token_id"
                    ) -> tuple[int, ...]:
    """Check stop-token ids (an end-of-sequence id or a list of them) against the vocabulary;
    return them as a tuple of plain ints.

    The one check of an end-of-sequence / stop id that :func:`tokenflow.inference.generate` and the
    serving engine (:class:`tokenflow.serving.SamplingParams`) share. An id outside
    ``[0, vocab_size)`` could never be produced, so generation would never stop on it.

    Args:
        token_ids: an int, or a list / tuple of ints (several end-of-sequence ids, as in
            Llama 3's config ``eos_token_id: [128001, 128009]``; stop at any of them). Numpy
            integers are accepted; bools are not.
        vocab_size: the model's ``V``.
        name: the argument's name, for the error message.

    Returns:
        ``tuple[int, ...]`` (one entry for a single id; empty for an empty list).

    Raises:
        TypeError: not an int or a list / tuple of ints.
        ValueError: an id outside ``[0, vocab_size)``.
    """
    return token_id_list(name, token_ids, vocab_size)


def _as_2d(logits: torch.Tensor) -> tuple[torch.Tensor, bool]:
    """Validate ``[B,V]`` or ``[V]`` float logits; return float32 ``[B,V]`` and whether it
    was 1-D."""
    if not isinstance(logits, torch.Tensor) or not logits.is_floating_point():
        raise TypeError("logits must be a floating-point torch.Tensor of shape [B, V] or [V]")
    if logits.dim() not in (1, 2) or logits.shape[-1] < 1 or logits.numel() == 0:
        raise ValueError(f"logits must have shape [B, V] or [V] with V >= 1, "
                         f"got {list(logits.shape)}")
    if torch.isnan(logits).any():
        raise ValueError("logits contain NaN")
    if torch.isposinf(logits).any():
        raise ValueError("logits contain +inf")
    one_d = logits.dim() == 1
    x = logits[None] if one_d else logits
    if not torch.isfinite(x).any(dim=-1).all():
        raise ValueError("every row of logits needs at least one finite value "
                         "(a row is all -inf)")
    # float32 like transformers' _sample (it casts next-token logits to float32); copy=True so
    # that no step ever writes into the caller's tensor.
    return x.to(torch.float32, copy=True), one_d


# ----------------------------------------------------------------------------- the four steps
# Each takes and returns float logits [B, V] (-inf = removed) and mirrors one transformers
# warper line for line (transformers/generation/logits_process.py).

def apply_temperature(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """``logits / temperature`` for ``temperature > 0`` (``TemperatureLogitsWarper``).

    Args:
        logits: ``[B, V]`` float.
        temperature: > 0. Below 1 sharpens the distribution, above 1 flattens it.

    Returns:
        ``[B, V]`` scaled logits (the input itself when ``temperature == 1``).

    Raises:
        ValueError: if ``temperature < GREEDY_TEMPERATURE`` (greedy is handled by
            :func:`filter_logits`), or if the division overflows float32 to ``+inf`` (huge
            logits and a small temperature), which would make the softmax NaN.
    """
    check_sampling_args(temperature)
    if is_greedy(temperature):
        raise ValueError(f"apply_temperature needs temperature >= GREEDY_TEMPERATURE="
                         f"{GREEDY_TEMPERATURE} (smaller ones are greedy), got {temperature}")
    if temperature == 1:
        return logits
    scaled = logits / temperature
    if torch.isposinf(scaled).any():
        raise ValueError(f"logits / temperature overflows float32 at temperature="
                         f"{temperature}; use a larger temperature or temperature=0 (greedy)")
    return scaled


def apply_top_k(logits: torch.Tensor, top_k: int) -> torch.Tensor:
    """Keep tokens whose logit is ``>=`` the ``top_k``-th largest (``TopKLogitsWarper``).

    Ties with the k-th value are all kept. ``top_k >= V`` keeps everything.

    Args:
        logits: ``[B, V]`` float.
        top_k: int ``>= 1``.

    Returns:
        ``[B, V]`` logits, ``-inf`` where removed.

    Raises:
        TypeError, ValueError: if ``top_k`` is not an int ``>= 1``.
    """
    check_sampling_args(top_k=top_k)
    k = min(int(top_k), logits.shape[-1])
    kth = torch.topk(logits, k)[0][..., -1, None]                      # [B, 1]
    return logits.masked_fill(logits < kth, _NEG_INF)


def apply_top_p(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """Nucleus filter (``TopPLogitsWarper``): keep the smallest most-likely set whose
    probability reaches ``top_p``; the token that crosses ``top_p`` is kept, and so is the
    best token always.

    Computed from the bottom, as transformers does: sort ascending, take the cumulative sum
    of the probabilities, and drop every token whose cumulative mass (it and everything less
    likely) is ``<= 1 - top_p``. What is left has mass ``>= top_p``.

    Args:
        logits: ``[B, V]`` float (probabilities are their softmax).
        top_p: in ``(0, 1]``; 1 keeps everything.

    Returns:
        ``[B, V]`` logits, ``-inf`` where removed.

    Raises:
        TypeError, ValueError: if ``top_p`` is not a number in ``(0, 1]``.
    """
    check_sampling_args(top_p=top_p)
    if top_p >= 1:
        return logits
    sorted_logits, sorted_idx = torch.sort(logits, descending=False)   # [B, V] ascending
    cum = sorted_logits.softmax(dim=-1).cumsum(dim=-1)                 # mass from the bottom
    drop_sorted = cum <= (1 - top_p)                                   # the unlikely tail
    drop_sorted[..., -1:] = False                                      # keep the best one
    drop = drop_sorted.scatter(1, sorted_idx, drop_sorted)             # back to vocab order
    return logits.masked_fill(drop, _NEG_INF)


def apply_min_p(logits: torch.Tensor, min_p: float) -> torch.Tensor:
    """Drop tokens whose probability is below ``min_p`` times the best token's probability
    (``MinPLogitsWarper``). The best token always survives.

    Args:
        logits: ``[B, V]`` float.
        min_p: in ``[0, 1]``; 0 keeps everything.

    Returns:
        ``[B, V]`` logits, ``-inf`` where removed.

    Raises:
        TypeError, ValueError: if ``min_p`` is not a number in ``[0, 1]``.
    """
    check_sampling_args(min_p=min_p)
    if min_p == 0:
        return logits
    probs = torch.softmax(logits, dim=-1)                              # [B, V]
    threshold = min_p * probs.amax(dim=-1, keepdim=True)               # [B, 1]
    drop = probs < threshold
    drop.scatter_(-1, torch.topk(probs, 1, dim=-1).indices, False)     # keep the best one
    return logits.masked_fill(drop, _NEG_INF)


# ----------------------------------------------------------------------------- public API

def filter_steps(logits: torch.Tensor, temperature: float = 1.0, top_k: int | None = None,
                 top_p: float | None = None, min_p: float | None = None
                 ) -> dict[str, torch.Tensor]:
    """The logits after each step of :func:`filter_logits`, to see what each one removes.

    Returns:
        dict with keys ``"input"``, ``"temperature"``, ``"top_k"``, ``"top_p"``, ``"min_p"``
        (in that order), each a float32 tensor of the input's shape (``[B, V]`` or ``[V]``),
        ``-inf`` where a token has been removed so far. A disabled step repeats the previous
        tensor. With a greedy temperature (``< GREEDY_TEMPERATURE``, e.g. 0) every step
        after ``"input"`` is the greedy mask.

    Raises:
        TypeError, ValueError: as :func:`filter_logits`.
    """
    check_sampling_args(temperature, top_k, top_p, min_p)
    x, one_d = _as_2d(logits)
    steps = {"input": x}
    if is_greedy(temperature):
        keep = torch.zeros_like(x, dtype=torch.bool)
        keep.scatter_(1, x.argmax(dim=-1, keepdim=True), True)
        greedy = x.masked_fill(~keep, _NEG_INF)
        steps.update(temperature=greedy, top_k=greedy, top_p=greedy, min_p=greedy)
    else:
        steps["temperature"] = x = apply_temperature(x, temperature)
        steps["top_k"] = x = x if top_k is None else apply_top_k(x, top_k)
        steps["top_p"] = x = x if top_p is None else apply_top_p(x, top_p)
        steps["min_p"] = x if min_p is None else apply_min_p(x, min_p)
    return {k: (v[0] if one_d else v) for k, v in steps.items()}


def filter_logits(logits: torch.Tensor, temperature: float = 1.0, top_k: int | None = None,
                  top_p: float | None = None, min_p: float | None = None) -> torch.Tensor:
    """Apply temperature, top-k, top-p and min-p, in that order, to ``logits``.

    Same result as transformers' ``TemperatureLogitsWarper`` -> ``TopKLogitsWarper`` ->
    ``TopPLogitsWarper`` -> ``MinPLogitsWarper`` on float32 logits (see the module docstring
    for the rules at the boundaries and for how vLLM differs).

    Args:
        logits: ``[B, V]`` (or ``[V]``) float scores from the LM head; ``-inf`` entries are
            allowed (already-banned tokens) as long as each row has a finite one.
        temperature: ``>= 0``; divide the logits by it. 0, or anything below
            ``GREEDY_TEMPERATURE = 1e-5`` (as vLLM), keeps only the argmax (greedy; ties: the
            first index) and ignores the other filters.
        top_k: keep the ``top_k`` best (all ties with the k-th kept); None disables.
        top_p: keep the smallest most-likely set whose probability reaches ``top_p``
            (the crossing token kept); None or 1 disables.
        min_p: keep tokens with probability ``>= min_p * max probability``; None or 0
            disables.

    Returns:
        float32 logits of the input's shape, ``-inf`` where a token was removed. At least
        one token per row survives, and no entry is ``+inf`` or NaN. ``softmax`` of it is
        the distribution that is sampled.

    Raises:
        TypeError: logits not a floating-point tensor; argument of the wrong type.
        ValueError: logits not ``[B, V]``/``[V]``, containing NaN or +inf, or a row with no
            finite value; ``temperature < 0``, ``top_k < 1``, ``top_p`` outside ``(0, 1]``,
            ``min_p`` outside ``[0, 1]``; ``logits / temperature`` overflowing float32.
    """
    return filter_steps(logits, temperature, top_k, top_p, min_p)["min_p"]


def sample(logits: torch.Tensor, temperature: float = 1.0, top_k: int | None = None,
           top_p: float | None = None, min_p: float | None = None,
           generator: torch.Generator | None = None) -> torch.Tensor:
    """Pick one next-token id per row of ``logits [B, V]`` (or one id for ``[V]``).

    ``temperature < GREEDY_TEMPERATURE`` (``1e-5``; e.g. 0) returns the argmax (greedy; first
    index on ties), as vLLM does. Otherwise the
    logits are filtered by :func:`filter_logits` and one id per row is drawn from their
    ``softmax`` with ``torch.multinomial`` (as transformers' ``_sample`` does), using
    ``generator``; pass a seeded ``torch.Generator`` for reproducible draws.

    Returns:
        ``[B]`` int64 token ids (a 0-d tensor for ``[V]`` input).

    Raises:
        TypeError, ValueError: as :func:`filter_logits`.
    """
    filtered = filter_logits(logits, temperature, top_k, top_p, min_p)
    x = filtered[None] if filtered.dim() == 1 else filtered
    if is_greedy(temperature):
        ids = x.argmax(dim=-1)
    else:
        probs = x.softmax(dim=-1)                                      # [B, V]
        ids = torch.multinomial(probs, num_samples=1, generator=generator).squeeze(-1)
    return ids[0] if filtered.dim() == 1 else ids
