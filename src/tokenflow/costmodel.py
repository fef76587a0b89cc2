"""Back-of-envelope costs for real configs: parameters, KV-cache bytes, FLOPs.

All counts follow the shared model's architecture (GQA or MLA attention, SwiGLU FFN / MoE,
RMSNorm), so for our own configs :func:`param_count` equals ``model.num_parameters()`` exactly
(tested, MLA included). DeepSeek configs carry the MLA fields, and
:func:`kv_cache_bytes_per_token` then counts the compressed cache (DeepSeek-V2 report,
arXiv:2405.04434, Table 1).
"""
from __future__ import annotations

from .config import ModelConfig

__all__ = ["param_count", "active_param_count", "kv_cache_bytes_per_token",
           "mla_kv_cache_bytes_per_token", "mla_decode_attention_costs", "lm_head_flops", "BYTES",
           "reference_models", "reference_config"]

BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1}
"""Bytes per element of common dtypes."""


def _check_bytes(bytes_per_element) -> None:
    if isinstance(bytes_per_element, bool) or not isinstance(bytes_per_element, (int, float)) \
            or bytes_per_element <= 0:
        raise ValueError(f"bytes_per_element must be a number > 0, got {bytes_per_element!r}")


def _ffn_params(H: int, I: int) -> int:
    return 3 * H * I                       # gate, up, down


def _attn_params(c: ModelConfig) -> int:
    H, D, nh = c.hidden_size, c.head_dim, c.num_attention_heads
    if not c.is_mla:
        return H * nh * D * 2 + H * c.num_key_value_heads * D * 2           # q,o + k,v
    dq = c.qk_nope_head_dim + c.qk_rope_head_dim
    q = H * nh * dq if c.q_lora_rank is None else \
        H * c.q_lora_rank + c.q_lora_rank + c.q_lora_rank * nh * dq         # q_a, norm, q_b
    kv = H * (c.kv_lora_rank + c.qk_rope_head_dim) + c.kv_lora_rank \
        + c.kv_lora_rank * nh * (c.qk_nope_head_dim + c.v_head_dim)         # kv_a, norm, kv_b
    return q + kv + nh * c.v_head_dim * H                                   # + o_proj


def param_count(config: ModelConfig) -> int:
    """Total parameters of the shared architecture with this config (tied head counted once).

    Per layer: attention ``2*H*nh*D + 2*H*nkv*D`` (MLA, ``config.is_mla``: ``q_proj`` or
    ``q_a_proj``/``q_a_layernorm``/``q_b_proj``, ``kv_a_proj_with_mqa [H, r+dr]``,
    ``kv_a_layernorm [r]``, ``kv_b_proj [r, nh*(dn+dv)]``, ``o_proj [nh*dv, H]``; the layout of
    :class:`tokenflow.mla.MLAttention`), two RMSNorm weights ``2*H``, and either a
    dense FFN ``3*H*I`` or ``E`` experts ``E*3*H*I_moe`` + shared ``3*H*(n_shared*I_moe)`` +
    router ``E*H``. Plus embedding ``V*H``, final norm ``H`` and LM head ``V*H`` (if untied).
    """
    c = config
    H = c.hidden_size
    total = c.vocab_size * H + H + (0 if c.tie_word_embeddings else c.vocab_size * H)
    for i in range(c.num_hidden_layers):
        total += _attn_params(c) + 2 * H
        if c.layer_is_moe(i):
            total += c.num_experts * _ffn_params(H, c.moe_intermediate_size)
            total += _ffn_params(H, c.num_shared_experts * c.moe_intermediate_size) \
                if c.num_shared_experts else 0
            total += c.num_experts * H
        else:
            total += _ffn_params(H, c.intermediate_size)
    return total


def active_param_count(config: ModelConfig, include_embedding: bool = True) -> int:
    """Parameters one token touches: only ``K`` of ``E`` routed experts count.

    ``include_embedding``: count the input embedding table (one row is read, but reports such
    as DeepSeek-V3's README count the whole table; say which you use).
    """
    c = config
    H = c.hidden_size
    inactive = 0
    for i in range(c.num_hidden_layers):
        if c.layer_is_moe(i):
            inactive += (c.num_experts - c.num_experts_per_tok) * _ffn_params(
                H, c.moe_intermediate_size)
    total = param_count(c) - inactive
    if not include_embedding and not c.tie_word_embeddings:
        total -= c.vocab_size * H
    return total


def kv_cache_bytes_per_token(config: ModelConfig, bytes_per_element: float = 2) -> int:
    """KV-cache bytes one token adds, all layers: GQA / MHA (K and V)
    ``2 * num_hidden_layers * num_key_value_heads * head_dim * bytes_per_element``; MLA
    (``config.is_mla``) :func:`mla_kv_cache_bytes_per_token` (latent + RoPE key).

    Raises:
        ValueError: if ``bytes_per_element <= 0``.
    """
    _check_bytes(bytes_per_element)
    c = config
    if c.is_mla:
        return mla_kv_cache_bytes_per_token(c.num_hidden_layers, c.kv_lora_rank,
                                            c.qk_rope_head_dim, bytes_per_element)
    return int(2 * c.num_hidden_layers * c.num_key_value_heads * c.head_dim * bytes_per_element)


def mla_kv_cache_bytes_per_token(num_hidden_layers: int, kv_lora_rank: int,
                                 qk_rope_head_dim: int, bytes_per_element: float = 2) -> int:
    """MLA cache bytes per token: ``layers * (kv_lora_rank + qk_rope_head_dim) * bytes``
    (DeepSeek-V2 report, arXiv:2405.04434, Table 1: ``(d_c + d_h^R) * l`` elements).

    Raises:
        ValueError: if any size is < 1 or ``bytes_per_element <= 0``.
    """
    _check_bytes(bytes_per_element)
    for name, v in (("num_hidden_layers", num_hidden_layers), ("kv_lora_rank", kv_lora_rank),
                    ("qk_rope_head_dim", qk_rope_head_dim)):
        if v < 1:
            raise ValueError(f"{name} must be >= 1, got {v}")
    return int(num_hidden_layers * (kv_lora_rank + qk_rope_head_dim) * bytes_per_element)


def mla_decode_attention_costs(config: ModelConfig, context_len: int,
                               bytes_per_element: float = 2) -> dict:
    """FLOPs and bytes read by one MLA layer's attention core for one decode token (batch 1),
    in the naive and the absorbed form (:class:`tokenflow.mla.MLAttention`).

    Counted: the work that depends on the form, from the cached entries to the per-head
    outputs ``[nh, dv]`` (the ``q``/``kv_a``/``o`` projections are the same in both forms and
    left out). ``L = context_len`` cached tokens; ``nh, r, dn, dr, dv`` as in
    :mod:`tokenflow.mla`; a multiply-add is 2 FLOPs.

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
    if tokens < 1:
        raise ValueError(f"tokens must be >= 1, got {tokens}")
    return 2 * config.hidden_size * config.vocab_size * tokens


def reference_models() -> dict:
    """The published configs bundled in ``src/tokenflow/data/models.json`` (each entry names
    its sources and marks what is unverified)."""
    import json
    from importlib import resources
    return json.loads((resources.files("tokenflow") / "data" / "models.json")
                      .read_text(encoding="utf-8"))["models"]


def reference_config(name: str) -> ModelConfig:
    """A :class:`ModelConfig` for a bundled real model (``"DeepSeek-V3"``, ``"Mixtral-8x7B"``,
    ``"Llama-3-8B"``, ``"DeepSeek-V4-Pro"``, ``"DeepSeek-V4-Flash"``, ``"GPT-3-175B"``).

    Values the reference gives as annotated text (e.g. ``"2.5 (one secondary copy only -
    UNVERIFIED)"``) are read as their leading number or boolean; a missing
    ``intermediate_size`` is taken as ``moe_intermediate_size``. DeepSeek-V3 gets MLA and YaRN
    RoPE from its config; DeepSeek-V4's attention is modelled as GQA. Fine for shapes and
    counts, not for running.

    Raises:
        ValueError: if ``name`` is not bundled.
    """
    models = reference_models()
    if name not in models:
        raise ValueError(f"name must be one of {sorted(models)}, got {name!r}")
    import re
    hf = {}
    for k, v in models[name]["config"].items():
        if isinstance(v, str) and k != "scoring_func":
            m = re.match(r"\s*(True|False|[0-9.]+)", v)
            if not m:
                continue
            v = {"True": True, "False": False}.get(m.group(1)) if m.group(1) in (
                "True", "False") else (float(m.group(1)) if "." in m.group(1) else int(m.group(1)))
        hf[k] = v
    if not hf.get("intermediate_size"):
        hf["intermediate_size"] = hf.get("moe_intermediate_size")
    if hf.get("scoring_func") not in (None, "softmax", "sigmoid"):
        hf["scoring_func"] = "sigmoid"      # V4's sqrtsoftplus: modelled as sigmoid
    return ModelConfig.from_hf_config(hf, name=name)


# ---- MoE communication (F3)
# Bytes that expert parallelism moves: dispatch sends each (token, expert) pair's hidden state to
# the rank that owns the expert, combine sends the expert output back (same size). Pairs whose
# expert lives on the token's own rank stay local and cost nothing on the wire. Used by chapter 03
# and checked there against the bytes a real torch.distributed run sends
# (tokenflow.expert_parallel).

__all__ += ["moe_a2a_bytes", "expected_remote_fraction", "moe_comm_bytes_per_token",
            "num_moe_layers"]


def _check_count(name: str, v, lo: int) -> None:
    if isinstance(v, bool) or not isinstance(v, int) or v < lo:
        raise ValueError(f"{name} must be an int >= {lo}, got {v!r}")


def moe_a2a_bytes(tokens: int, top_k: int, hidden_size: int, bytes_per_element: float = 2,
                  local_pairs: int = 0) -> int:
    """Bytes one MoE all-to-all sends: ``(tokens * top_k - local_pairs) * hidden_size * bytes``.

    Dispatch sends this many bytes (hidden states out to the experts' ranks) and combine sends the
    same amount back (expert outputs), so one MoE layer moves it twice. ``local_pairs`` are the
    (token, expert) pairs whose expert is on the sending rank: they never leave it. Counts the
    hidden-state payload only (no routing metadata, no deduplication of a token sent to two
    experts on the same rank).

    Args:
        tokens: tokens on the sending rank (``B*S`` of its batch).
        top_k: K, experts per token.
        hidden_size: H.
        bytes_per_element: 2 for bf16, 1 for fp8, 4 for fp32.
        local_pairs: pairs that stay local, ``0 <= local_pairs <= tokens * top_k``.

    Returns:
        bytes (int).

    Raises:
        ValueError: negative or non-int counts, ``top_k < 1``, ``bytes_per_element <= 0``, or
            ``local_pairs`` outside ``[0, tokens*top_k]``.
    """
    _check_count("tokens", tokens, 0)
    _check_count("top_k", top_k, 1)
    _check_count("hidden_size", hidden_size, 1)
    _check_count("local_pairs", local_pairs, 0)
    _check_bytes(bytes_per_element)
    if local_pairs > tokens * top_k:
        raise ValueError(f"local_pairs must be <= tokens * top_k = {tokens * top_k}, "
                         f"got {local_pairs}")
    return int((tokens * top_k - local_pairs) * hidden_size * bytes_per_element)


def expected_remote_fraction(ep_size: int) -> float:
    """Share of (token, expert) pairs that leave their rank when experts are spread evenly over
    ``ep_size`` ranks and routing is uniform: ``(ep_size - 1) / ep_size`` (0 for EP=1).

    Raises:
        ValueError: if ``ep_size`` is not an int >= 1.
    """
    _check_count("ep_size", ep_size, 1)
    return (ep_size - 1) / ep_size


def moe_comm_bytes_per_token(config: ModelConfig, ep_size: int | None = None,
                             dispatch_bytes_per_element: float = 2,
                             combine_bytes_per_element: float = 2) -> dict:
    """All-to-all bytes one token causes in one MoE layer: dispatch ``K * H * b_dispatch`` plus
    combine ``K * H * b_combine``, times the remote fraction.

    Args:
        config: a config with ``num_experts >= 1`` (e.g. ``reference_config("DeepSeek-V3")``).
        ep_size: expert-parallel ranks. ``None``: every pair crosses the network (upper
            bound); otherwise :func:`expected_remote_fraction` (uniform routing).
        dispatch_bytes_per_element, combine_bytes_per_element: element sizes of the two
            directions (bf16: 2; a deployment may dispatch in fp8: 1).

    Returns:
        dict with ``dispatch``, ``combine``, ``total`` (bytes per token per MoE layer) and
        ``remote_fraction``.

    Raises:
        ValueError: dense config, bad ``ep_size`` or element sizes.
    """
    if config.num_experts < 1:
        raise ValueError(f"config must be an MoE config (num_experts >= 1), got "
                         f"num_experts={config.num_experts}")
    _check_bytes(dispatch_bytes_per_element)
    _check_bytes(combine_bytes_per_element)
    f = 1.0 if ep_size is None else expected_remote_fraction(ep_size)
    pair = config.num_experts_per_tok * config.hidden_size
    d = pair * dispatch_bytes_per_element * f
    c = pair * combine_bytes_per_element * f
    return {"dispatch": d, "combine": c, "total": d + c, "remote_fraction": f}


def num_moe_layers(config: ModelConfig) -> int:
    """Number of decoder blocks whose feed-forward is MoE (``config.layer_is_moe``)."""
    return sum(config.layer_is_moe(i) for i in range(config.num_hidden_layers))


# ---- Prefill vs decode (F5)
# What one forward pass computes and what it must read: enough to place prefill and decode on
# the roofline (Williams, Waterman and Patterson 2009: attainable FLOP/s = min(peak FLOP/s,
# arithmetic intensity x memory bandwidth)). Chapter 05 uses them; a fuller cost model is [F7].

__all__ += ["forward_flops", "forward_bytes", "expected_experts_touched"]


def _norm_params(c: ModelConfig) -> int:
    return (2 * c.num_hidden_layers + 1) * c.hidden_size      # two RMSNorms a block + final


def forward_flops(config: ModelConfig, new_tokens: int, cached_tokens: int = 0,
                  batch_size: int = 1) -> int:
    """Matrix-multiply FLOPs of one forward pass: ``batch_size`` sequences, each feeding
    ``new_tokens`` tokens on top of ``cached_tokens`` already in the KV cache.

    ``2 * (active parameters - embedding - norms)`` per token (one multiply + one add per weight
    a token uses: projections, the K routed + shared experts, router, LM head at every new
    position) plus attention ``4 * layers * n_heads * head_dim * new_tokens * (cached_tokens +
    new_tokens)`` per sequence (``Q K^T`` and ``weights @ V`` over every key, masked ones
    included, as a plain non-causal kernel computes them; a causal kernel skips about half
    of the prompt part). Prefill is ``new_tokens = S, cached_tokens = 0``; one decode step is
    ``new_tokens = 1``. Elementwise work (norms, softmax, RoPE) is left out.

    Raises:
        ValueError: ``new_tokens`` or ``batch_size`` < 1, or ``cached_tokens`` < 0.
    """
    _check_count("new_tokens", new_tokens, 1)
    _check_count("cached_tokens", cached_tokens, 0)
    _check_count("batch_size", batch_size, 1)
    c = config
    per_token = 2 * (active_param_count(c, include_embedding=False) - _norm_params(c))
    attn = 4 * c.num_hidden_layers * c.num_attention_heads * c.head_dim * new_tokens * (
        cached_tokens + new_tokens)
    return batch_size * (per_token * new_tokens + attn)


def expected_experts_touched(num_experts: int, top_k: int, num_tokens: int) -> float:
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
    if isinstance(top_k, bool) or not isinstance(top_k, int) or not 1 <= top_k <= num_experts:
        raise ValueError(f"top_k must be an int in [1, num_experts={num_experts}], got {top_k!r}")
    return num_experts * (1 - (1 - top_k / num_experts) ** num_tokens)


def forward_bytes(config: ModelConfig, new_tokens: int, cached_tokens: int = 0,
                  batch_size: int = 1, bytes_per_element: float = 2) -> float:
    """Least bytes one forward pass moves to and from memory: every weight it uses read once
    (shared by the whole batch), the KV cache read (``batch_size * cached_tokens`` tokens) and
    the new K/V written (``batch_size * new_tokens`` tokens), at ``bytes_per_element`` each.

    Weights: all parameters but the input embedding (one row per token is read, counted
    here at ``H`` elements per token); in MoE layers only the routed experts the batch's
    ``batch_size * new_tokens`` tokens are expected to touch
    (:func:`expected_experts_touched`). Activations are left out (they stay in caches and
    registers in a fused kernel), so this is a lower bound.

    Raises:
        ValueError: as :func:`forward_flops`, or ``bytes_per_element <= 0``.
    """
    _check_count("new_tokens", new_tokens, 1)
    _check_count("cached_tokens", cached_tokens, 0)
    _check_count("batch_size", batch_size, 1)
    _check_bytes(bytes_per_element)
    c, T = config, batch_size * new_tokens
    weights = param_count(c) - (0 if c.tie_word_embeddings else c.vocab_size * c.hidden_size)
    if c.num_experts:
        per_expert = _ffn_params(c.hidden_size, c.moe_intermediate_size)
        unused = c.num_experts - expected_experts_touched(c.num_experts,
                                                          c.num_experts_per_tok, T)
        weights -= num_moe_layers(c) * unused * per_expert
    kv = kv_cache_bytes_per_token(c, 1) * batch_size * (cached_tokens + new_tokens)
    return (weights + T * c.hidden_size + kv) * bytes_per_element
