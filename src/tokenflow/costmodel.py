"""Back-of-envelope costs for real configs: parameters, KV-cache bytes, FLOPs.

All counts follow the shared model's architecture (GQA attention, SwiGLU FFN / MoE, RMSNorm),
so for our own configs :func:`param_count` equals ``model.num_parameters()`` exactly (tested).
For DeepSeek models, whose attention is MLA (DeepSeek-V2 report, arXiv:2405.04434, Table 1),
use :func:`mla_kv_cache_bytes_per_token` for the cache.
"""
from __future__ import annotations

from .config import ModelConfig

__all__ = ["param_count", "active_param_count", "kv_cache_bytes_per_token",
           "mla_kv_cache_bytes_per_token", "lm_head_flops", "BYTES",
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
    H, D = c.hidden_size, c.head_dim
    return H * c.num_attention_heads * D * 2 + H * c.num_key_value_heads * D * 2  # q,o + k,v


def param_count(config: ModelConfig) -> int:
    """Total parameters of the shared architecture with this config (tied head counted once).

    Per layer: attention ``2*H*nh*D + 2*H*nkv*D``, two RMSNorm weights ``2*H``, and either a
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
    """KV-cache bytes one token adds, all layers, K and V (GQA / MHA):
    ``2 * num_hidden_layers * num_key_value_heads * head_dim * bytes_per_element``.

    Raises:
        ValueError: if ``bytes_per_element <= 0``.
    """
    _check_bytes(bytes_per_element)
    c = config
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


def lm_head_flops(config: ModelConfig, tokens: int = 1) -> int:
    """FLOPs of the LM head for ``tokens`` positions: ``2 * H * V`` each (multiply + add).

    Raises:
        ValueError: if ``tokens < 1``.
    """
    if tokens < 1:
        raise ValueError(f"tokens must be >= 1, got {tokens}")
    return 2 * config.hidden_size * config.vocab_size * tokens


def reference_models() -> dict:
    """The published configs bundled in ``tokenflow/data/models.json`` (copied from the
    project's ``shared/reference/models.json``; each entry names its sources)."""
    import json
    from importlib import resources
    return json.loads((resources.files("tokenflow") / "data" / "models.json")
                      .read_text(encoding="utf-8"))["models"]


def reference_config(name: str) -> ModelConfig:
    """A :class:`ModelConfig` for a bundled real model (``"DeepSeek-V3"``, ``"Mixtral-8x7B"``,
    ``"Llama-3-8B"``, ``"DeepSeek-V4-Pro"``, ``"DeepSeek-V4-Flash"``, ``"GPT-3-175B"``).

    Values the reference gives as annotated text (e.g. ``"2.5 (one secondary copy only -
    UNVERIFIED)"``) are read as their leading number or boolean; a missing
    ``intermediate_size`` is taken as ``moe_intermediate_size``. Attention is modelled as GQA (see
    :meth:`ModelConfig.from_hf_config`). Fine for shapes and counts, not for running.

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
