"""Prefill, decode, generate: the serving loop of one batch.

* ``prefill``: the whole prompt ``[B,S]`` in one forward pass; writes every prompt token's
  K/V into the cache and returns the last position's logits ``[B,V]``.
* ``decode_step``: one new token per sequence ``[B,1]``; reads the cache, appends its own
  K/V, returns logits ``[B,V]``.
* ``generate``: prefill, then sample + decode until ``max_new_tokens`` or EOS.

Named after gpt-fast's ``prefill`` / ``decode_one_token``.
"""
from __future__ import annotations


import torch

from tokenflow.model.kv_cache import CacheStorage, KVCache
from tokenflow.validate import boolean, integer
from .sampling import check_sampling_args, check_token_ids, is_greedy, sample

__all__ = ["prefill", "decode_step", "generate"]


@torch.inference_mode()
def prefill(model, input_ids: torch.Tensor, kv_cache: KVCache,
            attention_mask: torch.Tensor | None = None, trace=None) -> torch.Tensor:
    """Run the prompt ``input_ids [B,S]`` through ``model``, filling an empty ``kv_cache``.

    A prefill starts a sequence: the cache must be empty (new, or after ``kv_cache.reset()``).
    To continue the cached sequences with more tokens instead (chunked prefill, or several
    tokens at once), call the model itself: ``model(ids, kv_cache=kv_cache)``.

    Returns:
        ``[B, V]`` logits of the last prompt position (where the next token is predicted).

    Raises:
        TypeError: ``kv_cache`` is not a :class:`~tokenflow.model.kv_cache.KVCache` (any
            cache storage).
        ValueError: a non-empty ``kv_cache``; and as the model's forward (ids, lengths, cache
            capacity, cache dtype/device).
    """
    if not isinstance(kv_cache, CacheStorage):
        raise TypeError(f"kv_cache must be a KVCache, got {type(kv_cache).__name__} (prefill "
                        "fills a cache; model(ids) runs without one)")
    if kv_cache.length != 0:
        raise ValueError(
            f"prefill needs an empty kv_cache, got one holding {kv_cache.length} tokens: call "
            "kv_cache.reset() to start over, or model(ids, kv_cache=kv_cache) to continue the "
            "cached sequences (chunked prefill)")
    return model(input_ids, kv_cache=kv_cache, trace=trace, attention_mask=attention_mask,
                 logits_to_keep=1)[:, -1]


@torch.inference_mode()
def decode_step(model, token_ids: torch.Tensor, kv_cache: KVCache, trace=None) -> torch.Tensor:
    """Feed one token per sequence (``token_ids [B]`` or ``[B,1]``) and return ``[B, V]``
    logits for the following position. Reads all cached K/V and appends one slot.

    Raises:
        ValueError: if the cache is full or ids are out of range.
    """
    if token_ids.dim() == 1:
        token_ids = token_ids[:, None]
    return model(token_ids, kv_cache=kv_cache, trace=trace)[:, -1]


def _check_stop_args(config, max_new_tokens, eos_token_id, stop_at_eos) -> tuple[int, ...]:
    """Validate generate's length and stop arguments; return the EOS ids to stop at (empty
    when not stopping)."""
    integer("max_new_tokens", max_new_tokens, 0)
    boolean("stop_at_eos", stop_at_eos)
    if not stop_at_eos:
        return ()
    if eos_token_id is None:
        return config.eos_token_ids     # all of the config's (a tuple; empty when it has none)
    return check_token_ids(eos_token_id, config.vocab_size, "eos_token_id")


@torch.inference_mode()
def generate(model, input_ids: torch.Tensor, max_new_tokens: int = 16,
             temperature: float = 0.0, top_k: int | None = None, top_p: float | None = None,
             min_p: float | None = None, generator: torch.Generator | None = None,
             attention_mask: torch.Tensor | None = None,
             eos_token_id: int | list[int] | None = None,
             trace=None, stop_at_eos: bool = True) -> torch.Tensor:
    """Continue each prompt of ``input_ids [B,S]`` by up to ``max_new_tokens`` tokens.

    Args:
        model: a :class:`~tokenflow.model.transformer.TokenFlowModel`.
        input_ids: ``[B,S]`` prompt ids (left-pad unequal prompts and pass ``attention_mask``).
        max_new_tokens: number of tokens to add (>= 0).
        temperature, top_k, top_p, min_p: sampling settings (see
            :mod:`tokenflow.inference.sampling`); ``temperature=0`` is greedy.
        generator: ``torch.Generator`` for reproducible sampling.
        attention_mask: ``[B,S]`` 1 = real token, 0 = left padding.
        eos_token_id: end-of-sequence id, or a list of them (stop at any); default
            ``model.config.eos_token_ids`` (every id of the config; none when it has none).
            Once a row emits one, the row keeps emitting it; generation stops early when
            every row has.
        stop_at_eos: set False to ignore end-of-sequence and always add
            ``max_new_tokens`` tokens.
        trace: optional :class:`~tokenflow.explain.trace.Trace` (records every forward and
            ``sample``).

    Returns:
        ``[B, S + n]`` int64: the prompts followed by the ``n <= max_new_tokens`` new ids.

    Raises:
        TypeError: ``input_ids`` not an integer tensor, ``generator`` not a torch.Generator,
            ``max_new_tokens`` or ``eos_token_id`` not an int (or, for ``eos_token_id``, a
            list of ints; bools are rejected),
            ``stop_at_eos`` not a bool.
        ValueError: bad sampling arguments, ``input_ids`` not ``[B,S]`` or out of range,
            ``max_new_tokens < 0``, ``eos_token_id`` outside ``[0, vocab_size)`` (it could
            never be produced, so generation would never stop), or prompt + new tokens longer
            than ``max_position_embeddings``.
    """
    check_sampling_args(temperature, top_k, top_p, min_p)
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator or None, "
                        f"got {type(generator).__name__}")
    model._check_inputs(input_ids, None, attention_mask)
    eos_ids = torch.tensor(_check_stop_args(model.config, max_new_tokens, eos_token_id,
                                            stop_at_eos), dtype=torch.long,
                           device=input_ids.device)                     # [n_eos]
    max_new_tokens = int(max_new_tokens)
    B, S = input_ids.shape
    limit = model.config.max_position_embeddings
    if S + max_new_tokens > limit:
        raise ValueError(f"prompt length {S} + max_new_tokens {max_new_tokens} exceeds "
                         f"max_position_embeddings={limit}")
    if max_new_tokens == 0:
        return input_ids.clone()
    dtype = next(model.parameters()).dtype
    cache = KVCache(model.config, B, S + max_new_tokens, dtype=dtype, device=input_ids.device)
    logits = prefill(model, input_ids, cache, attention_mask, trace)   # [B, V]
    out = [input_ids]
    done = torch.zeros(B, dtype=torch.bool, device=input_ids.device)
    for step in range(max_new_tokens):
        if is_greedy(temperature) and bool(torch.isfinite(logits).all()):
            nxt = logits.argmax(dim=-1)         # [B]; == sample(logits, 0) on finite logits
        else:
            nxt = sample(logits, temperature, top_k, top_p, min_p, generator)  # [B]
        if trace is not None:
            trace.record("sample", "sampler", logits, nxt,
                         note=("greedy argmax" if is_greedy(temperature) else
                               f"T={temperature}, top_k={top_k}, top_p={top_p}, "
                               f"min_p={min_p}"))
        if len(eos_ids):
            nxt = torch.where(done, out[-1][:, 0], nxt)     # a finished row repeats its EOS
            done |= torch.isin(nxt, eos_ids)
        nxt = nxt[:, None]                                              # [B, 1]
        out.append(nxt)
        if step == max_new_tokens - 1 or (len(eos_ids) and bool(done.all())):
            break
        logits = decode_step(model, nxt, cache, trace)
    return torch.cat(out, dim=1)
