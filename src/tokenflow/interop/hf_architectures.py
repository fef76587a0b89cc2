"""Which Hugging Face architecture matches a :class:`~tokenflow.config.ModelConfig`, and the
config both ways (:func:`to_hf_config`, :func:`from_hf_config`).

Which HF class matches which :class:`~tokenflow.config.ModelConfig` (:func:`hf_architecture`):

=================  ======================================================  =========================
architecture       our config                                              HF class
=================  ======================================================  =========================
``llama``          dense (``num_experts == 0``)                            ``LlamaForCausalLM``
``mixtral``        softmax MoE, renormalised top-k, no shared experts,     ``MixtralForCausalLM``
                   no dense first layers
``qwen2_moe``      softmax MoE with shared experts (optionally dense       ``Qwen2MoeForCausalLM``
                   first layers, optionally without renormalisation)
``deepseek_v3``    MLA attention (``kv_lora_rank`` set), dense or with     ``DeepseekV3ForCausalLM``
                   DeepSeek-V3 MoE (sigmoid routing, groups, shared
                   experts, dense first layers)
(none)             sigmoid (DeepSeek-V3) routing, ``n_group > 1``,         ``ValueError``; compare
                   ``routed_scaling_factor != 1`` with GQA attention       the MoE block with
                                                                           ``DeepseekV3MoE``
=================  ======================================================  =========================

Sources: ``transformers`` 5.x ``models/{llama,mixtral,qwen2_moe,deepseek_v3}/configuration_*.py``.
``transformers`` is imported lazily inside the functions that need it.
"""
from __future__ import annotations

from tokenflow.config import ModelConfig

__all__ = ["HF_CLASSES", "hf_architecture", "to_hf_config", "from_hf_config"]

HF_CLASSES = {"llama": ("LlamaConfig", "LlamaForCausalLM"),
              "mixtral": ("MixtralConfig", "MixtralForCausalLM"),
              "qwen2_moe": ("Qwen2MoeConfig", "Qwen2MoeForCausalLM"),
              "deepseek_v3": ("DeepseekV3Config", "DeepseekV3ForCausalLM")}
"""``architecture -> (config class, causal-LM class)`` names in ``transformers``."""

WHOLE_MODEL_ARCHS = ("llama", "mixtral", "qwen2_moe", "deepseek_v3")
"""The architectures whose whole model maps (the others map one MoE block)."""


# ---------------------------------------------------------------------------- configs
def moe_block_problem(config: ModelConfig, arch: str) -> str | None:
    """Why the MoE of ``config`` cannot be expressed by HF ``arch``'s MoE block (or None)."""
    if arch == "mixtral":
        if config.scoring_func != "softmax":
            return "Mixtral routes with softmax; this config uses sigmoid scoring"
        if not config.norm_topk_prob:
            return "Mixtral always renormalises the top-k weights (norm_topk_prob=True)"
        if config.num_shared_experts:
            return "Mixtral has no shared experts"
    elif arch == "qwen2_moe":
        if config.scoring_func != "softmax":
            return "Qwen2-MoE routes with softmax; this config uses sigmoid scoring"
        if config.num_shared_experts < 1:
            return "Qwen2-MoE always has a shared expert (use Mixtral when there is none)"
    elif arch == "deepseek_v3":
        if config.scoring_func != "sigmoid":
            return "DeepSeek-V3 routes with sigmoid scoring; this config uses softmax"
        if config.num_shared_experts < 1:
            return "DeepseekV3MoE always has shared experts"
        if config.num_experts // config.n_group < 2:
            return "DeepseekV3TopkRouter needs at least 2 experts per group (top-2 group score)"
        if config.n_group > 1 and config.topk_method != "noaux_tc":
            return ("DeepseekV3TopkRouter ranks expert groups by the sum of their top-2 scores "
                    f"(topk_method='noaux_tc'), this config by topk_method="
                    f"{config.topk_method!r}")
    else:
        return f"unknown architecture {arch!r}"
    if arch != "deepseek_v3":
        if config.n_group > 1:
            return f"{arch} has no group-limited routing (n_group must be 1)"
        if config.routed_scaling_factor != 1.0:
            return f"{arch} has no routed_scaling_factor (must be 1.0)"
    return None


def check_architecture(config: ModelConfig, arch: str) -> None:
    """Raise ``ValueError`` if HF family ``arch`` cannot express ``config``."""
    if config.is_mla and arch != "deepseek_v3":
        raise ValueError(f"config cannot be expressed as {arch}: its attention is MLA "
                         "(kv_lora_rank set); use 'deepseek_v3'")
    if arch == "llama":
        if config.is_moe:
            raise ValueError("architecture 'llama' is dense but this config has MoE layers")
        return
    if arch == "deepseek_v3" and config.is_mla and not config.is_moe:
        return
    if not config.is_moe:
        raise ValueError(f"architecture {arch!r} is an MoE family but this config is dense")
    problem = moe_block_problem(config, arch)
    if problem is None and arch == "mixtral" and config.first_k_dense_replace:
        problem = "Mixtral has no dense first layers (first_k_dense_replace must be 0)"
    if problem:
        raise ValueError(f"config cannot be expressed as {arch}: {problem}")


def hf_architecture(config: ModelConfig) -> str:
    """The HF causal-LM family whose whole model equals ours for ``config``.

    Returns:
        ``"deepseek_v3"`` (MLA attention), ``"llama"`` (dense), ``"mixtral"`` (softmax MoE,
        renormalised, no shared experts, no dense first layers) or ``"qwen2_moe"`` (softmax
        MoE with shared experts).

    Raises:
        ValueError: when no HF causal-LM class matches (sigmoid/DeepSeek-V3 routing, group
            routing or a routed scaling factor with GQA attention; dense first layers without
            shared experts; MLA with a softmax MoE), saying why and what to compare instead.
    """
    if config.is_mla:
        check_architecture(config, "deepseek_v3")
        return "deepseek_v3"
    if not config.is_moe:
        return "llama"
    if config.scoring_func == "sigmoid" or config.n_group > 1 \
            or config.routed_scaling_factor != 1.0:
        raise ValueError(
            "no Hugging Face causal-LM class matches this config: DeepSeek-V3 style routing "
            f"(scoring_func={config.scoring_func!r}, n_group={config.n_group}, "
            f"routed_scaling_factor={config.routed_scaling_factor}) exists only in "
            "DeepseekV3ForCausalLM, whose attention is MLA (set kv_lora_rank and the other MLA "
            "fields). Or compare one MoE block: moe_to_hf(model.layers[i].mlp, "
            "DeepseekV3MoE(to_hf_config(config, 'deepseek_v3')))")
    if config.num_shared_experts == 0:
        problem = moe_block_problem(config, "mixtral") or (
            "Mixtral has no dense first layers (first_k_dense_replace must be 0)"
            if config.first_k_dense_replace else None)
        if problem:
            raise ValueError(f"no Hugging Face causal-LM class matches this config: {problem}; "
                             "Qwen2-MoE would need a shared expert")
        return "mixtral"
    return "qwen2_moe"


def to_hf_config(config: ModelConfig, architecture: str | None = None):
    """Our config as a ``transformers`` config object of the matching family.

    Args:
        config: the model config.
        architecture: ``"llama"``, ``"mixtral"``, ``"qwen2_moe"`` or ``"deepseek_v3"``;
            default :func:`hf_architecture`. ``"deepseek_v3"`` with a GQA config is for
            building a ``DeepseekV3MoE`` / ``DeepseekV3TopkRouter`` block only (its MLA fields
            are then placeholders consistent with ``head_dim``); with an MLA config it is the
            whole model, with ``rope_interleave=True`` (DeepSeek's layout, see the module
            docstring).

    Returns:
        a ``LlamaConfig`` / ``MixtralConfig`` / ``Qwen2MoeConfig`` / ``DeepseekV3Config`` with
        ``rope_parameters={"rope_type": ..., "rope_theta": ..., <rope_scaling keys>}``, the
        special token ids, ``architectures=[<causal-LM class>]``.

    Raises:
        ValueError: unknown ``architecture``, or one that cannot express ``config``
            (e.g. ``"mixtral"`` for a config with shared experts).
        ImportError: if ``transformers`` is not installed.
    """
    arch = architecture or hf_architecture(config)
    if arch not in HF_CLASSES:
        raise ValueError(f"architecture must be one of {sorted(HF_CLASSES)}, got {arch!r}")
    c = config
    check_architecture(c, arch)
    if arch == "qwen2_moe" and c.head_dim * c.num_attention_heads != c.hidden_size:
        raise ValueError("Qwen2-MoE has no head_dim field: head_dim * num_attention_heads "
                         f"must equal hidden_size, got {c.head_dim} * "
                         f"{c.num_attention_heads} != {c.hidden_size}")
    import transformers
    cfg_cls = getattr(transformers, HF_CLASSES[arch][0])
    rope = {"rope_type": "default", **(c.rope_scaling or {}), "rope_theta": float(c.rope_theta)}
    common = dict(vocab_size=c.vocab_size, hidden_size=c.hidden_size,
                  num_hidden_layers=c.num_hidden_layers,
                  num_attention_heads=c.num_attention_heads,
                  num_key_value_heads=c.num_key_value_heads, hidden_act=c.hidden_act,
                  max_position_embeddings=c.max_position_embeddings,
                  rms_norm_eps=c.rms_norm_eps, tie_word_embeddings=c.tie_word_embeddings,
                  rope_parameters=rope,
                  pad_token_id=c.pad_token_id, bos_token_id=c.bos_token_id,
                  eos_token_id=(list(c.eos_token_id) if isinstance(c.eos_token_id, tuple)
                                else c.eos_token_id), attention_dropout=0.0,
                  architectures=[HF_CLASSES[arch][1]])
    if arch == "llama":
        kw = dict(intermediate_size=c.intermediate_size, head_dim=c.head_dim,
                  attention_bias=False, mlp_bias=False)
    elif arch == "mixtral":
        kw = dict(intermediate_size=c.moe_intermediate_size, head_dim=c.head_dim,
                  num_local_experts=c.num_experts, num_experts_per_tok=c.num_experts_per_tok,
                  sliding_window=None, router_jitter_noise=0.0)
    elif arch == "qwen2_moe":
        kw = dict(intermediate_size=c.intermediate_size,
                  moe_intermediate_size=c.moe_intermediate_size,
                  shared_expert_intermediate_size=c.moe_intermediate_size * c.num_shared_experts,
                  num_experts=c.num_experts, num_experts_per_tok=c.num_experts_per_tok,
                  norm_topk_prob=c.norm_topk_prob, decoder_sparse_step=1,
                  mlp_only_layers=list(range(c.first_k_dense_replace)), qkv_bias=True,
                  use_sliding_window=False)
    else:
        kw = _deepseek_v3_fields(c)
    return cfg_cls(**{**common, **kw})


def _deepseek_v3_fields(c: ModelConfig) -> dict:
    """``DeepseekV3Config`` fields beyond the common ones: the MLA fields (placeholders
    consistent with ``head_dim`` for a GQA config, which only builds MoE blocks), the MoE
    (a dense MLA model: every layer below ``first_k_dense_replace``)."""
    if c.is_mla:
        mla = dict(q_lora_rank=c.q_lora_rank, kv_lora_rank=c.kv_lora_rank,
                   qk_rope_head_dim=c.qk_rope_head_dim, qk_nope_head_dim=c.qk_nope_head_dim,
                   v_head_dim=c.v_head_dim, rope_interleave=True, attention_bias=False,
                   num_key_value_heads=c.num_attention_heads)
    else:
        half = max(c.head_dim // 2, 1)
        mla = dict(q_lora_rank=None, kv_lora_rank=c.head_dim, qk_rope_head_dim=half,
                   qk_nope_head_dim=c.head_dim - half, v_head_dim=c.head_dim)
    moe = c.num_experts > 0
    return dict(intermediate_size=c.intermediate_size,
                moe_intermediate_size=c.moe_intermediate_size,
                n_routed_experts=c.num_experts if moe else 2,
                n_shared_experts=c.num_shared_experts if moe else 1,
                num_experts_per_tok=c.num_experts_per_tok if moe else 1, n_group=c.n_group,
                topk_group=c.topk_group, norm_topk_prob=c.norm_topk_prob,
                routed_scaling_factor=float(c.routed_scaling_factor),
                first_k_dense_replace=c.first_k_dense_replace if moe else c.num_hidden_layers,
                num_nextn_predict_layers=c.num_nextn_predict_layers,
                # DeepSeek's published config.json names these; transformers' class does not
                # (its router is always sigmoid noaux_tc), but vLLM reads them, with
                # softmax and no correction bias as its defaults
                topk_method="noaux_tc", scoring_func="sigmoid", moe_layer_freq=1, **mla)


from_hf_config = ModelConfig.from_hf_config
"""A :class:`ModelConfig` from a ``transformers`` config object or ``config.json`` dict: the
same function as :meth:`ModelConfig.from_hf_config` (one parser, so the two cannot disagree)."""
