"""Memory of a deployment: KV-cache bytes (per token, per batch, per device) and weight bytes
per device under tensor and expert parallelism, and how many sequences fit.

KV bytes count MLA's compressed cache (DeepSeek-V2 report, arXiv:2405.04434, Table 1) and
sliding windows. Every argument after ``config`` is keyword-only where two numbers could be
swapped without an error.
"""
from __future__ import annotations

from tokenflow import validate
from tokenflow.config import ModelConfig

from .params import _check_bytes, _check_count, _check_countable, param_breakdown

__all__ = ["kv_cache_bytes", "kv_cache_bytes_per_token", "weight_bytes_per_device",
           "max_batch_size", "mla_kv_cache_bytes_per_token"]


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


def kv_cache_bytes(config: ModelConfig, *, batch: int = 1, context_len: int,
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


def kv_cache_bytes_per_token(config: ModelConfig, bytes_per_element: float = 2, *,
                             context_len: int | None = None) -> int:
    """KV-cache bytes per token, all layers: GQA / MHA / MQA (K and V)
    ``2 * num_hidden_layers * num_key_value_heads * head_dim * bytes_per_element``; MLA
    (``config.is_mla``) ``num_hidden_layers * (kv_lora_rank + qk_rope_head_dim) * bytes``.

    ``context_len=None``: what one new token adds while the context is shorter than every
    sliding window (every layer stores it). With ``context_len``: the average over a
    sequence of that length, ``kv_cache_bytes(config, context_len=context_len) / context_len``
    (sliding layers stop growing at ``sliding_window``).

    Raises:
        ValueError: if ``bytes_per_element <= 0``, ``context_len < 1`` or the config has
            ``unsupported_fields``.
    """
    _check_bytes(bytes_per_element)
    _check_countable(config)
    if context_len is not None:
        return kv_cache_bytes(config, context_len=context_len,
                              bytes_per_element=bytes_per_element) // context_len
    return int(config.num_hidden_layers * _kv_layer_bytes(config, bytes_per_element))


def weight_bytes_per_device(config: ModelConfig, *, tp_size: int = 1, ep_size: int = 1,
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


def max_batch_size(config: ModelConfig, *, context_len: int, device_memory_bytes: float,
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
    validate.number("memory_fraction", memory_fraction, 0, 1, lo_open=True)
    validate.number("device_memory_bytes", device_memory_bytes, 0, lo_open=True)
    free = memory_fraction * device_memory_bytes - weight_bytes_per_device(
        config, tp_size=tp_size, ep_size=ep_size, bytes_per_param=bytes_per_param)["total"]
    per_seq = kv_cache_bytes(config, context_len=context_len,
                             bytes_per_element=kv_bytes_per_element, tp_size=tp_size)
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
        _check_count(name, v, 1)
    return int(num_hidden_layers * _mla_entry_elements(kv_lora_rank, qk_rope_head_dim)
               * bytes_per_element)

