"""Back-of-envelope costs for real configs: parameters, KV-cache bytes, memory per device.

Parameters (:func:`param_breakdown`) follow the modules of each family the config can
describe (:mod:`tokenflow.config.hf_config`): GQA / MHA / MQA or MLA attention with optional biases,
q/k norms and sinks; SwiGLU or 2-matrix GELU FFN with optional biases; routed, shared and
gated shared experts; RMSNorm or LayerNorm; RoPE or learned positions. For every family the
count equals ``sum(p.numel())`` of the real module built from a tiny config (tested against
our model and against ``transformers``). KV bytes count MLA's compressed cache (DeepSeek-V2
report, arXiv:2405.04434, Table 1) and sliding windows. FLOPs and time:
:mod:`tokenflow.analysis.roofline`.
"""
from __future__ import annotations

from tokenflow.config import ModelConfig

__all__ = ["param_breakdown", "active_param_breakdown", "param_count", "active_param_count",
           "kv_cache_bytes_per_token", "kv_cache_bytes", "mla_kv_cache_bytes_per_token",
           "mla_decode_attention_costs", "weight_bytes_per_device", "max_batch_size",
           "lm_head_flops", "BYTES", "reference_models", "reference_config",
           "reference_value_unverified", "reference_hf_config"]

BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1}
"""Bytes per element of common dtypes."""

PARTS = ("embedding", "attention", "dense_ffn", "routed_experts", "shared_experts", "router",
         "norms", "lm_head")
"""Keys of :func:`param_breakdown` that add up to ``total``."""


def _check_bytes(bytes_per_element) -> None:
    if isinstance(bytes_per_element, bool) or not isinstance(bytes_per_element, (int, float)) \
            or bytes_per_element <= 0:
        raise ValueError(f"bytes_per_element must be a number > 0, got {bytes_per_element!r}")


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


def _mla_entry_elements(kv_lora_rank: int, qk_rope_head_dim: int) -> int:
    """Numbers MLA caches per token and layer: the latent plus the shared RoPE key."""
    return kv_lora_rank + qk_rope_head_dim


def _kv_share(c: ModelConfig, tp_size: int) -> float:
    """Share of the K/V heads one of ``tp_size`` tensor-parallel devices holds: their
    cache entries and their projection weights (``k_proj`` / ``v_proj``). The heads are
    split while there are enough, ``num_key_value_heads / tp_size`` per device, and a head
    is never split: when ``tp_size > num_key_value_heads`` every device holds one whole head
    (replicated ``tp_size / num_key_value_heads`` times; Megatron-LM and vLLM replicate the
    KV heads so). MLA caches one latent per token, which every device needs: share 1 (its
    ``kv_a_proj_with_mqa`` and ``kv_a_layernorm`` are replicated, vLLM's
    ``ReplicatedLinear``).

    Raises:
        ValueError: ``tp_size`` neither divides ``num_key_value_heads`` nor is a multiple of
            it (GQA/MQA).
    """
    if c.is_mla:
        return 1.0
    nkv = c.num_key_value_heads
    if nkv % tp_size and tp_size % nkv:
        raise ValueError(f"tp_size ({tp_size}) must divide num_key_value_heads ({nkv}) or be "
                         "a multiple of it")
    return max(nkv / tp_size, 1) / nkv


def _kv_proj_params(c: ModelConfig) -> int:
    """Parameters of one layer's K/V projections: ``k_proj`` and ``v_proj`` with their
    biases (GQA/MQA), or MLA's ``kv_a_proj_with_mqa`` and ``kv_a_layernorm`` (the latent and
    RoPE key every head reads). Part of :func:`_attn_params`."""
    H = c.hidden_size
    if c.is_mla:
        return H * _mla_entry_elements(c.kv_lora_rank, c.qk_rope_head_dim) + c.kv_lora_rank
    kv = c.num_key_value_heads * c.head_dim
    return 2 * H * kv + 2 * kv * c.attention_bias


def _attention_params_per_device(c: ModelConfig, tp_size: int) -> float:
    """Attention parameters (all layers) one of ``tp_size`` devices holds: the K/V
    projections at :func:`_kv_share`, everything else split over ``tp_size``."""
    kv = _kv_proj_params(c) * c.num_hidden_layers
    return (param_breakdown(c)["attention"] - kv) / tp_size + kv * _kv_share(c, tp_size)


def _kv_layer_bytes(c: ModelConfig, bytes_per_element: float, tp_size: int = 1) -> float:
    """Bytes one token adds to one layer's cache on one of ``tp_size`` devices: K and V of
    the heads :func:`_kv_share` gives the device, or MLA's latent + RoPE key (replicated)."""
    if c.is_mla:
        return _mla_entry_elements(c.kv_lora_rank, c.qk_rope_head_dim) * bytes_per_element
    return 2 * c.num_key_value_heads * _kv_share(c, tp_size) * c.head_dim * bytes_per_element


def kv_cache_bytes(config: ModelConfig, batch: int, context_len: int,
                   bytes_per_element: float = 2, tp_size: int = 1) -> int:
    """KV-cache bytes on one device for ``batch`` sequences of ``context_len`` tokens:
    ``sum over layers of batch * min(context_len, W) * per-layer bytes``, where ``W`` is
    ``sliding_window`` for sliding layers (``config.layer_is_sliding``) and unbounded
    otherwise. Per-layer bytes: K and V ``2 * nkv * D`` (MHA/GQA/MQA; heads split over
    ``tp_size``) or MLA ``kv_lora_rank + qk_rope_head_dim`` (DeepSeek-V2 Table 1).

    Raises:
        ValueError: counts < 1, ``bytes_per_element <= 0``, a ``tp_size`` that does not
            split the KV heads, or a config with ``unsupported_fields``.
    """
    _check_countable(config)
    _check_count("batch", batch, 1)
    _check_count("context_len", context_len, 1)
    _check_count("tp_size", tp_size, 1)
    _check_bytes(bytes_per_element)
    c, per = config, _kv_layer_bytes(config, bytes_per_element, tp_size)
    tokens = sum(min(context_len, c.sliding_window) if c.layer_is_sliding(i) else context_len
                 for i in range(c.num_hidden_layers))
    return int(batch * tokens * per)


def kv_cache_bytes_per_token(config: ModelConfig, bytes_per_element: float = 2,
                             context_len: int | None = None) -> int:
    """KV-cache bytes per token, all layers: GQA / MHA / MQA (K and V)
    ``2 * num_hidden_layers * num_key_value_heads * head_dim * bytes_per_element``; MLA
    (``config.is_mla``) ``num_hidden_layers * (kv_lora_rank + qk_rope_head_dim) * bytes``.

    ``context_len=None``: what one new token adds while the context is shorter than every
    sliding window (every layer stores it). With ``context_len``: the average over a
    sequence of that length, ``kv_cache_bytes(config, 1, context_len) / context_len``
    (sliding layers stop growing at ``sliding_window``).

    Raises:
        ValueError: if ``bytes_per_element <= 0``, ``context_len < 1`` or the config has
            ``unsupported_fields``.
    """
    _check_bytes(bytes_per_element)
    _check_countable(config)
    if context_len is not None:
        return kv_cache_bytes(config, 1, context_len, bytes_per_element) // context_len
    return int(config.num_hidden_layers * _kv_layer_bytes(config, bytes_per_element))


def weight_bytes_per_device(config: ModelConfig, tp_size: int = 1, ep_size: int = 1,
                            bytes_per_param: float = 2) -> dict:
    """Weight bytes one device holds under tensor and expert parallelism.

    Layout assumed (Megatron-style TP, DeepSeek-style EP): routed experts are split over
    ``ep_size`` devices (``E / ep_size`` whole experts each); attention, dense FFN, shared
    experts, embedding and LM head (vocab-parallel) are split over ``tp_size``, except the
    K/V projections: split by whole heads, replicated once ``tp_size`` exceeds
    ``num_key_value_heads`` (the rule of the KV cache, :func:`kv_cache_bytes`; MLA's latent
    projection is replicated); norms and router are replicated. Data parallelism replicates
    weights (no change per device; it divides the batch). MTP modules are not included.

    Returns:
        ``{"tensor_parallel", "expert_parallel", "replicated", "total"}`` in bytes (floats).

    Raises:
        ValueError: ``tp_size`` / ``ep_size`` < 1, ``ep_size`` not dividing ``num_experts``
            (MoE configs), ``tp_size`` not dividing ``num_attention_heads``, or neither
            dividing ``num_key_value_heads`` nor a multiple of it.
    """
    c, b = config, param_breakdown(config)
    _check_count("tp_size", tp_size, 1)
    _check_count("ep_size", ep_size, 1)
    _check_bytes(bytes_per_param)
    if c.num_attention_heads % tp_size:
        raise ValueError(f"tp_size ({tp_size}) must divide num_attention_heads "
                         f"({c.num_attention_heads})")
    if c.num_experts and c.num_experts % ep_size:
        raise ValueError(f"ep_size ({ep_size}) must divide num_experts ({c.num_experts})")
    tp = sum(b[k] for k in ("embedding", "dense_ffn", "shared_experts", "lm_head")) / tp_size
    tp += _attention_params_per_device(c, tp_size)
    out = {"tensor_parallel": tp * bytes_per_param,
           "expert_parallel": b["routed_experts"] / ep_size * bytes_per_param,
           "replicated": (b["norms"] + b["router"]) * bytes_per_param}
    out["total"] = sum(out.values())
    return out


def max_batch_size(config: ModelConfig, context_len: int, device_memory_bytes: float,
                   tp_size: int = 1, ep_size: int = 1, bytes_per_param: float = 2,
                   kv_bytes_per_element: float = 2, memory_fraction: float = 0.9) -> int:
    """Largest number of ``context_len``-token sequences whose KV cache fits one device next
    to its weights: ``floor((memory_fraction * device_memory_bytes - weights) / kv_per_seq)``
    (:func:`weight_bytes_per_device`, :func:`kv_cache_bytes`). Activations and framework
    overhead are left to ``1 - memory_fraction``. 0 when the weights alone do not fit.

    Raises:
        ValueError: ``memory_fraction`` outside ``(0, 1]``, ``device_memory_bytes <= 0``, or
            the errors of the two functions above.
    """
    if not 0 < memory_fraction <= 1:
        raise ValueError(f"memory_fraction must be in (0, 1], got {memory_fraction!r}")
    if device_memory_bytes <= 0:
        raise ValueError(f"device_memory_bytes must be > 0, got {device_memory_bytes!r}")
    free = memory_fraction * device_memory_bytes - weight_bytes_per_device(
        config, tp_size, ep_size, bytes_per_param)["total"]
    per_seq = kv_cache_bytes(config, 1, context_len, kv_bytes_per_element, tp_size)
    return max(int(free // per_seq), 0)


def mla_kv_cache_bytes_per_token(num_hidden_layers: int, kv_lora_rank: int,
                                 qk_rope_head_dim: int, bytes_per_element: float = 2) -> int:
    """MLA cache bytes per token from the raw sizes: ``layers * (kv_lora_rank +
    qk_rope_head_dim) * bytes`` (DeepSeek-V2 report, arXiv:2405.04434, Table 1: ``(d_c + d_h^R)
    * l`` elements); the same per-layer count as :func:`kv_cache_bytes_per_token` uses for an
    MLA config (one helper), for sizes that are not a whole config (chapter 02).

    Raises:
        ValueError: if any size is < 1 or ``bytes_per_element <= 0``.
    """
    _check_bytes(bytes_per_element)
    for name, v in (("num_hidden_layers", num_hidden_layers), ("kv_lora_rank", kv_lora_rank),
                    ("qk_rope_head_dim", qk_rope_head_dim)):
        if v < 1:
            raise ValueError(f"{name} must be >= 1, got {v}")
    return int(num_hidden_layers * _mla_entry_elements(kv_lora_rank, qk_rope_head_dim)
               * bytes_per_element)


def mla_decode_attention_costs(config: ModelConfig, context_len: int,
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
    if tokens < 1:
        raise ValueError(f"tokens must be >= 1, got {tokens}")
    return 2 * config.hidden_size * config.vocab_size * tokens


def reference_models() -> dict:
    """The real-model configs bundled in ``src/tokenflow/data/models.json`` (each entry names
    its sources and marks what is unverified; :func:`reference_value_unverified` reads those
    marks per value)."""
    import json
    from importlib import resources
    return json.loads((resources.files("tokenflow") / "data" / "models.json")
                      .read_text(encoding="utf-8"))["models"]


def reference_value_unverified(name: str, field: str) -> bool:
    """Whether ``models.json`` flags one value of a bundled config as UNVERIFIED, in either of
    the two ways it does: for the whole entry (its ``config_source`` says so, e.g.
    DeepSeek-V4-Pro, known only from third-party copies), or for the value itself (an
    annotated value such as GPT-3's ``vocab_size``, ``"50257 (GPT-2 BPE; UNVERIFIED
    in-session)"``). A table that says where each value comes from must ask per value: the
    entry's sources alone miss the second kind.

    Raises:
        ValueError: ``name`` is not bundled, or ``field`` is not in its config.
    """
    models = reference_models()
    if name not in models:
        raise ValueError(f"name must be one of {sorted(models)}, got {name!r}")
    config = models[name]["config"]
    if field not in config:
        raise ValueError(f"field must be one of {sorted(config)} for {name}, got {field!r}")
    return any("UNVERIFIED" in str(text).upper()
               for text in (" ".join(models[name]["config_source"]), config[field]))


def reference_config(name: str) -> ModelConfig:
    """A :class:`ModelConfig` for a bundled real model (``"DeepSeek-V3"``, ``"Mixtral-8x7B"``,
    ``"Llama-3-8B"``, ``"DeepSeek-V4-Pro"``, ``"DeepSeek-V4-Flash"``, ``"GPT-3-175B"``).

    Values the reference gives as annotated text (e.g. ``"2.5 (one secondary copy only -
    UNVERIFIED)"``) are read as their leading number or boolean. Read with
    ``from_hf_config(..., allow_unsupported=True)``: DeepSeek-V4's fields we cannot express
    (``o_groups``, ``compress_rates``, ``scoring_func 'sqrtsoftplus'``, ...) land in
    ``unsupported_fields``, so its shapes and routing sizes are usable but every count
    refuses. GPT-3 has no ``model_type`` in the file and is read as ``gpt2``
    (:data:`_REFERENCE_FAMILY`). Fine for shapes and counts, not for running.

    Raises:
        ValueError: if ``name`` is not bundled.
    """
    return ModelConfig.from_hf_config(reference_hf_config(name), allow_unsupported=True,
                                      name=name)


def reference_hf_config(name: str) -> dict:
    """The HF ``config.json`` dict :func:`reference_config` reads for a bundled model: the
    ``models.json`` entry's config with annotated text values read as their leading number or
    boolean (text without one is left out) and ``model_type`` from :data:`_REFERENCE_FAMILY`
    where the entry has none.

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
    hf.setdefault("model_type", _REFERENCE_FAMILY.get(name))
    return hf


_REFERENCE_FAMILY = {"GPT-3-175B": "gpt2"}
"""``model_type`` of reference entries that do not carry one: GPT-3 uses GPT-2's
architecture (Brown et al. 2020, section 2.1: "the same model and architecture as GPT-2", with
alternating dense and locally banded sparse attention, which changes no parameter count)."""


# ---- MoE communication (F3)
# Bytes that expert parallelism moves: dispatch sends each (token, expert) pair's hidden state to
# the rank that owns the expert, combine sends the expert output back (same size). Pairs whose
# expert lives on the token's own rank stay local and cost nothing on the wire. Used by chapter 03
# and checked there against the bytes a real torch.distributed run sends
# (tokenflow.parallel.expert_parallel).

__all__ += ["moe_a2a_bytes", "expected_remote_fraction", "moe_comm_bytes_per_token",
            "moe_a2a_table", "A2A_TABLE_COLUMNS", "A2A_PATHS", "num_moe_layers",
            "expected_nodes_per_token"]


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


A2A_PATHS = ("hierarchical", "direct")
"""The two all-to-all paths of :func:`moe_comm_bytes_per_token` (DeepSeek-V3 report,
arXiv:2412.19437: ``"hierarchical"`` for training and prefill, section 3.4.1; ``"direct"`` for
decode, section 3.4.2)."""


def moe_comm_bytes_per_token(config: ModelConfig, ep_size: int | None = None,
                             dispatch_bytes_per_element: float = 2,
                             combine_bytes_per_element: float = 2,
                             gpus_per_node: int | None = None,
                             max_nodes_per_token: int | None = None,
                             path: str = "hierarchical") -> dict:
    """All-to-all bytes one token causes in one MoE layer: dispatch ``K * H * b_dispatch`` plus
    combine ``K * H * b_combine``, times the remote fraction.

    Args:
        config: a config with ``num_experts >= 1`` (e.g. ``reference_config("DeepSeek-V3")``).
        ep_size: expert-parallel ranks. ``None``: every pair crosses the network (upper
            bound); otherwise :func:`expected_remote_fraction` (uniform routing).
        dispatch_bytes_per_element, combine_bytes_per_element: element sizes of the two
            directions (bf16: 2; a deployment may dispatch in fp8: 1).
        gpus_per_node: with ``ep_size``, split the traffic into ``scale_out`` (InfiniBand,
            between nodes) and ``scale_up`` (NVLink, inside a node) along ``path``.
        max_nodes_per_token: node-limited routing (V3 report section 2.1.2, a training
            device: a token's experts on at most this many nodes); ``None``: the config's own
            limit, group-limited routing (``topk_group`` of ``n_group`` groups) if it has one.
            Only the hierarchical path depends on it.
        path: ``"hierarchical"`` (V3 report section 3.4.1, training and prefill, DeepEP's
            normal kernels): a token's hidden state crosses InfiniBand once per remote *node*
            it reaches (:func:`expected_nodes_per_token`, ``n``; ``n * (N-1)/N`` of them
            remote for ``N = ep_size / gpus_per_node`` nodes), then is forwarded over NVLink
            to the ``K * (G-1)/G`` pairs not on the GPU where the copy lands.
            ``"direct"`` (section 3.4.2, decode: "direct point-to-point transfers over IB";
            DeepEP's low-latency kernels, pure RDMA): every pair off the token's GPU,
            ``K * (ep_size-1)/ep_size``, crosses InfiniBand, nothing goes over NVLink. On one
            node (``ep_size <= gpus_per_node``) both paths are NVLink only. Expected values
            under uniform routing, not a schedule.

    Returns:
        dict with ``dispatch``, ``combine``, ``total`` (bytes per token per MoE layer) and
        ``remote_fraction``. With ``gpus_per_node`` also ``scale_out`` and ``scale_up``
        (dispatch + combine bytes over each link, per token per MoE layer), the same split
        per direction (``scale_out_dispatch``, ``scale_out_combine``, ``scale_up_dispatch``,
        ``scale_up_combine``), ``nodes_per_token`` (expected) and ``path``; then
        ``dispatch``, ``combine`` and ``total`` are the sums over both links.

    Raises:
        ValueError: dense config, bad ``ep_size``, element sizes or ``path``.
    """
    if config.num_experts < 1:
        raise ValueError(f"config must be an MoE config (num_experts >= 1), got "
                         f"num_experts={config.num_experts}")
    if path not in A2A_PATHS:
        raise ValueError(f"path must be one of {A2A_PATHS}, got {path!r}")
    _check_bytes(dispatch_bytes_per_element)
    _check_bytes(combine_bytes_per_element)
    f = 1.0 if ep_size is None else expected_remote_fraction(ep_size)
    pair = config.num_experts_per_tok * config.hidden_size
    d = pair * dispatch_bytes_per_element * f
    c = pair * combine_bytes_per_element * f
    out = {"dispatch": d, "combine": c, "total": d + c, "remote_fraction": f}
    if gpus_per_node is not None:
        links = _link_elements(config, ep_size, gpus_per_node, max_nodes_per_token, path)
        for link in ("scale_out", "scale_up"):
            out[f"{link}_dispatch"] = links[link] * dispatch_bytes_per_element
            out[f"{link}_combine"] = links[link] * combine_bytes_per_element
            out[link] = out[f"{link}_dispatch"] + out[f"{link}_combine"]
        out["nodes_per_token"] = links["nodes_per_token"]
        out["path"] = path
        out["dispatch"] = out["scale_out_dispatch"] + out["scale_up_dispatch"]
        out["combine"] = out["scale_out_combine"] + out["scale_up_combine"]
        out["total"] = out["scale_out"] + out["scale_up"]
    return out


def _check_node_layout(ep_size, G: int) -> None:
    _check_count("gpus_per_node", G, 1)
    if ep_size is None or ep_size % G and G % ep_size:
        raise ValueError(f"ep_size ({ep_size}) must be a multiple or divisor of "
                         f"gpus_per_node ({G})")


def expected_nodes_per_token(config: ModelConfig, ep_size: int, gpus_per_node: int = 8,
                             max_nodes_per_token: int | None = None) -> float:
    """Expected number of distinct nodes one token's ``K`` experts sit on.

    Layout: ``N = max(ep_size // gpus_per_node, 1)`` nodes, experts in order, expert ``e`` on
    node ``e * N // E`` (whole groups of ``E / N`` when ``N`` divides ``E``). Routing: uniform
    over what the limit allows, ``K`` distinct experts. The limit: ``max_nodes_per_token = M``
    (node-limited routing, V3 report section 2.1.2) picks ``M`` nodes; else the config's
    group-limited routing (``n_group > 1``; DeepSeek-V3 ``n_group=8, topk_group=4``, HF
    ``DeepseekV3TopkRouter``) picks ``topk_group`` groups of ``E / n_group`` experts;
    else all ``E``. For each allowed set of ``s`` experts, a node holding ``c`` of them is
    reached with probability ``1 - C(s-c, K) / C(s, K)``; the result averages over every
    allowed set, equally likely. A limit of 4 nodes or groups is an upper bound on nodes only
    when a group fits one node; the expectation is below it.

    Raises:
        ValueError: a dense config, ``ep_size`` not tiling ``gpus_per_node``, a limit < 1, or
            a limit that leaves fewer than ``K`` experts.
    """
    from itertools import combinations
    from math import comb
    if config.num_experts < 1:
        raise ValueError(f"config must be an MoE config (num_experts >= 1), got "
                         f"num_experts={config.num_experts}")
    _check_count("ep_size", ep_size, 1)
    _check_node_layout(ep_size, gpus_per_node)
    E, K = config.num_experts, config.num_experts_per_tok
    N = max(ep_size // gpus_per_node, 1)
    node = [e * N // E for e in range(E)]
    if max_nodes_per_token is not None:
        _check_count("max_nodes_per_token", max_nodes_per_token, 1)
    if max_nodes_per_token is not None and max_nodes_per_token < N:
        units = [[e for e in range(E) if node[e] == j] for j in range(N)]
        pick = max_nodes_per_token
    elif max_nodes_per_token is None and config.n_group > 1 and config.topk_group < config.n_group:
        size = E // config.n_group
        units = [list(range(g * size, (g + 1) * size)) for g in range(config.n_group)]
        pick = config.topk_group
    else:
        units, pick = [list(range(E))], 1
    total, sets = 0.0, 0
    for chosen in combinations(range(len(units)), pick):
        held: dict = {}
        for u in chosen:
            for e in units[u]:
                held[node[e]] = held.get(node[e], 0) + 1
        s = sum(held.values())
        if s < K:
            raise ValueError(f"the routing limit leaves {s} experts, fewer than "
                             f"num_experts_per_tok ({K})")
        total += sum(1 - comb(s - n, K) / comb(s, K) for n in held.values())
        sets += 1
    return total / sets


def _link_elements(config: ModelConfig, ep_size, G: int, M, path: str) -> dict:
    """Elements one token sends over each link in one direction (:func:`moe_comm_bytes_per_token`
    with ``gpus_per_node``): ``scale_out`` (InfiniBand) and ``scale_up`` (NVLink)."""
    _check_node_layout(ep_size, G)
    N, K, H = max(ep_size // G, 1), config.num_experts_per_tok, config.hidden_size
    n = expected_nodes_per_token(config, ep_size, G, M)
    if path == "direct" and N > 1:
        return {"nodes_per_token": n, "scale_out": K * (ep_size - 1) / ep_size * H,
                "scale_up": 0.0}
    G_used = min(G, ep_size)
    return {"nodes_per_token": n, "scale_out": n * (N - 1) / N * H,
            "scale_up": K * (G_used - 1) / G_used * H}


A2A_TABLE_COLUMNS = ["routing", "link", "dispatch kB", "combine kB", "total kB"]
"""Column names of :func:`moe_a2a_table`."""


def moe_a2a_table(config: ModelConfig, ep_size: int, gpus_per_node: int = 8,
                  max_nodes_per_token: int | None = None, dispatch_bytes_per_element: float = 1,
                  combine_bytes_per_element: float = 2) -> list:
    """The book's one table of all-to-all bytes per token and MoE layer (kB = 1,000 bytes),
    every row from :func:`moe_comm_bytes_per_token`, so the numbers of chapters 03, 07 and 08
    reconcile. Rows, top to bottom:

    1. flat, every (token, expert) pair remote, bf16 both ways (the upper bound);
    2. the same with the deployment's element sizes (DeepSeek's day-6 note: dispatch FP8,
       combine BF16; arguments ``dispatch_bytes_per_element``, ``combine_bytes_per_element``);
    3. flat over ``ep_size`` ranks, uniform routing (pairs on the token's own rank stay);
    4-6. the hierarchical path (prefill, V3 report section 3.4.1), ``gpus_per_node`` GPUs
       per node, no routing limit: InfiniBand, NVLink, both;
    7-9. the same under the routing limit: ``max_nodes_per_token`` nodes if given, else the
       config's group limit (``topk_group`` of ``n_group``; omitted when it has none);
    10. the direct path (decode, section 3.4.2): every pair off the token's GPU over
       InfiniBand.

    Returns:
        list of rows ``[routing, link, dispatch kB, combine kB, total kB]``
        (:data:`A2A_TABLE_COLUMNS`).

    Raises:
        ValueError: as :func:`moe_comm_bytes_per_token`.
    """
    bd, bc = dispatch_bytes_per_element, combine_bytes_per_element
    rows = []

    def add(routing, link, m, prefix=""):
        d, c = (m[f"{prefix}dispatch"], m[f"{prefix}combine"])
        rows.append([routing, link, d / 1e3, c / 1e3, (d + c) / 1e3])

    add("flat, all remote, bf16", "any", moe_comm_bytes_per_token(config))
    name = {1: "fp8", 2: "bf16", 4: "fp32"}
    add(f"flat, all remote, {name.get(bd, f'{bd} B')} dispatch, "
        f"{name.get(bc, f'{bc} B')} combine", "any",
        moe_comm_bytes_per_token(config, None, bd, bc))
    add(f"flat, EP{ep_size}, uniform", "any", moe_comm_bytes_per_token(config, ep_size, bd, bc))
    unlimited = config.replace(n_group=1, topk_group=1)
    cases = [(unlimited, None, "no routing limit")]
    if max_nodes_per_token is not None:
        cases.append((config, max_nodes_per_token, f"at most {max_nodes_per_token} nodes"))
    elif config.n_group > 1 and config.topk_group < config.n_group:
        cases.append((config, None, f"{config.topk_group} of {config.n_group} groups"))
    for cfg, M, label in cases:
        m = moe_comm_bytes_per_token(cfg, ep_size, bd, bc, gpus_per_node, M)
        routing = f"EP{ep_size}, {gpus_per_node} GPUs/node, hierarchical, {label}"
        add(routing, "InfiniBand", m, "scale_out_")
        add(routing, "NVLink", m, "scale_up_")
        add(routing, "both", m)
    m = moe_comm_bytes_per_token(config, ep_size, bd, bc, gpus_per_node, path="direct")
    add(f"EP{ep_size}, {gpus_per_node} GPUs/node, direct (decode)", "InfiniBand", m,
        "scale_out_")
    return rows


def num_moe_layers(config: ModelConfig) -> int:
    """Number of decoder blocks whose feed-forward is MoE (``config.layer_is_moe``)."""
    return sum(config.layer_is_moe(i) for i in range(config.num_hidden_layers))


# ---- Prefill vs decode (F5)
# What one forward pass computes and what it must read: enough to place prefill and decode on
# the roofline (Williams, Waterman and Patterson 2009: attainable FLOP/s = min(peak FLOP/s,
# arithmetic intensity x memory bandwidth)). The FLOPs are
# :func:`tokenflow.analysis.roofline.forward_flops`.

__all__ += ["forward_bytes", "forward_weight_bytes", "expected_experts_touched"]


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


def forward_weight_bytes(config: ModelConfig, tokens: int, bytes_per_element: float = 2, *,
                         tp_size: int = 1, ep_size: int = 1) -> dict:
    """Weight bytes one forward pass of ``tokens`` new tokens (all sequences together, ``B*S``)
    reads on one device, by part (the keys of :data:`PARTS`) and ``total``.

    The rule: a dense model reads all of its weights in every pass, whatever ``tokens`` is;
    an MoE reads only the routed experts its tokens touch, so its bytes grow with the tokens
    of a pass until every expert is hit (:func:`expected_experts_touched`, uniform routing).
    ``embedding``: one row of ``H`` elements per token (a lookup, not the table; a learned
    position table, if any, is counted whole). Other parts: whole, at the layout of
    :func:`weight_bytes_per_device` (``tp_size`` splits embedding rows, attention (K/V
    heads down to one per device), dense FFN, shared experts and LM head; ``ep_size`` gives
    the device ``E / ep_size`` experts, touched
    by the ``tokens * max(ep_size // tp_size, 1)`` tokens of its expert-parallel group).
    The weights term of :func:`forward_bytes`.

    Returns:
        dict of bytes (floats): ``embedding``, ``attention``, ``dense_ffn``,
        ``routed_experts``, ``shared_experts``, ``router``, ``norms``, ``lm_head``, ``total``;
        and ``experts_touched`` (expected distinct experts per MoE layer on this device).

    Raises:
        ValueError: ``tokens < 1``, ``bytes_per_element <= 0``, or the errors of
            :func:`weight_bytes_per_device`.
    """
    _check_count("tokens", tokens, 1)
    c, b = config, bytes_per_element
    weight_bytes_per_device(c, tp_size, ep_size, b)          # validates the layout
    p = param_breakdown(c)
    table = 0 if c.tie_word_embeddings else c.vocab_size * c.hidden_size
    out = {k: p[k] * b / tp_size for k in ("dense_ffn", "shared_experts", "lm_head")}
    out["attention"] = _attention_params_per_device(c, tp_size) * b
    out["embedding"] = (p["embedding"] - table + tokens * c.hidden_size) / tp_size * b
    out["norms"], out["router"] = p["norms"] * b, p["router"] * b
    out["routed_experts"], touched = 0.0, 0.0
    if c.num_experts:                     # share of the experts the group's tokens hit
        hit = expected_experts_touched(c.num_experts, c.num_experts_per_tok,
                                       tokens * max(ep_size // tp_size, 1)) / c.num_experts
        out["routed_experts"] = p["routed_experts"] / ep_size * b * hit
        touched = hit * c.num_experts / ep_size
    out = {k: out[k] for k in PARTS}
    out["total"] = sum(out.values())
    out["experts_touched"] = touched
    return out


def forward_bytes(config: ModelConfig, new_tokens: int, cached_tokens: int = 0,
                  batch_size: int = 1, bytes_per_element: float = 2, *,
                  kv_bytes_per_element: float | None = None, tp_size: int = 1,
                  ep_size: int = 1) -> float:
    """Least bytes one forward pass moves to and from memory on one device: every weight it
    uses read once (shared by the whole batch), the KV cache read (``batch_size *
    cached_tokens`` tokens) and the new tokens' K/V **written** (``batch_size * new_tokens``
    tokens): ``kv_cache_bytes(config, batch_size, cached_tokens + new_tokens)``, so sliding
    layers count at most ``sliding_window`` slots. The one bytes formula of the book:
    :func:`tokenflow.analysis.roofline.roofline`'s ``memory_bytes`` is this function.

    Weights (``bytes_per_element`` each): :func:`forward_weight_bytes` of the pass's
    ``batch_size * new_tokens`` tokens: all parameters but the input embedding table (one
    row per token is read, ``H`` elements per token); in MoE layers only the routed experts
    the tokens are expected to touch (:func:`expected_experts_touched`). Activations are left
    out (they stay in caches and registers in a fused kernel), so this is a lower bound.

    Parallelism (the layout of :func:`weight_bytes_per_device`): ``tp_size`` splits attention,
    dense FFN, shared experts, LM head, the embedding rows and the KV heads; ``ep_size`` gives
    the device ``E / ep_size`` experts, touched by the ``T * max(ep_size // tp_size, 1)``
    tokens of the expert-parallel group (each of its tensor-parallel groups runs its own
    ``T = batch_size * new_tokens``). ``kv_bytes_per_element``: the cache's element size
    (``None``: ``bytes_per_element``).

    Raises:
        ValueError: ``new_tokens`` or ``batch_size`` < 1, ``cached_tokens`` < 0, element sizes
            <= 0, or the errors of :func:`weight_bytes_per_device` and :func:`kv_cache_bytes`.
    """
    _check_count("new_tokens", new_tokens, 1)
    _check_count("cached_tokens", cached_tokens, 0)
    _check_count("batch_size", batch_size, 1)
    _check_bytes(bytes_per_element)
    kv_b = bytes_per_element if kv_bytes_per_element is None else kv_bytes_per_element
    weights = forward_weight_bytes(config, batch_size * new_tokens, bytes_per_element,
                                   tp_size=tp_size, ep_size=ep_size)["total"]
    return weights + kv_cache_bytes(config, batch_size, cached_tokens + new_tokens, kv_b,
                                    tp_size)
