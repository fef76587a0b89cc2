"""Parameter counts of a config: total and active, by part.

Follows the modules of each family the config can describe (:mod:`tokenflow.config.hf_config`):
GQA / MHA / MQA or MLA attention with optional biases, q/k norms and sinks; SwiGLU or 2-matrix
GELU FFN with optional biases; routed, shared and gated shared experts; RMSNorm or LayerNorm;
RoPE or learned positions. For every family the count equals ``sum(p.numel())`` of the real
module built from a tiny config (tested against our model and against ``transformers``).
Also the argument checks the other cost-model modules share.
"""
from __future__ import annotations

from tokenflow import validate
from tokenflow.config import ModelConfig

__all__ = ["param_breakdown", "active_param_breakdown", "param_count", "active_param_count",
           "BYTES", "PARTS"]

BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1}
"""Bytes per element of common dtypes."""

PARTS = ("embedding", "attention", "dense_ffn", "routed_experts", "shared_experts", "router",
         "norms", "lm_head")
"""Keys of :func:`param_breakdown` that add up to ``total``."""


def _check_bytes(bytes_per_element) -> None:
    validate.number("bytes_per_element", bytes_per_element, 0, lo_open=True)


def _check_count(name: str, v, lo: int) -> None:
    validate.integer(name, v, lo)


def _check_countable(c: ModelConfig) -> None:
    if c.unsupported_fields:
        raise ValueError(f"config dropped HF fields {list(c.unsupported_fields)} "
                         "(from_hf_config(allow_unsupported=True)): counts would be wrong")


def _ffn_params(c: ModelConfig, I: int) -> int:
    """One FFN of width ``I``: SwiGLU ``3*H*I`` (gate, up, down) or plain ``2*H*I`` (up,
    down), plus biases ``I`` per input matrix and ``H`` for the output one."""
    H, n_in = c.hidden_size, 2 if c.gated_mlp else 1
    return (n_in + 1) * H * I + ((n_in * I + H) if c.mlp_bias else 0)


def _norm_params(c: ModelConfig, width: int) -> int:
    return width * (2 if c.norm_type == "layernorm" else 1)       # LayerNorm: weight + bias


def _attn_params(c: ModelConfig) -> int:
    """One attention block: projections, biases, q/k norms, sinks (GQA) or MLA's layout."""
    H, D, nh, nkv = c.hidden_size, c.head_dim, c.num_attention_heads, c.num_key_value_heads
    if not c.is_mla:
        n = 2 * H * nh * D + 2 * H * nkv * D                               # q,o + k,v
        n += (nh * D + 2 * nkv * D) * c.attention_bias + H * c.attention_out_bias
        return n + 2 * D * c.qk_norm + nh * c.attention_sinks
    dq = c.qk_nope_head_dim + c.qk_rope_head_dim
    q = H * nh * dq if c.q_lora_rank is None else \
        H * c.q_lora_rank + c.q_lora_rank + c.q_lora_rank * nh * dq        # q_a, norm, q_b
    kv = H * (c.kv_lora_rank + c.qk_rope_head_dim) + c.kv_lora_rank \
        + c.kv_lora_rank * nh * (c.qk_nope_head_dim + c.v_head_dim)        # kv_a, norm, kv_b
    return q + kv + nh * c.v_head_dim * H                                  # + o_proj


def _moe_params(c: ModelConfig) -> dict:
    """One MoE layer: routed experts, shared experts (+ Qwen2-MoE's gate), router."""
    H, E = c.hidden_size, c.num_experts
    shared = _ffn_params(c, c.num_shared_experts * c.moe_intermediate_size) \
        if c.num_shared_experts else 0
    return dict(routed_experts=E * _ffn_params(c, c.moe_intermediate_size),
                shared_experts=shared + H * c.shared_expert_gate,
                router=E * H + E * c.router_bias)


def param_breakdown(config: ModelConfig) -> dict:
    """Total parameters by part (ints); ``total`` is the sum of :data:`PARTS`.

    Parts: ``embedding`` (``V*H``, plus the learned position table
    ``max_position_embeddings*H`` when ``position_embedding_type == "absolute"``),
    ``attention`` (projections, biases, q/k norms, sinks; MLA: ``q_a``/``q_a_layernorm``/
    ``q_b`` or ``q_proj``, ``kv_a_proj_with_mqa``, ``kv_a_layernorm``, ``kv_b_proj``,
    ``o_proj`` as in HF ``DeepseekV3Attention``), ``dense_ffn``, ``routed_experts``,
    ``shared_experts`` (with Qwen2-MoE's ``shared_expert_gate``), ``router`` (weight, gpt-oss
    bias), ``norms`` (two per block and the final one; LayerNorm counts weight and bias),
    ``lm_head`` (0 when tied: the table is counted once, under ``embedding``).
    Also ``mtp``: DeepSeek-V3's multi-token-prediction modules (``enorm``, ``hnorm``,
    ``eh_proj [H, 2H]``, one MoE decoder block, ``shared_head.norm``; embedding and head
    shared), *not* in ``total``: the published 671B excludes them, HF's
    ``DeepseekV3ForCausalLM`` does not build them. Buffers (DeepSeek's
    ``e_score_correction_bias``) are not parameters.

    Raises:
        ValueError: a config with ``unsupported_fields``.
    """
    c = config
    _check_countable(c)
    H, V = c.hidden_size, c.vocab_size
    out = dict.fromkeys(PARTS, 0)
    out["embedding"] = V * H + (c.max_position_embeddings * H
                                if c.position_embedding_type == "absolute" else 0)
    out["lm_head"] = 0 if c.tie_word_embeddings else V * H
    out["norms"] = _norm_params(c, H) * (2 * c.num_hidden_layers + 1)
    out["attention"] = _attn_params(c) * c.num_hidden_layers
    moe_layers = sum(c.layer_is_moe(i) for i in range(c.num_hidden_layers))
    out["dense_ffn"] = _ffn_params(c, c.intermediate_size) * (c.num_hidden_layers - moe_layers)
    for k, v in (_moe_params(c).items() if c.num_experts else ()):
        out[k] = v * moe_layers
    out["total"] = sum(out[k] for k in PARTS)
    moe_block = _attn_params(c) + 2 * _norm_params(c, H) + sum(_moe_params(c).values()) \
        if c.num_experts else 0
    out["mtp"] = c.num_nextn_predict_layers * (3 * _norm_params(c, H) + 2 * H * H + moe_block)
    return out


def active_param_breakdown(config: ModelConfig, include_embedding: bool = True,
                           include_lm_head: bool = True) -> dict:
    """Parameters one token uses, by part: as :func:`param_breakdown`, with the routed
    experts scaled by ``K / E`` (the K chosen of E; shared experts and router always run).

    Convention, stated because publishers differ: DeepSeek-V3's 37B ("36.7B including 0.9B
    for Embedding and 0.9B for the output Head", README_WEIGHTS.md) and Mixtral's 12.9B count
    both tables, the defaults here. ``include_embedding=False`` drops the input table (a
    token reads one row of it) and the learned position table; ``include_lm_head=False``
    drops the head. A tied table is kept while either flag is on (it is the head).

    Raises:
        ValueError: a config with ``unsupported_fields``.
    """
    c = config
    out = param_breakdown(c)
    if c.num_experts:
        out["routed_experts"] = out["routed_experts"] * c.num_experts_per_tok // c.num_experts
    if not include_embedding:                  # a tied table stays while it is the head
        tied_head = c.tie_word_embeddings and include_lm_head
        out["embedding"] = c.vocab_size * c.hidden_size if tied_head else 0
    if not include_lm_head:
        out["lm_head"] = 0
    out["total"] = sum(out[k] for k in PARTS)
    return out


def param_count(config: ModelConfig) -> int:
    """Total parameters: ``param_breakdown(config)["total"]`` (tied head counted once; MTP
    modules excluded)."""
    return param_breakdown(config)["total"]


def active_param_count(config: ModelConfig, include_embedding: bool = True,
                       include_lm_head: bool = True) -> int:
    """Parameters one token touches: ``active_param_breakdown(...)["total"]`` (only ``K`` of
    ``E`` routed experts count; see there for the embedding / head convention)."""
    return active_param_breakdown(config, include_embedding, include_lm_head)["total"]

