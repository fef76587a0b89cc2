"""Map the shared model's weights to and from Hugging Face transformers (proof that ours ==
theirs).

Which HF class matches which config, and the config both ways, is
:mod:`tokenflow.interop.hf_architectures` (re-exported here).

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

from tokenflow.config import ModelConfig
from tokenflow.model.transformer import TokenFlowModel
from .hf_architectures import (HF_CLASSES, WHOLE_MODEL_ARCHS, check_architecture, moe_block_problem,
                               from_hf_config, hf_architecture, to_hf_config)

__all__ = ["HF_CLASSES", "hf_architecture", "to_hf_config", "from_hf_config",
           "state_dict_to_hf", "state_dict_from_hf", "to_hf_model", "from_hf_model",
           "moe_to_hf", "moe_from_hf", "hf_position_ids"]

_ATTN = ("q_proj", "k_proj", "v_proj", "o_proj")
_MLA = ("kv_a_proj_with_mqa", "kv_a_layernorm", "kv_b_proj", "o_proj")
_FFN = ("gate_proj", "up_proj", "down_proj")


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
    if arch not in WHOLE_MODEL_ARCHS:
        raise ValueError(f"architecture must be one of {WHOLE_MODEL_ARCHS} for a whole model, "
                         f"got {arch!r}")
    if architecture is not None:
        check_architecture(config, arch)
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
    if arch not in WHOLE_MODEL_ARCHS:
        raise ValueError(f"architecture must be one of {WHOLE_MODEL_ARCHS} for a whole model, "
                         f"got {arch!r}")
    check_architecture(config, arch)
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
    if arch not in WHOLE_MODEL_ARCHS:
        raise ValueError(f"architecture must be one of {WHOLE_MODEL_ARCHS} for a whole model, "
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
    if arch not in WHOLE_MODEL_ARCHS:
        raise ValueError(f"model_type must be one of {WHOLE_MODEL_ARCHS}, got {arch!r}")
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
    problem = moe_block_problem(_moe_config_view(moe), arch)
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
    problem = moe_block_problem(_moe_config_view(moe), arch)
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
