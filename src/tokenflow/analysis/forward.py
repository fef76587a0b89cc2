"""What one forward pass computes and what it must read: FLOPs and bytes per forward.

Enough to place prefill and decode on the roofline (Williams, Waterman and Patterson 2009:
attainable FLOP/s = min(peak FLOP/s, arithmetic intensity x memory bandwidth)).

One vocabulary: every function of a pass takes ``config`` and then, by keyword only,
``batch`` (sequences, B), ``new_tokens`` (tokens each sequence feeds now, S: the prompt for a
prefill, 1 for a decode step) and ``cached_tokens`` (tokens each already holds in the KV
cache), in that order, so ``forward_flops(c, batch=64, new_tokens=1, cached_tokens=4095)``
and ``forward_bytes`` of the same keywords describe the same step. A positional call raises
``TypeError`` instead of giving the number of another step.

FLOPs (:func:`forward_flops`): a multiply-add is 2 FLOPs; every matrix multiply of the
forward pass: attention projections, attention scores and weighted sum over the context,
dense FFN, the ``K`` routed and the shared experts, the router, the LM head. Norms, RoPE,
softmax and activations (a few FLOPs per element) are left out. Checked against
``torch.utils.flop_counter`` on the shared model (with ``causal=False``: the counter counts
the full masked block). Attention FLOPs are the causal work (the masked triangle skipped).
"""
from __future__ import annotations

from tokenflow import validate
from tokenflow.config import ModelConfig

from .memory import _attention_params_per_device, kv_cache_bytes, weight_bytes_per_device
from .params import PARTS, _check_bytes, _check_count, _check_countable, param_breakdown

__all__ = ["forward_flops", "forward_bytes", "forward_weight_bytes", "arithmetic_intensity",
           "flops_per_token", "expected_experts_touched", "mla_decode_attention_costs",
           "lm_head_flops"]


def _attn_proj_flops(c: ModelConfig) -> int:
    """Projection FLOPs per token per layer: 2 per weight of the attention matrices (MLA
    in the naive form, ``kv_b_proj`` applied to each new token)."""
    H, D, nh, nkv = c.hidden_size, c.head_dim, c.num_attention_heads, c.num_key_value_heads
    if not c.is_mla:
        return 2 * (2 * H * nh * D + 2 * H * nkv * D)
    dq = c.qk_nope_head_dim + c.qk_rope_head_dim
    q = H * nh * dq if c.q_lora_rank is None else c.q_lora_rank * (H + nh * dq)
    kv = H * (c.kv_lora_rank + c.qk_rope_head_dim) \
        + c.kv_lora_rank * nh * (c.qk_nope_head_dim + c.v_head_dim)
    return 2 * (q + kv + nh * c.v_head_dim * H)


def forward_flops(config: ModelConfig, *, batch: int = 1, new_tokens: int,
                  cached_tokens: int = 0, logits: str = "all", causal: bool = True) -> dict:
    """FLOPs of one forward pass over ``[batch, new_tokens]`` new tokens after
    ``cached_tokens`` cached ones, by part: ``attention_proj``, ``attention_scores`` (``q.k``
    and weights @ V: ``2 * nh * L * (d_qk + d_v)`` per query; MLA counts the form that runs,
    absorbed for a decode step, ``d_qk = r + dr, d_v = r``, naive otherwise; ``L`` the keys
    the query is computed against), ``dense_ffn``, ``routed_experts`` (``K`` per token),
    ``shared_experts``, ``router``, ``lm_head`` (``logits="all"`` positions or only the
    ``"last"``), and ``total``.

    ``causal=True`` (default): query ``i`` of the block meets the ``cached_tokens + i + 1``
    keys it may see, capped at ``sliding_window`` on sliding layers: the work of a causal kernel
    that skips the masked triangle (FlashAttention, Dao et al. 2022; FlashMLA's prefill), about
    half the block's scores for a long prompt. ``causal=False``: every query against all
    ``cached_tokens + new_tokens`` keys, what a dense masked kernel computes and what
    ``torch.utils.flop_counter`` reports for ``scaled_dot_product_attention`` or a masked
    matmul (it counts the shapes, not the mask). A decode step (``new_tokens == 1``) is the same
    either way.

    Raises:
        ValueError: counts out of range, ``logits`` not ``"all"``/``"last"``, a config with
            ``unsupported_fields``.
        TypeError: ``causal`` not a bool.
    """
    c = config
    _check_countable(c)
    _check_count("batch", batch, 1)
    _check_count("new_tokens", new_tokens, 1)
    _check_count("cached_tokens", cached_tokens, 0)
    validate.choice("logits", logits, ("all", "last"))
    validate.boolean("causal", causal)
    S, P = new_tokens, cached_tokens
    T, H = batch * S, c.hidden_size
    d_qk, d_v = _attention_widths(c, S)
    out = dict.fromkeys(("attention_proj", "attention_scores", "dense_ffn", "routed_experts",
                         "shared_experts", "router", "lm_head"), 0)
    for i in range(c.num_hidden_layers):
        W = c.sliding_window if c.layer_is_sliding(i) else None
        keys = _keys_met(S, P, W) if causal else S * (P + S if W is None else min(P + S, W))
        out["attention_proj"] += T * _attn_proj_flops(c)
        out["attention_scores"] += batch * keys * 2 * c.num_attention_heads * (d_qk + d_v)
        if not c.layer_is_moe(i):
            out["dense_ffn"] += T * 2 * _ffn_matmul_params(c, c.intermediate_size)
            continue
        out["routed_experts"] += T * c.num_experts_per_tok * 2 * _ffn_matmul_params(
            c, c.moe_intermediate_size)
        out["shared_experts"] += T * 2 * _ffn_matmul_params(
            c, c.num_shared_experts * c.moe_intermediate_size)
        out["router"] += T * 2 * c.num_experts * H
    out["lm_head"] = 2 * H * c.vocab_size * (T if logits == "all" else batch)
    out["total"] = sum(out.values())
    return out


def _keys_met(new_tokens: int, cached_tokens: int, window: int | None) -> int:
    """(query, key) pairs a causal kernel computes for ``new_tokens`` queries after
    ``cached_tokens`` cached keys: ``sum over i of min(cached_tokens + i + 1, window)`` (no
    cap when ``window`` is ``None``), in closed form."""
    S = new_tokens
    lo, hi = cached_tokens + 1, cached_tokens + S             # keys of the first / last query
    if window is None or hi <= window:
        return (lo + hi) * S // 2
    if lo >= window:
        return window * S
    under = window - lo                                       # queries below the cap
    return (lo + window - 1) * under // 2 + window * (S - under)


def _attention_widths(c: ModelConfig, new_tokens: int) -> tuple[int, int]:
    """(key width, value width) of the attention core as it runs. GQA / MHA: ``head_dim``
    both. MLA: the naive form ``(dn + dr, dv)`` for a prefill or chunk, the absorbed form
    ``(r + dr, r)`` for a decode step (``new_tokens == 1``), as :class:`tokenflow.mla.MLAttention`
    and DeepSeek's FlashMLA run it (MQA mode: one 576-wide key and 512-wide value shared by
    all heads, for DeepSeek-V3's ``r = 512, dr = 64``). The absorbed form's two small
    matmuls per token (``W_UK`` into the query, ``W_UV`` on the output) cost what the naive
    form's ``kv_b_proj`` of the new token costs, so the projections need no switch."""
    if not c.is_mla:
        return c.head_dim, c.head_dim
    if new_tokens == 1:
        return c.kv_lora_rank + c.qk_rope_head_dim, c.kv_lora_rank
    return c.qk_nope_head_dim + c.qk_rope_head_dim, c.v_head_dim


def _ffn_matmul_params(c: ModelConfig, I: int) -> int:
    return (3 if c.gated_mlp else 2) * c.hidden_size * I


def flops_per_token(config: ModelConfig, context_len: int, phase: str = "decode") -> float:
    """FLOPs per token: ``"decode"``, one new token reading ``context_len - 1`` cached ones
    (LM head once); ``"prefill"``, a ``context_len`` prompt, total / ``context_len`` (LM head
    on the last position only, as a server computes it).

    Raises:
        ValueError: ``phase`` not ``"decode"``/``"prefill"``, ``context_len < 1``.
    """
    per_seq = 1 if phase == "decode" else context_len
    return _sequence_flops(config, context_len, phase)["total"] / per_seq


def _sequence_flops(config: ModelConfig, context_len: int, phase: str) -> dict:
    """:func:`forward_flops` of one sequence's step: a decode step after ``context_len - 1``
    cached tokens, or a ``context_len`` prefill with the LM head on its last position."""
    _check_count("context_len", context_len, 1)
    if phase == "decode":
        return forward_flops(config, new_tokens=1, cached_tokens=context_len - 1)
    if phase == "prefill":
        return forward_flops(config, new_tokens=context_len, logits="last")
    raise ValueError(f"phase must be 'decode' or 'prefill', got {phase!r}")


def arithmetic_intensity(config: ModelConfig, *, batch: int = 1, new_tokens: int,
                         cached_tokens: int = 0, bytes_per_element: float = 2,
                         causal: bool = True) -> float:
    """FLOPs per byte of one forward pass on one device: ``batch`` sequences each feeding
    ``new_tokens`` tokens after ``cached_tokens`` cached ones (prefill: ``new_tokens = S,
    cached_tokens = 0``; a decode step: ``new_tokens = 1``). Numerator
    :func:`forward_flops` of the same arguments (LM head at every new position; causal
    attention work unless ``causal=False``); denominator
    :func:`forward_bytes` (weights read once, KV read and written, at ``bytes_per_element``).
    Compare with :func:`~tokenflow.analysis.roofline.ridge_point`.

    Raises:
        ValueError: the errors of the two functions (counts out of range,
            ``bytes_per_element <= 0``).
    """
    shape = dict(batch=batch, new_tokens=new_tokens, cached_tokens=cached_tokens)
    flops = forward_flops(config, **shape, causal=causal)["total"]
    return flops / forward_bytes(config, **shape, bytes_per_element=bytes_per_element)


def expected_experts_touched(num_experts: int, top_k: int, *, num_tokens: int) -> float:
    """Expected number of distinct experts that ``num_tokens`` tokens, each routed to
    ``top_k`` of ``num_experts`` experts uniformly at random, use in one MoE layer:
    ``E * (1 - (1 - K/E) ** T)`` (each expert is missed by one token with probability
    ``1 - K/E``). ``K`` for one token, close to ``E`` for a large batch.

    Raises:
        ValueError: ``num_experts < 1``, ``top_k`` outside ``[1, num_experts]``,
            ``num_tokens < 0``.
    """
    _check_count("num_experts", num_experts, 1)
    _check_count("num_tokens", num_tokens, 0)
    validate.integer("top_k", top_k, 1, num_experts, hi_name="num_experts")
    return num_experts * (1 - (1 - top_k / num_experts) ** num_tokens)


def forward_weight_bytes(config: ModelConfig, *, batch: int = 1, new_tokens: int,
                         bytes_per_element: float = 2, tp_size: int = 1,
                         ep_size: int = 1) -> dict:
    """Weight bytes one forward pass of ``batch`` sequences of ``new_tokens`` new tokens
    (``T = B*S`` in all) reads on one device, by part (the keys of :data:`PARTS`) and
    ``total``.

    The rule: a dense model reads all of its weights in every pass, whatever ``tokens`` is;
    an MoE reads only the routed experts its ``T`` tokens touch, so its bytes grow with the
    tokens of a pass until every expert is hit (:func:`expected_experts_touched`, uniform routing).
    ``embedding``: one row of ``H`` elements per token (a lookup, not the table; a learned
    position table, if any, is counted whole). Other parts: whole, at the layout of
    :func:`weight_bytes_per_device` (``tp_size`` splits embedding rows, attention (K/V
    heads down to one per device), dense FFN, shared experts and LM head; ``ep_size`` gives
    the device ``E / ep_size`` experts, touched
    by the ``T * max(ep_size // tp_size, 1)`` tokens of its expert-parallel group).
    The weights term of :func:`forward_bytes`.

    Returns:
        dict of bytes (floats): ``embedding``, ``attention``, ``dense_ffn``,
        ``routed_experts``, ``shared_experts``, ``router``, ``norms``, ``lm_head``, ``total``;
        and ``experts_touched`` (expected distinct experts per MoE layer on this device).

    Raises:
        ValueError: ``batch`` or ``new_tokens`` < 1, ``bytes_per_element <= 0``, or the
            errors of :func:`weight_bytes_per_device`.
    """
    _check_count("batch", batch, 1)
    _check_count("new_tokens", new_tokens, 1)
    c, b, tokens = config, bytes_per_element, batch * new_tokens
    weight_bytes_per_device(c, tp_size=tp_size, ep_size=ep_size,
                            bytes_per_param=b)                # validates the layout
    p = param_breakdown(c)
    table = 0 if c.tie_word_embeddings else c.vocab_size * c.hidden_size
    out = {k: p[k] * b / tp_size for k in ("dense_ffn", "shared_experts", "lm_head")}
    out["attention"] = _attention_params_per_device(c, tp_size) * b
    out["embedding"] = (p["embedding"] - table + tokens * c.hidden_size) / tp_size * b
    out["norms"], out["router"] = p["norms"] * b, p["router"] * b
    out["routed_experts"], touched = 0.0, 0.0
    if c.num_experts:                     # share of the experts the group's tokens hit
        hit = expected_experts_touched(c.num_experts, c.num_experts_per_tok, num_tokens=tokens
                                       * max(ep_size // tp_size, 1)) / c.num_experts
        out["routed_experts"] = p["routed_experts"] / ep_size * b * hit
        touched = hit * c.num_experts / ep_size
    out = {k: out[k] for k in PARTS}
    out["total"] = sum(out.values())
    out["experts_touched"] = touched
    return out


def forward_bytes(config: ModelConfig, *, batch: int = 1, new_tokens: int,
                  cached_tokens: int = 0, bytes_per_element: float = 2,
                  kv_bytes_per_element: float | None = None, tp_size: int = 1,
                  ep_size: int = 1) -> float:
    """Least bytes one forward pass moves to and from memory on one device: every weight it
    uses read once (shared by the whole batch), the KV cache read (``batch * cached_tokens``
    tokens) and the new tokens' K/V **written** (``batch * new_tokens`` tokens):
    ``kv_cache_bytes(config, batch=batch, context_len=cached_tokens + new_tokens)``, so sliding
    layers count at most ``sliding_window`` slots. The one bytes formula of the book:
    :func:`tokenflow.analysis.roofline.roofline`'s ``memory_bytes`` is this function.

    Weights (``bytes_per_element`` each): :func:`forward_weight_bytes` of the pass's
    ``batch * new_tokens`` tokens: all parameters but the input embedding table (one
    row per token is read, ``H`` elements per token); in MoE layers only the routed experts
    the tokens are expected to touch (:func:`expected_experts_touched`). Activations are left
    out (they stay in caches and registers in a fused kernel), so this is a lower bound.

    Parallelism (the layout of :func:`weight_bytes_per_device`): ``tp_size`` splits attention,
    dense FFN, shared experts, LM head, the embedding rows and the KV heads; ``ep_size`` gives
    the device ``E / ep_size`` experts, touched by the ``T * max(ep_size // tp_size, 1)``
    tokens of the expert-parallel group (each of its tensor-parallel groups runs its own
    ``T = batch * new_tokens``). ``kv_bytes_per_element``: the cache's element size
    (``None``: ``bytes_per_element``).

    Raises:
        ValueError: ``batch`` or ``new_tokens`` < 1, ``cached_tokens`` < 0, element sizes
            <= 0, or the errors of :func:`weight_bytes_per_device` and :func:`kv_cache_bytes`.
    """
    _check_count("batch", batch, 1)
    _check_count("new_tokens", new_tokens, 1)
    _check_count("cached_tokens", cached_tokens, 0)
    _check_bytes(bytes_per_element)
    kv_b = bytes_per_element if kv_bytes_per_element is None else kv_bytes_per_element
    weights = forward_weight_bytes(config, batch=batch, new_tokens=new_tokens,
                                   bytes_per_element=bytes_per_element, tp_size=tp_size,
                                   ep_size=ep_size)["total"]
    return weights + kv_cache_bytes(config, batch=batch, context_len=cached_tokens + new_tokens,
                                    bytes_per_element=kv_b, tp_size=tp_size)


def mla_decode_attention_costs(config: ModelConfig, context_len: int, *,
                               bytes_per_element: float = 2) -> dict:
    """FLOPs and bytes read by one MLA layer's attention core for one decode token (batch 1),
    in the naive and the absorbed form (:class:`tokenflow.model.mla.MLAttention`).

    Counted: the work that depends on the form, from the cached entries to the per-head
    outputs ``[nh, dv]`` (the ``q``/``kv_a``/``o`` projections are the same in both forms and
    left out). ``L = context_len`` cached tokens; ``nh, r, dn, dr, dv`` as in
    :mod:`tokenflow.model.mla`; a multiply-add is 2 FLOPs.

    * naive: expand every cached latent with ``kv_b_proj`` (``2 L r nh (dn+dv)``), scores
      ``2 nh L (dn+dr)``, weighted sum of V ``2 nh L dv``. Reads the cache ``L (r+dr)``, the
      ``kv_b_proj`` weight ``r nh (dn+dv)`` and the expanded K and V ``L nh (dn+dr+dv)``.
    * absorbed: fold ``W_UK`` into the query ``2 nh dn r``, scores ``2 nh L (r+dr)``, weighted
      sum of latents ``2 nh L r``, ``W_UV`` on the result ``2 nh r dv``. Reads the cache and the
      same weight, nothing expanded.

    Returns:
        ``{"naive": {"flops", "bytes_read"}, "absorbed": {"flops", "bytes_read"}}`` (ints).

    Raises:
        ValueError: a config without MLA, ``context_len < 1`` or ``bytes_per_element <= 0``.
    """
    if not config.is_mla:
        raise ValueError("config must be an MLA config (kv_lora_rank set)")
    _check_count("context_len", context_len, 1)
    _check_bytes(bytes_per_element)
    c, L = config, context_len
    nh, r, dn, dr, dv = (c.num_attention_heads, c.kv_lora_rank, c.qk_nope_head_dim,
                         c.qk_rope_head_dim, c.v_head_dim)
    shared = L * (r + dr) + r * nh * (dn + dv)                  # cache + kv_b_proj weight
    naive = dict(flops=2 * L * r * nh * (dn + dv) + 2 * nh * L * (dn + dr) + 2 * nh * L * dv,
                 bytes_read=int((shared + L * nh * (dn + dr + dv)) * bytes_per_element))
    absorbed = dict(flops=2 * nh * dn * r + 2 * nh * L * (r + dr) + 2 * nh * L * r
                    + 2 * nh * r * dv, bytes_read=int(shared * bytes_per_element))
    return {"naive": naive, "absorbed": absorbed}


def lm_head_flops(config: ModelConfig, tokens: int = 1) -> int:
    """FLOPs of the LM head for ``tokens`` positions: ``2 * H * V`` each (multiply + add).

    Raises:
        ValueError: if ``tokens < 1``.
    """
    _check_count("tokens", tokens, 1)
    return 2 * config.hidden_size * config.vocab_size * tokens
