"""Prefill and decode, measured: wall-clock time of each phase on a real model.

The two phases run the same weights (chapter 5): *prefill* feeds the whole prompt
``[B, S]`` at once and writes its K/V into the cache; *decode* feeds one token per sequence
``[B, 1]``, reads the whole cache and appends one slot. These helpers time them the way
chapter 05 plots them; :func:`tokenflow.analysis.forward.forward_flops` and
:func:`~tokenflow.analysis.forward.forward_bytes` say what each phase computes and reads.

Every time is the *best* of ``repeats`` calls (the least disturbed one on a shared machine),
in seconds. Inputs are random token ids from a seeded generator: the time of a forward pass
does not depend on which ids it gets.
"""
from __future__ import annotations

import time

import torch

from .generate import decode_step, prefill
from tokenflow.model.kv_cache import KVCache

__all__ = ["best_time", "with_context_length", "time_prefill", "time_decode",
           "time_recompute", "time_decode_batch"]


def best_time(fn, repeats: int = 5) -> float:
    """Least wall-clock seconds of ``repeats`` calls of ``fn()``.

    Raises:
        ValueError: ``repeats`` not an int >= 1.
    """
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats must be an int >= 1, got {repeats!r}")
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def with_context_length(model, max_position_embeddings: int):
    """A copy of ``model`` (eval mode) whose RoPE table has ``max_position_embeddings``
    positions. No weight changes, so it computes exactly what ``model`` computes on short
    inputs and can time longer ones (what it predicts past the trained length is not
    meaningful)."""
    from tokenflow.model.transformer import TokenFlowModel
    longer = TokenFlowModel(model.config.replace(max_position_embeddings=max_position_embeddings))
    longer.load_state_dict(model.state_dict())
    return longer.eval()


def _ids(model, batch_size: int, n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, model.config.vocab_size, (batch_size, n), generator=g)   # [B, n]


def _filled_cache(model, batch_size: int, context: int, room: int) -> KVCache:
    """A cache holding ``context`` tokens per row with ``room`` free slots."""
    cache = KVCache(model.config, batch_size, context + room)
    prefill(model, _ids(model, batch_size, context, context), cache)
    return cache


@torch.inference_mode()
def time_prefill(model, lengths: list[int], batch_size: int = 1, repeats: int = 5) -> list[float]:
    """Seconds of one :func:`~tokenflow.prefill` of a ``[batch_size, S]`` prompt into an
    empty cache, for each ``S`` in ``lengths``."""
    out = []
    for S in lengths:
        ids = _ids(model, batch_size, S, S)                                  # [B, S]
        out.append(best_time(lambda: prefill(model, ids, KVCache(model.config, batch_size, S)),
                             repeats))
    return out


@torch.inference_mode()
def time_decode(model, contexts: list[int], batch_size: int = 1, repeats: int = 5) -> list[float]:
    """Seconds of one :func:`~tokenflow.decode_step` (``[batch_size, 1]`` new tokens) on a
    cache already holding ``L`` tokens per row, for each ``L`` in ``contexts`` (each timed
    call appends one slot, so the context grows by up to ``repeats``)."""
    out = []
    for L in contexts:
        cache = _filled_cache(model, batch_size, L, repeats)
        nxt = _ids(model, batch_size, 1, 0)                                  # [B, 1]
        out.append(best_time(lambda: decode_step(model, nxt, cache), repeats))
    return out


@torch.inference_mode()
def time_recompute(model, contexts: list[int], repeats: int = 5) -> list[float]:
    """Seconds to get the next token's logits *without* a cache: all ``L + 1`` tokens
    through the model again (logits of the last position only), for each ``L``."""
    out = []
    for L in contexts:
        ids = _ids(model, 1, L + 1, L)                                       # [1, L+1]
        out.append(best_time(lambda: model(ids, logits_to_keep=1), repeats))
    return out


def time_decode_batch(model, batch_sizes: list[int], context: int = 32,
                      repeats: int = 5) -> list[float]:
    """Seconds of one decode step of ``B`` sequences with ``context`` cached tokens each,
    for each ``B`` in ``batch_sizes`` (tokens per second = ``B / seconds``)."""
    return [time_decode(model, [context], B, repeats)[0] for B in batch_sizes]
