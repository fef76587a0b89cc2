"""Map the shared model to and from Hugging Face transformers (proof that ours == theirs).

Which HF class matches which :class:`~tokenflow.config.ModelConfig` (:func:`hf_architecture`):

=====================  ======================================================  =====================
architecture           our config                                              HF class
=====================  ======================================================  =====================
``llama``              dense (``num_experts == 0``)                            ``LlamaForCausalLM``
``mixtral``            softmax MoE, renormalised top-k, no shared experts,     ``MixtralForCausalLM``
                       no dense first layers
``qwen2_moe``          softmax MoE with shared experts (optionally dense       ``Qwen2MoeForCausalLM``
                       first layers, optionally without renormalisation)
(none)                 sigmoid (DeepSeek-V3) routing, ``n_group > 1``,          ``ValueError``; compare
                       ``routed_scaling_factor != 1``                           the MoE block with
                                                                                ``DeepseekV3MoE``
=====================  ======================================================  =====================

Weight layout differences handled here (everything else is a rename ``x`` -> ``model.x``):

* HF stores the routed experts of one layer as two 3-D tensors: ``experts.gate_up_proj
  [E, 2I, H]`` (gate rows first, then up rows: ``chunk(2)`` in ``MixtralExperts.forward``) and
  ``experts.down_proj [E, H, I]``; ours are ``E`` separate :class:`~tokenflow.ffn.FFN` modules.
* ``Qwen2MoeSparseMoeBlock`` multiplies its shared expert by ``sigmoid(shared_expert_gate(x))``;
  ours adds the shared experts unweighted (DeepSeekMoE). The mapping sets
  ``shared_expert_gate.weight = 0`` (so the gate is exactly ``sigmoid(0) = 0.5``) and stores
  ``2 * down_proj``; both factors are powers of two, so the product is bit-exact.
* DeepSeek-V3's MLA attention (low-rank K/V with an RMSNorm inside) is not our GQA, so no
  whole DeepSeek-V3 model maps; :func:`moe_to_hf` maps one MoE block onto ``DeepseekV3MoE``.

Sources: ``transformers`` 5.x ``models/{llama,mixtral,qwen2_moe,deepseek_v3}/modeling_*.py``.
``transformers`` is imported lazily inside the functions that need it (a test dependency;
``import tokenflow`` works without it).
"""
from __future__ import annotations

from typing import Any, Mapping

import torch

from .config import ModelConfig
from .model import TokenFlowModel

__all__ = ["HF_CLASSES", "hf_architecture", "to_hf_config", "from_hf_config",
           "state_dict_to_hf", "state_dict_from_hf", "to_hf_model", "from_hf_model",
           "moe_to_hf", "moe_from_hf", "hf_position_ids"]

HF_CLASSES = {"llama": ("LlamaConfig", "LlamaForCausalLM"),
              "mixtral": ("MixtralConfig", "MixtralForCausalLM"),
              "qwen2_moe": ("Qwen2MoeConfig", "Qwen2MoeForCausalLM"),
              "deepseek_v3": ("DeepseekV3Config", "DeepseekV3ForCausalLM")}
"""``architecture -> (config class, causal-LM class)`` names in ``transformers``."""

_FULL_MODEL = ("llama", "mixtral", "qwen2_moe")
_ATTN = ("q_proj", "k_proj", "v_proj", "o_proj")
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
    if arch == "llama":
        if config.is_moe:
            raise ValueError("architecture 'llama' is dense but this config has MoE layers")
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
        ``"llama"`` (dense), ``"mixtral"`` (softmax MoE, renormalised, no shared experts,
        no dense first layers) or ``"qwen2_moe"`` (softmax MoE with shared experts).

    Raises:
        ValueError: when no HF causal-LM class matches (sigmoid/DeepSeek-V3 routing, group
            routing, a routed scaling factor, or dense first layers without shared experts),
            saying why and what to compare instead.
    """
    if not config.is_moe:
        return "llama"
    if config.scoring_func == "sigmoid" or config.n_group > 1 \
            or config.routed_scaling_factor != 1.0:
        raise ValueError(
            "no Hugging Face causal-LM class matches this config: DeepSeek-V3 style routing "
            f"(scoring_func={config.scoring_func!r}, n_group={config.n_group}, "
            f"routed_scaling_factor={config.routed_scaling_factor}) exists only in "
            "DeepseekV3ForCausalLM, whose MLA attention is not our GQA. Compare one MoE block "
            "instead: moe_to_hf(model.layers[i].mlp, DeepseekV3MoE(to_hf_config(config, "
            "'deepseek_v3')))")
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
            default :func:`hf_architecture`. ``"deepseek_v3"`` is for building a
            ``DeepseekV3MoE`` / ``DeepseekV3TopkRouter`` block only (its MLA attention fields
            are filled with placeholders consistent with ``head_dim``).

    Returns:
        a ``LlamaConfig`` / ``MixtralConfig`` / ``Qwen2MoeConfig`` / ``DeepseekV3Config`` with
        ``rope_parameters={"rope_type": "default", "rope_theta": ...}``, the special token ids,
        ``architectures=[<causal-LM class>]``.

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
    common = dict(vocab_size=c.vocab_size, hidden_size=c.hidden_size,
                  num_hidden_layers=c.num_hidden_layers,
                  num_attention_heads=c.num_attention_heads,
                  num_key_value_heads=c.num_key_value_heads, hidden_act="silu",
                  max_position_embeddings=c.max_position_embeddings,
                  rms_norm_eps=c.rms_norm_eps, tie_word_embeddings=c.tie_word_embeddings,
                  rope_parameters={"rope_type": "default", "rope_theta": float(c.rope_theta)},
                  pad_token_id=c.pad_token_id, bos_token_id=c.bos_token_id,
                  eos_token_id=c.eos_token_id, attention_dropout=0.0,
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
                  mlp_only_layers=list(range(c.first_k_dense_replace)), qkv_bias=False,
                  use_sliding_window=False)
    else:  # deepseek_v3: MoE block only
        half = max(c.head_dim // 2, 1)
        kw = dict(intermediate_size=c.intermediate_size,
                  moe_intermediate_size=c.moe_intermediate_size,
                  n_routed_experts=c.num_experts, n_shared_experts=c.num_shared_experts,
                  num_experts_per_tok=c.num_experts_per_tok, n_group=c.n_group,
                  topk_group=c.topk_group, norm_topk_prob=c.norm_topk_prob,
                  routed_scaling_factor=float(c.routed_scaling_factor),
                  first_k_dense_replace=c.first_k_dense_replace, q_lora_rank=None,
                  kv_lora_rank=c.head_dim, qk_rope_head_dim=half,
                  qk_nope_head_dim=c.head_dim - half, v_head_dim=c.head_dim)
    return cfg_cls(**common, **kw)


def from_hf_config(hf_config: Any, **overrides: Any) -> ModelConfig:
    """A :class:`ModelConfig` from a ``transformers`` config object or ``config.json`` dict.

    Extends :meth:`ModelConfig.from_hf_config` with what it leaves out: ``rope_parameters``
    (transformers 5 keeps ``rope_theta`` there), Qwen2-MoE's shared expert width and
    ``mlp_only_layers``, and the special token ids (a list of EOS ids keeps the first; a
    missing pad id becomes 0). Fields that have no meaning in the source family are given
    canonical values (a Llama config gets ``moe_intermediate_size = intermediate_size``;
    a Mixtral config ``intermediate_size = moe_intermediate_size``).

    Raises:
        ValueError: a RoPE type other than ``"default"``, a Qwen2-MoE shared expert width that
            is not a multiple of ``moe_intermediate_size``, MoE layers that are not "the first
            k dense, the rest MoE", or an inconsistent resulting config.
    """
    d = dict(hf_config.to_dict() if hasattr(hf_config, "to_dict") else hf_config)
    kw: dict[str, Any] = {}
    rope = d.get("rope_parameters") or d.get("rope_scaling") or {}
    if rope:
        rtype = rope.get("rope_type", rope.get("type", "default"))
        if rtype != "default":
            raise ValueError(f"only default RoPE is modelled, got rope_type={rtype!r}")
        if rope.get("rope_theta") is not None:
            kw["rope_theta"] = float(rope["rope_theta"])
    if d.get("model_type") == "qwen2_moe" and d.get("num_experts"):
        moe_i, shared_i = d["moe_intermediate_size"], d.get("shared_expert_intermediate_size", 0)
        if shared_i % moe_i:
            raise ValueError(f"shared_expert_intermediate_size ({shared_i}) must be a multiple "
                             f"of moe_intermediate_size ({moe_i})")
        dense = sorted(d.get("mlp_only_layers") or [])
        if dense != list(range(len(dense))) or d.get("decoder_sparse_step", 1) != 1:
            raise ValueError("only 'first k layers dense, the rest MoE' is modelled, got "
                             f"mlp_only_layers={dense}, "
                             f"decoder_sparse_step={d.get('decoder_sparse_step')}")
        kw.update(num_shared_experts=shared_i // moe_i, first_k_dense_replace=len(dense))
    eos = d.get("eos_token_id")
    if isinstance(eos, (list, tuple)):
        eos = eos[0] if eos else None
    for name, v in (("pad_token_id", d.get("pad_token_id")),
                    ("bos_token_id", d.get("bos_token_id")), ("eos_token_id", eos)):
        kw[name] = int(v) if v is not None else 0
    if not (d.get("num_local_experts") or d.get("n_routed_experts") or d.get("num_experts")):
        kw.update(moe_intermediate_size=d["intermediate_size"], num_experts_per_tok=0,
                  num_shared_experts=0)
    kw.update(overrides)
    return ModelConfig.from_hf_config(d, **kw)


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
        for n in _ATTN:
            yield f"{p}self_attn.{n}.weight", f"{q}self_attn.{n}.weight"
        if not config.layer_is_moe(i):
            for n in _FFN:
                yield f"{p}mlp.{n}.weight", f"{q}mlp.{n}.weight"


def state_dict_to_hf(model: TokenFlowModel | Mapping[str, torch.Tensor],
                     config: ModelConfig | None = None,
                     architecture: str | None = None) -> dict[str, torch.Tensor]:
    """Our weights renamed/reshaped to the state dict of the matching HF causal LM.

    Pure tensor work (no ``transformers`` import). Tensors are shared with ``model`` where
    no reshaping is needed (not copied).

    Args:
        model: a :class:`TokenFlowModel`, or its ``state_dict()`` (then pass ``config``).
        config: the config (default ``model.config``).
        architecture: ``"llama"``, ``"mixtral"`` or ``"qwen2_moe"`` (default
            :func:`hf_architecture`).

    Returns:
        ``{hf_name: tensor}``, e.g. ``model.layers.0.mlp.experts.gate_up_proj [E, 2I, H]``.

    Raises:
        ValueError: as :func:`hf_architecture`; a missing tensor; ``"deepseek_v3"`` (whole
            model not mappable).
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
    get = _getter(sd, "")
    out = {hf: get(ours) for ours, hf in _name_pairs(config)}
    out["lm_head.weight"] = get("lm_head.weight")
    for i in range(config.num_hidden_layers):
        if config.layer_is_moe(i):
            sub = _moe_to_hf_tensors(_getter(sd, f"layers.{i}.mlp."), config.num_experts, arch)
            out.update({f"model.layers.{i}.mlp.{k}": v for k, v in sub.items()})
    return out


def state_dict_from_hf(hf_state_dict: Mapping[str, torch.Tensor], config: ModelConfig,
                       architecture: str | None = None) -> dict[str, torch.Tensor]:
    """Inverse of :func:`state_dict_to_hf`: an HF causal-LM state dict as ours.

    Returns:
        ``{our_name: tensor}`` loadable with ``TokenFlowModel(config).load_state_dict(...,
        strict=False)`` (only non-persistent RoPE tables are absent).

    Raises:
        ValueError: missing tensor; a Qwen2-MoE shared-expert gate or q/k/v bias that is not
            zero (not expressible by our model); an architecture that cannot express
            ``config``.
    """
    arch = architecture or hf_architecture(config)
    if arch not in _FULL_MODEL:
        raise ValueError(f"architecture must be one of {_FULL_MODEL} for a whole model, "
                         f"got {arch!r}")
    _check_arch(config, arch)
    for k, v in hf_state_dict.items():
        if k.endswith("_proj.bias") and v.abs().max() != 0:
            raise ValueError(f"{k} is not zero: our attention and FFN have no biases")
    get = _getter(hf_state_dict, "")
    out = {ours: get(hf) for ours, hf in _name_pairs(config)}
    out["lm_head.weight"] = hf_state_dict.get("lm_head.weight",
                                              hf_state_dict.get("model.embed_tokens.weight"))
    for i in range(config.num_hidden_layers):
        if config.layer_is_moe(i):
            bias = torch.zeros(config.num_experts, dtype=torch.float32)
            sub = _moe_from_hf_tensors(_getter(hf_state_dict, f"model.layers.{i}.mlp."),
                                       config.num_experts, arch, bias,
                                       config.num_shared_experts > 0)
            out.update({f"layers.{i}.mlp.{k}": v for k, v in sub.items()})
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
        ``LlamaForCausalLM`` / ``MixtralForCausalLM`` / ``Qwen2MoeForCausalLM`` in eval mode,
        whose logits equal ours (fp32: within ~1e-5).

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
    Qwen2-MoE causal LM (config via :func:`from_hf_config`), same dtype, eval mode.

    Raises:
        ValueError: an unsupported ``model_type``, or weights our model cannot express
            (non-zero biases, a non-zero Qwen2-MoE shared expert gate).
    """
    arch = getattr(hf_model.config, "model_type", None)
    if arch not in _FULL_MODEL:
        raise ValueError(f"model_type must be one of {_FULL_MODEL}, got {arch!r}")
    config = from_hf_config(hf_model.config)
    sd = {k: v.detach() for k, v in hf_model.state_dict().items()}
    ours = state_dict_from_hf(sd, config, arch)
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
                       topk_group=g.topk_group, pad_token_id=0, bos_token_id=0, eos_token_id=0)


def moe_to_hf(moe, hf_block) -> None:
    """Copy one of our :class:`~tokenflow.moe.MoE` blocks into an HF MoE block in place.

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
            raise ValueError(f"MoE tensor {k}: expected {list(own[k].shape) if k in own else 'none'}"
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
from .hf_export import save_hf_checkpoint  # noqa: E402,F401  (writes an HF checkpoint folder)
