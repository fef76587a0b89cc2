"""Map the shared model to and from Hugging Face transformers (proof that ours == theirs).

Which HF class matches which :class:`~tokenflow.model.config.ModelConfig` (:func:`hf_architecture`):

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

Weight layout differences handled here (everything else is a rename ``x`` -> ``model.x``):

* HF stores the routed experts of one layer as two 3-D tensors: ``experts.gate_up_proj
  [E, 2I, H]`` (gate rows first, then up rows: ``chunk(2)`` in ``MixtralExperts.forward``) and
  ``experts.down_proj [E, H, I]``; ours are ``E`` separate :class:`~tokenflow.model.ffn.FFN`
  modules.
* ``Qwen2MoeSparseMoeBlock`` multiplies its shared expert by ``sigmoid(shared_expert_gate(x))``;
  ours adds the shared experts unweighted (DeepSeekMoE). The mapping sets
  ``shared_expert_gate.weight = 0`` (so the gate is exactly ``sigmoid(0) = 0.5``) and stores
  ``2 * down_proj``; both factors are powers of two, so the product is bit-exact.
* DeepSeek-V3's MLA (:class:`~tokenflow.model.mla.MLAttention`, same module names as HF) maps one
  to one, except the RoPE slice: DeepSeek's checkpoints (``rope_interleave=True``) rotate
  neighbouring pairs ``(x0, x1), (x2, x3)...``, ours the two halves. Reordering the rows that
  produce the RoPE slice (``q_proj`` / ``q_b_proj`` per head, ``kv_a_proj_with_mqa``'s last
  ``qk_rope_head_dim`` rows) to ``evens, odds`` makes the two equal: HF's rotated output is
  already in that order. :func:`moe_to_hf` also maps a single MoE block onto ``DeepseekV3MoE``.
* Qwen2-MoE attention has q/k/v biases (``qkv_bias``, default ``True`` in ``Qwen2MoeConfig``;
  vLLM's ``Qwen2MoeAttention`` builds them whatever the config says and leaves a bias the
  checkpoint lacks uninitialised). The export writes ``qkv_bias=True`` and zero biases, so HF
  and vLLM compute exactly our bias-free attention.

Sources: ``transformers`` 5.x ``models/{llama,mixtral,qwen2_moe,deepseek_v3}/modeling_*.py``.
``transformers`` is imported lazily inside the functions that need it (a test dependency;
``import tokenflow`` works without it).
"""
from __future__ import annotations

from typing import Mapping

import torch

from tokenflow.model.config import ModelConfig
from tokenflow.model.transformer import TokenFlowModel

__all__ = ["HF_CLASSES", "hf_architecture", "to_hf_config", "from_hf_config",
           "state_dict_to_hf", "state_dict_from_hf", "to_hf_model", "from_hf_model",
           "moe_to_hf", "moe_from_hf", "hf_position_ids"]

HF_CLASSES = {"llama": ("LlamaConfig", "LlamaForCausalLM"),
              "mixtral": ("MixtralConfig", "MixtralForCausalLM"),
              "qwen2_moe": ("Qwen2MoeConfig", "Qwen2MoeForCausalLM"),
              "deepseek_v3": ("DeepseekV3Config", "DeepseekV3ForCausalLM")}
"""``architecture -> (config class, causal-LM class)`` names in ``transformers``."""

_FULL_MODEL = ("llama", "mixtral", "qwen2_moe", "deepseek_v3")
_ATTN = ("q_proj", "k_proj", "v_proj", "o_proj")
_MLA = ("kv_a_proj_with_mqa", "kv_a_layernorm", "kv_b_proj", "o_proj")
_FFN = ("gate_proj", "up_proj", "down_proj")


# ---------------------------------------------------------------------------- configs
def _moe_block_problem(config: ModelConfig, arch: str) -> str | None:
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


def _check_arch(config: ModelConfig, arch: str) -> None:
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
    problem = _moe_block_problem(config, arch)
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
        _check_arch(config, "deepseek_v3")
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
        problem = _moe_block_problem(config, "mixtral") or (
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
    _check_arch(c, arch)
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


# ---------------------------------------------------------------------------- weights
def _moe_to_hf_tensors(get, E: int, arch: str) -> dict[str, torch.Tensor]:
    """HF MoE-block tensors (keys relative to the block) from ours (``get(name)``)."""
    gate_up = torch.stack([torch.cat([get(f"experts.{e}.gate_proj.weight"),
                                      get(f"experts.{e}.up_proj.weight")], dim=0)
                           for e in range(E)])                            # [E, 2I, H]
    down = torch.stack([get(f"experts.{e}.down_proj.weight") for e in range(E)])  # [E, H, I]
    out = {"gate.weight": get("gate.weight"), "experts.gate_up_proj": gate_up,
           "experts.down_proj": down}
    if arch == "qwen2_moe":
        for n in _FFN:
            w = get(f"shared_experts.{n}.weight")
            out[f"shared_expert.{n}.weight"] = w * 2 if n == "down_proj" else w
        w = get("gate.weight")
        out["shared_expert_gate.weight"] = torch.zeros(1, w.shape[1], dtype=w.dtype,
                                                       device=w.device)
    elif arch == "deepseek_v3":
        out["gate.e_score_correction_bias"] = get("gate.e_score_correction_bias")
        for n in _FFN:
            out[f"shared_experts.{n}.weight"] = get(f"shared_experts.{n}.weight")
    return out


def _moe_from_hf_tensors(get, E: int, arch: str, bias_like: torch.Tensor | None = None,
                         has_shared: bool = True) -> dict[str, torch.Tensor]:
    """Our MoE tensors (keys relative to ``mlp.``) from the HF block's (``get(name)``)."""
    gate_up, down = get("experts.gate_up_proj"), get("experts.down_proj")
    if gate_up.dim() != 3 or gate_up.shape[0] != E or gate_up.shape[1] % 2:
        raise ValueError(f"experts.gate_up_proj must be [E={E}, 2I, H], got "
                         f"{list(gate_up.shape)}")
    I = gate_up.shape[1] // 2
    out = {"gate.weight": get("gate.weight")}
    for e in range(E):
        out[f"experts.{e}.gate_proj.weight"] = gate_up[e, :I]
        out[f"experts.{e}.up_proj.weight"] = gate_up[e, I:]
        out[f"experts.{e}.down_proj.weight"] = down[e]
    if arch == "deepseek_v3":
        out["gate.e_score_correction_bias"] = get("gate.e_score_correction_bias")
    elif bias_like is not None:
        out["gate.e_score_correction_bias"] = torch.zeros_like(bias_like)
    if arch == "qwen2_moe" and has_shared:
        sg = get("shared_expert_gate.weight")
        if sg.abs().max() != 0:
            raise ValueError("Qwen2-MoE shared_expert_gate is not zero: our MoE adds the shared "
                             "expert unweighted and cannot express a learned gate")
        for n in _FFN:
            w = get(f"shared_expert.{n}.weight")
            out[f"shared_experts.{n}.weight"] = w / 2 if n == "down_proj" else w
    elif arch == "deepseek_v3" and has_shared:
        for n in _FFN:
            out[f"shared_experts.{n}.weight"] = get(f"shared_experts.{n}.weight")
    return out


def _getter(sd: Mapping[str, torch.Tensor], prefix: str):
    def get(name: str) -> torch.Tensor:
        key = prefix + name
        if key not in sd:
            raise ValueError(f"state dict has no tensor {key!r}")
        return sd[key]
    return get


def _attention_names(config: ModelConfig) -> tuple[str, ...]:
    """Weight names (without ``.weight``) of one attention module, ours and HF's alike."""
    if not config.is_mla:
        return _ATTN
    q = ("q_proj",) if config.q_lora_rank is None else ("q_a_proj", "q_a_layernorm", "q_b_proj")
    return q + _MLA


def _rope_rows(config: ModelConfig) -> dict[str, torch.Tensor]:
    """For each MLA weight that produces a RoPE slice, ``name -> row order`` taking DeepSeek's
    interleaved layout (``rope_interleave=True``) to ours: in every RoPE slice the even rows
    first, then the odd ones (see the module docstring)."""
    c = config
    dr, dq = c.qk_rope_head_dim, c.qk_nope_head_dim + c.qk_rope_head_dim
    perm = torch.cat([torch.arange(0, dr, 2), torch.arange(1, dr, 2)])        # [dr]
    q_rows = torch.cat([torch.cat([torch.arange(c.qk_nope_head_dim), c.qk_nope_head_dim + perm])
                        + h * dq for h in range(c.num_attention_heads)])
    kv_rows = torch.cat([torch.arange(c.kv_lora_rank), c.kv_lora_rank + perm])
    q_name = "q_proj" if c.q_lora_rank is None else "q_b_proj"
    return {q_name: q_rows, "kv_a_proj_with_mqa": kv_rows}


def _reorder_rope(sd: dict, config: ModelConfig, prefix: str, to_hf: bool) -> None:
    """Reorder, in place, the RoPE rows of every layer's MLA weights in ``sd`` (keys
    ``{prefix}layers.{i}.self_attn.<name>.weight``): HF interleaved -> ours, or back."""
    for name, rows in _rope_rows(config).items():
        if to_hf:
            rows = torch.argsort(rows)
        for i in range(config.num_hidden_layers):
            key = f"{prefix}layers.{i}.self_attn.{name}.weight"
            sd[key] = sd[key][rows]


def _name_pairs(config: ModelConfig):
    """``(our name, HF name)`` of every tensor that is renamed one to one: embedding, final
    norm, and per layer the two norms, the attention projections and a dense FFN. The LM head
    and the MoE blocks (reshaped, not just renamed) are mapped by the callers."""
    yield "embed_tokens.weight", "model.embed_tokens.weight"
    yield "norm.weight", "model.norm.weight"
    for i in range(config.num_hidden_layers):
        p, q = f"layers.{i}.", f"model.layers.{i}."
        for n in ("input_layernorm", "post_attention_layernorm"):
            yield f"{p}{n}.weight", f"{q}{n}.weight"
        for n in _attention_names(config):
            yield f"{p}self_attn.{n}.weight", f"{q}self_attn.{n}.weight"
        if not config.layer_is_moe(i):
            for n in _FFN:
                yield f"{p}mlp.{n}.weight", f"{q}mlp.{n}.weight"


def state_dict_to_hf(model: TokenFlowModel | Mapping[str, torch.Tensor],
                     config: ModelConfig | None = None,
                     architecture: str | None = None) -> dict[str, torch.Tensor]:
    """Our weights renamed/reshaped to the state dict of the matching HF causal LM.

    Pure tensor work (no ``transformers`` import). Tensors are shared with ``model`` where
    no reshaping is needed (not copied). For DeepSeek-V3 the result is in DeepSeek's
    interleaved RoPE layout (``rope_interleave=True``, as :func:`to_hf_config` sets).

    Args:
        model: a :class:`TokenFlowModel`, or its ``state_dict()`` (then pass ``config``).
        config: the config (default ``model.config``).
        architecture: ``"llama"``, ``"mixtral"``, ``"qwen2_moe"`` or ``"deepseek_v3"`` (MLA
            configs) (default :func:`hf_architecture`).

    Returns:
        ``{hf_name: tensor}``, e.g. ``model.layers.0.mlp.experts.gate_up_proj [E, 2I, H]``.

    Raises:
        ValueError: as :func:`hf_architecture`; a missing tensor; an architecture that cannot
            express ``config`` (e.g. ``"deepseek_v3"`` for GQA attention).
    """
    if isinstance(model, TokenFlowModel):
        config = config or model.config
        sd = model.state_dict()
    elif config is None:
        raise ValueError("pass config when model is a state dict")
    else:
        sd = model
    arch = architecture or hf_architecture(config)
    if arch not in _FULL_MODEL:
        raise ValueError(f"architecture must be one of {_FULL_MODEL} for a whole model, "
                         f"got {arch!r}")
    if architecture is not None:
        _check_arch(config, arch)
    if arch == "deepseek_v3" and not config.is_mla:
        raise ValueError("a whole DeepseekV3ForCausalLM needs MLA attention (kv_lora_rank set); "
                         "this config has GQA: map single MoE blocks with moe_to_hf")
    get = _getter(sd, "")
    out = {hf: get(ours) for ours, hf in _name_pairs(config)}
    out["lm_head.weight"] = get("lm_head.weight")
    for i in range(config.num_hidden_layers):
        if config.layer_is_moe(i):
            sub = _moe_to_hf_tensors(_getter(sd, f"layers.{i}.mlp."), config.num_experts, arch)
            out.update({f"model.layers.{i}.mlp.{k}": v for k, v in sub.items()})
    if arch == "qwen2_moe":
        out.update(_zero_qkv_biases(config, out))
    if config.is_mla:
        _reorder_rope(out, config, "model.", to_hf=True)
    return out


def _zero_qkv_biases(config: ModelConfig, hf: Mapping[str, torch.Tensor]) -> dict:
    """Zero ``self_attn.{q,k,v}_proj.bias`` of every layer (Qwen2-MoE's ``qkv_bias``), each
    ``[rows of its weight]`` in that weight's dtype."""
    out = {}
    for i in range(config.num_hidden_layers):
        for n in ("q_proj", "k_proj", "v_proj"):
            w = hf[f"model.layers.{i}.self_attn.{n}.weight"]
            out[f"model.layers.{i}.self_attn.{n}.bias"] = torch.zeros(w.shape[0], dtype=w.dtype,
                                                                      device=w.device)
    return out


def state_dict_from_hf(hf_state_dict: Mapping[str, torch.Tensor], config: ModelConfig,
                       architecture: str | None = None,
                       rope_interleave: bool = True) -> dict[str, torch.Tensor]:
    """Inverse of :func:`state_dict_to_hf`: an HF causal-LM state dict as ours.

    ``rope_interleave``: the HF config's flag (DeepSeek-V3 only; ``True`` for DeepSeek's
    checkpoints and for :func:`state_dict_to_hf`'s output): reorder the RoPE rows to ours.

    Returns:
        ``{our_name: tensor}`` loadable with ``TokenFlowModel(config).load_state_dict(...,
        strict=False)`` (only non-persistent RoPE tables are absent).

    Raises:
        ValueError: missing tensor (``lm_head.weight`` too, unless ``tie_word_embeddings``);
            a Qwen2-MoE shared-expert gate or q/k/v bias that is not zero (not expressible by
            our model); an architecture that cannot express ``config``.
    """
    arch = architecture or hf_architecture(config)
    if arch not in _FULL_MODEL:
        raise ValueError(f"architecture must be one of {_FULL_MODEL} for a whole model, "
                         f"got {arch!r}")
    _check_arch(config, arch)
    if arch == "deepseek_v3" and not config.is_mla:
        raise ValueError("a whole DeepseekV3ForCausalLM needs MLA attention (kv_lora_rank set)")
    for k, v in hf_state_dict.items():
        if k.endswith("_proj.bias") and v.abs().max() != 0:
            raise ValueError(f"{k} is not zero: our attention and FFN have no biases")
    get = _getter(hf_state_dict, "")
    out = {ours: get(hf) for ours, hf in _name_pairs(config)}
    if "lm_head.weight" in hf_state_dict:
        out["lm_head.weight"] = hf_state_dict["lm_head.weight"]
    elif config.tie_word_embeddings:
        out["lm_head.weight"] = out["embed_tokens.weight"]
    else:
        raise ValueError("state dict has no tensor 'lm_head.weight' and the config does not tie "
                         "word embeddings (tie_word_embeddings=False): the LM head is missing")
    for i in range(config.num_hidden_layers):
        if config.layer_is_moe(i):
            bias = torch.zeros(config.num_experts, dtype=torch.float32)
            sub = _moe_from_hf_tensors(_getter(hf_state_dict, f"model.layers.{i}.mlp."),
                                       config.num_experts, arch, bias,
                                       config.num_shared_experts > 0)
            out.update({f"layers.{i}.mlp.{k}": v for k, v in sub.items()})
    if config.is_mla and rope_interleave:
        _reorder_rope(out, config, "", to_hf=False)
    return out


def to_hf_model(model: TokenFlowModel, architecture: str | None = None,
                attn_implementation: str = "sdpa", experts_implementation: str | None = None):
    """Build the matching ``transformers`` causal LM and copy our weights into it.

    Args:
        model: a :class:`TokenFlowModel` (any dtype; the HF model gets the same dtype and
            device).
        architecture: as :func:`to_hf_config` (whole-model families only).
        attn_implementation: HF attention backend, ``"sdpa"`` (default) or ``"eager"``.
        experts_implementation: HF MoE experts backend (``None`` = HF's default:
            ``"grouped_mm"`` where torch supports it, else ``"eager"``).

    Returns:
        ``LlamaForCausalLM`` / ``MixtralForCausalLM`` / ``Qwen2MoeForCausalLM`` /
        ``DeepseekV3ForCausalLM`` in eval mode, whose logits equal ours (fp32: within ~1e-5).

    Raises:
        ValueError: as :func:`hf_architecture` / :func:`to_hf_config`.
        ImportError: if ``transformers`` is not installed.
    """
    import transformers
    arch = architecture or hf_architecture(model.config)
    if arch not in _FULL_MODEL:
        raise ValueError(f"architecture must be one of {_FULL_MODEL} for a whole model, "
                         f"got {arch!r}")
    hf_cfg = to_hf_config(model.config, arch)
    cls = getattr(transformers, HF_CLASSES[arch][1])
    kw = {"attn_implementation": attn_implementation}
    if experts_implementation is not None and arch != "llama":
        kw["experts_implementation"] = experts_implementation
    p = next(model.parameters())
    hf = cls._from_config(hf_cfg, **kw)
    sd = {k: v.detach().to(torch.float32) for k, v in state_dict_to_hf(model, None, arch).items()}
    missing, unexpected = hf.load_state_dict(sd, strict=False)
    missing = [k for k in missing if not (model.config.tie_word_embeddings
                                          and k == "lm_head.weight")]
    if missing or unexpected:
        raise ValueError(f"weight mapping to {cls.__name__} incomplete: missing={missing}, "
                         f"unexpected={unexpected}")
    return hf.to(dtype=p.dtype, device=p.device).eval()


def from_hf_model(hf_model) -> TokenFlowModel:
    """A :class:`TokenFlowModel` with the weights of a ``transformers`` Llama / Mixtral /
    Qwen2-MoE / DeepSeek-V3 causal LM (config via :func:`from_hf_config`), same dtype, eval
    mode.

    Raises:
        ValueError: an unsupported ``model_type``, or weights our model cannot express
            (non-zero biases, a non-zero Qwen2-MoE shared expert gate).
    """
    arch = getattr(hf_model.config, "model_type", None)
    if arch not in _FULL_MODEL:
        raise ValueError(f"model_type must be one of {_FULL_MODEL}, got {arch!r}")
    # biases are checked to be zero and the Qwen2-MoE gate is folded by the weight mapping
    config = from_hf_config(hf_model.config).replace(
        attention_bias=False, attention_out_bias=False, mlp_bias=False,
        shared_expert_gate=False)
    sd = {k: v.detach() for k, v in hf_model.state_dict().items()}
    ours = state_dict_from_hf(sd, config, arch,
                              bool(getattr(hf_model.config, "rope_interleave", False)))
    p = next(hf_model.parameters())
    model = TokenFlowModel(config)
    missing, unexpected = model.load_state_dict(
        {k: v.to(torch.float32) for k, v in ours.items()}, strict=False)
    missing = [k for k in missing if not k.startswith("rotary.")]
    if missing or unexpected:
        raise ValueError(f"weight mapping from {type(hf_model).__name__} incomplete: "
                         f"missing={missing}, unexpected={unexpected}")
    return model.to(dtype=p.dtype, device=p.device).eval()


# ---------------------------------------------------------------------------- MoE blocks
def _block_arch(hf_block) -> str:
    name = type(hf_block).__name__
    for key, arch in (("Mixtral", "mixtral"), ("Qwen2Moe", "qwen2_moe"),
                      ("DeepseekV3", "deepseek_v3")):
        if name.startswith(key):
            return arch
    raise ValueError("hf_block must be a MixtralSparseMoeBlock, Qwen2MoeSparseMoeBlock or "
                     f"DeepseekV3MoE, got {name}")


def _moe_config_view(moe) -> ModelConfig:
    g = moe.gate
    H = g.weight.shape[1]
    n_shared = 0
    if moe.shared_experts is not None:
        n_shared = moe.shared_experts.gate_proj.out_features // \
            moe.experts[0].gate_proj.out_features
    return ModelConfig(vocab_size=8, hidden_size=H, num_hidden_layers=1, num_attention_heads=1,
                       num_key_value_heads=1, head_dim=2, intermediate_size=1,
                       moe_intermediate_size=moe.experts[0].gate_proj.out_features,
                       num_experts=g.num_experts, num_experts_per_tok=g.top_k,
                       num_shared_experts=n_shared, scoring_func=g.scoring_func,
                       norm_topk_prob=g.norm_topk_prob,
                       routed_scaling_factor=g.routed_scaling_factor, n_group=g.n_group,
                       topk_group=g.topk_group, topk_method=g.topk_method, pad_token_id=0,
                       bos_token_id=0, eos_token_id=0)


def moe_to_hf(moe, hf_block) -> None:
    """Copy one of our :class:`~tokenflow.model.moe.MoE` blocks into an HF MoE block in place.

    ``hf_block`` is a ``MixtralSparseMoeBlock``, ``Qwen2MoeSparseMoeBlock`` (its shared
    expert gate is set to 0 and its shared ``down_proj`` to twice ours, see the module
    docstring) or ``DeepseekV3MoE`` (router weight and ``e_score_correction_bias``, experts,
    shared experts), built from :func:`to_hf_config` of a matching config. Its ``forward``
    then equals ``moe(x)`` for ``x [B,S,H]``.

    Raises:
        ValueError: an HF block of another kind, a family that cannot express ``moe``'s
            routing (e.g. sigmoid into Mixtral), or shapes that do not match.
    """
    arch = _block_arch(hf_block)
    problem = _moe_block_problem(_moe_config_view(moe), arch)
    if problem:
        raise ValueError(f"cannot map this MoE into {type(hf_block).__name__}: {problem}")
    sd = _moe_to_hf_tensors(_getter(moe.state_dict(), ""), moe.num_experts, arch)
    target = hf_block.state_dict()
    for k, v in sd.items():
        if k not in target or target[k].shape != v.shape:
            raise ValueError(f"{type(hf_block).__name__} tensor {k}: expected "
                             f"{list(v.shape)}, got "
                             f"{list(target[k].shape) if k in target else 'none'}")
    with torch.no_grad():
        hf_block.load_state_dict({k: v.detach().clone() for k, v in sd.items()}, strict=True)


def moe_from_hf(hf_block, moe) -> None:
    """Inverse of :func:`moe_to_hf`: copy an HF MoE block's weights into ``moe`` in place.

    Raises:
        ValueError: as :func:`moe_to_hf`; a non-zero Qwen2-MoE shared expert gate.
    """
    arch = _block_arch(hf_block)
    problem = _moe_block_problem(_moe_config_view(moe), arch)
    if problem:
        raise ValueError(f"cannot map {type(hf_block).__name__} into this MoE: {problem}")
    own = moe.state_dict()
    sd = _moe_from_hf_tensors(_getter(hf_block.state_dict(), ""), moe.num_experts, arch,
                              own["gate.e_score_correction_bias"],
                              moe.shared_experts is not None)
    for k, v in sd.items():
        if k not in own or own[k].shape != v.shape:
            raise ValueError(f"MoE tensor {k}: expected "
                             f"{list(own[k].shape) if k in own else 'none'}"
                             f", got {list(v.shape)}")
    with torch.no_grad():
        moe.load_state_dict({k: v.detach().clone() for k, v in sd.items()}, strict=True)


def hf_position_ids(attention_mask: torch.Tensor) -> torch.Tensor:
    """RoPE positions for left-padded rows, as HF ``generate`` computes them:
    ``cumsum(mask) - 1``, padding set to 0 (``GenerationMixin._prepare_position_ids_for_
    generation``). Equals the positions our model and :class:`~tokenflow.KVCache` use.

    Args:
        attention_mask: ``[B,S]`` 1 = real token, 0 = left padding.

    Returns:
        ``[B,S]`` int64 positions.
    """
    m = attention_mask.long()
    return (m.cumsum(-1) - 1).masked_fill(m == 0, 0)
