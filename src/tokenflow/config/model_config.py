"""The model configuration: one dataclass with Hugging Face field names.

Shape letters used across the package: B batch, S sequence, T tokens (B*S), H hidden,
V vocab, E experts, K top-k, D head_dim.

Field names follow the ``config.json`` files that Hugging Face transformers reads
(``LlamaConfig``, ``MixtralConfig``, ``DeepseekV3Config``), so a reader can lay our tiny
config next to a real one (see ``tokenflow/data/models.json`` in the package, where every
config names its sources, and :func:`tokenflow.analysis.costmodel.reference_config`).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field, asdict
from typing import Any

from tokenflow.validate import ArgTypeError, boolean, choice, index, integer, number, token_id_list
from .choices import (HIDDEN_ACTS, LAYER_TYPES, NORM_TYPES, POSITION_TYPES, ROPE_TYPES,
                      SCORING_FUNCS, TOPK_METHODS)
from .hf_config import parse_hf_config

__all__ = ["ModelConfig", "PRESETS", "preset"]

@dataclass
class ModelConfig:
    """Hyper-parameters of the shared decoder-only model.

    Attention is Llama-style (RMSNorm, RoPE, grouped-query attention); the feed-forward of
    layer ``i`` is a dense SwiGLU FFN when ``num_experts == 0`` or ``i < first_k_dense_replace``,
    else a mixture of experts (Mixtral / Qwen-MoE softmax routing, or DeepSeek-V3 sigmoid
    routing with a selection-only bias and group-limited choice; DeepSeek-V3 report,
    arXiv:2412.19437, section 2.1.2).

    Fields (HF names):
        vocab_size: V, rows of the embedding table and of the LM head.
        hidden_size: H, width of the hidden state.
        num_hidden_layers: number of decoder blocks.
        num_attention_heads: query heads.
        num_key_value_heads: key/value heads (GQA); must divide ``num_attention_heads``.
        head_dim: D; ``None`` means ``hidden_size // num_attention_heads``.
        intermediate_size: width of the dense SwiGLU FFN.
        moe_intermediate_size: width of each expert's SwiGLU FFN.
        num_experts: E routed experts (0 = dense model).
        num_experts_per_tok: K, experts chosen per token.
        num_shared_experts: experts every token goes through (DeepSeek style).
        first_k_dense_replace: the first k layers use the dense FFN even in an MoE model.
        scoring_func: ``"softmax"`` (Mixtral/Qwen) or ``"sigmoid"`` (DeepSeek-V3).
        norm_topk_prob: renormalise the K chosen weights to sum to 1.
        routed_scaling_factor: multiplies the routed weights (DeepSeek-V3 uses 2.5).
        n_group, topk_group: group-limited routing (choose ``topk_group`` of ``n_group``
            expert groups first); ``n_group=1`` disables it.
        topk_method: how the groups are ranked (DeepSeek's ``topk_method``): ``"noaux_tc"``
            (V3: sum of a group's 2 best selection scores), ``"group_limited_greedy"`` (V2:
            its best score) or ``"greedy"`` (the groups are ignored); see
            :func:`tokenflow.model.moe.route`.
        max_position_embeddings: longest sequence (prompt + generated) the model accepts.
        rope_theta: RoPE base frequency.
        rms_norm_eps: epsilon in RMSNorm.
        tie_word_embeddings: share the embedding table with the LM head.
        hidden_act: the FFN's (and experts') activation on the gate, an HF ``hidden_act``
            name: ``"silu"`` (SwiGLU), ``"gelu"``, ``"gelu_new"``, ``"gelu_pytorch_tanh"``,
            ``"relu"`` (:data:`tokenflow.model.ffn.ACTIVATIONS`; GPT-2's ``activation_function``
            for ``gated_mlp=False``).
        pad_token_id, bos_token_id: special token ids.
        eos_token_id: the end-of-sequence id, or a tuple of several (HF's ``eos_token_id``
            list, e.g. Llama 3 Instruct's ``[128001, 128009]``: generation stops at any),
            or ``None`` (the model has none). Read :attr:`eos_token_ids` for the tuple form.
        kv_lora_rank: ``None`` for grouped-query attention; set, attention is multi-head latent
            attention (MLA, DeepSeek-V2 report arXiv:2405.04434 section 2.1; HF
            ``DeepseekV3Attention``) and the KV cache holds a latent of this width per token.
        q_lora_rank: MLA only: width of the query's low-rank path (``None``: a plain
            ``q_proj``).
        qk_rope_head_dim: MLA only: the rotated (RoPE) part of each query/key head, shared by
            all heads on the key side; ``head_dim`` equals it (as in HF ``DeepseekV3Config``).
        qk_nope_head_dim: MLA only: the un-rotated part of each query/key head.
        v_head_dim: MLA only: width of each value head.
        rope_scaling: ``None`` for plain RoPE, or a dict with ``rope_type`` (``"linear"``,
            ``"llama3"``, ``"yarn"``) and that type's keys, as in HF ``rope_parameters``
            without ``rope_theta`` (see :mod:`tokenflow.model.rope`).

    Fields of other families (counted by :mod:`tokenflow.analysis.costmodel`; the shared model
    builds only their defaults, :meth:`fields_not_built` lists the rest):
        attention_bias: bias on ``q/k/v_proj`` (HF Llama/Qwen3/gpt-oss ``attention_bias``,
            Qwen2 always, GPT-2 ``c_attn``). attention_out_bias: bias on ``o_proj``.
        qk_norm: an RMSNorm ``[D]`` on each query and key head (Qwen3 ``q_norm``/``k_norm``).
        attention_sinks: one learned logit per query head (gpt-oss ``sinks``).
        sliding_window: W, tokens a sliding-window layer attends to (and caches).
        layer_types: per layer ``"full_attention"`` or ``"sliding_attention"`` (HF
            ``layer_types``); ``None``: every layer sliding when ``sliding_window`` is set
            (Mistral), else every layer full.
        gated_mlp: FFN is SwiGLU (gate, up, down); ``False``: two matrices and GELU (GPT-2/3).
        mlp_bias: biases on the FFN and expert matrices (gpt-oss experts, GPT-2, Llama
            ``mlp_bias``).
        norm_type: ``"rmsnorm"`` (weight) or ``"layernorm"`` (weight and bias, GPT-2/3).
        position_embedding_type: ``"rope"`` or ``"absolute"`` (a learned table
            ``[max_position_embeddings, H]``, GPT-2/3).
        router_bias: the router has a bias ``[E]`` (gpt-oss).
        shared_expert_gate: a ``Linear(H, 1)`` sigmoid gate on the shared expert (Qwen2-MoE).
        moe_layer_freq: layer ``i >= first_k_dense_replace`` is MoE when
            ``i % moe_layer_freq == 0`` (DeepSeek-V2/V3 ``moe_layer_freq``).
        num_nextn_predict_layers: DeepSeek-V3 multi-token-prediction modules (not part of the
            main model; counted apart by :func:`tokenflow.analysis.costmodel.param_breakdown`).
        unsupported_fields: names of HF fields dropped by ``from_hf_config(...,
            allow_unsupported=True)``; every count that could depend on them refuses.

    Raises:
        ValueError: on any inconsistent field, naming the field and the allowed range.
        TypeError: when an integer field is not an int.
    """

    vocab_size: int = 512
    hidden_size: int = 64
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int | None = None
    intermediate_size: int = 128
    moe_intermediate_size: int = 64
    num_experts: int = 8
    num_experts_per_tok: int = 2
    num_shared_experts: int = 1
    first_k_dense_replace: int = 0
    scoring_func: str = "softmax"
    norm_topk_prob: bool = True
    routed_scaling_factor: float = 1.0
    n_group: int = 1
    topk_group: int = 1
    topk_method: str = "noaux_tc"
    max_position_embeddings: int = 128
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = False
    hidden_act: str = "silu"
    pad_token_id: int = 0
    bos_token_id: int = 1
    eos_token_id: int | tuple[int, ...] | None = 2
    q_lora_rank: int | None = None
    kv_lora_rank: int | None = None
    qk_rope_head_dim: int | None = None
    qk_nope_head_dim: int | None = None
    v_head_dim: int | None = None
    rope_scaling: dict | None = None
    attention_bias: bool = False
    attention_out_bias: bool = False
    qk_norm: bool = False
    attention_sinks: bool = False
    sliding_window: int | None = None
    layer_types: tuple | None = None
    gated_mlp: bool = True
    mlp_bias: bool = False
    norm_type: str = "rmsnorm"
    position_embedding_type: str = "rope"
    router_bias: bool = False
    shared_expert_gate: bool = False
    moe_layer_freq: int = 1
    num_nextn_predict_layers: int = 0
    unsupported_fields: tuple = ()
    name: str = field(default="custom", compare=False)

    def __post_init__(self) -> None:
        if isinstance(self.layer_types, list):
            self.layer_types = tuple(self.layer_types)
        if isinstance(self.unsupported_fields, list):
            self.unsupported_fields = tuple(self.unsupported_fields)
        if isinstance(self.eos_token_id, list):          # from JSON (to_dict, config.json)
            self.eos_token_id = tuple(self.eos_token_id)
        if self.head_dim is None and self.kv_lora_rank is not None:
            self.head_dim = self.qk_rope_head_dim          # HF DeepseekV3Config's convention
        if self.head_dim is None:
            integer("num_attention_heads", self.num_attention_heads, 1)
            if self.hidden_size % self.num_attention_heads != 0:
                raise ValueError(
                    f"hidden_size ({self.hidden_size}) must be divisible by num_attention_heads "
                    f"({self.num_attention_heads}) when head_dim is not given")
            self.head_dim = self.hidden_size // self.num_attention_heads
        self.validate()

    def validate(self) -> None:
        """Check every field; raise ``ValueError``/``TypeError`` naming the first bad one."""
        self._validate_mla()                   # first: head_dim is derived from qk_rope_head_dim
        ints_ge1 = ["vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                    "num_key_value_heads", "head_dim", "intermediate_size",
                    "moe_intermediate_size", "max_position_embeddings", "n_group", "topk_group"]
        ints_ge0 = ["num_experts", "num_experts_per_tok", "num_shared_experts",
                    "first_k_dense_replace", "num_nextn_predict_layers"]
        ints_ge1.append("moe_layer_freq")
        for name in ints_ge1 + ints_ge0:
            integer(name, getattr(self, name), 1 if name in ints_ge1 else 0)
        if self.num_attention_heads % self.num_key_value_heads != 0:
            raise ValueError(
                f"num_key_value_heads ({self.num_key_value_heads}) must divide "
                f"num_attention_heads ({self.num_attention_heads})")
        if self.head_dim % 2 != 0:
            raise ValueError(f"head_dim must be even for RoPE, got {self.head_dim}")
        if self.num_experts > 0:
            integer("num_experts_per_tok", self.num_experts_per_tok, 1, self.num_experts,
                    hi_name="num_experts")
            if self.num_experts % self.n_group != 0:
                raise ValueError(
                    f"n_group ({self.n_group}) must divide num_experts ({self.num_experts})")
            integer("topk_group", self.topk_group, 1, self.n_group, hi_name="n_group")
            if self.n_group > 1 and self.topk_group * (self.num_experts // self.n_group) < \
                    self.num_experts_per_tok:
                raise ValueError(
                    "topk_group * (num_experts // n_group) must be >= num_experts_per_tok, got "
                    f"{self.topk_group} * {self.num_experts // self.n_group} < "
                    f"{self.num_experts_per_tok}")
        choice("scoring_func", self.scoring_func, SCORING_FUNCS)
        choice("topk_method", self.topk_method, TOPK_METHODS)
        number("rope_theta", self.rope_theta, 0, lo_open=True)
        number("rms_norm_eps", self.rms_norm_eps, 0, lo_open=True)
        if not isinstance(self.hidden_act, str):
            raise TypeError(f"hidden_act must be a str, got {self.hidden_act!r}")
        choice("hidden_act", self.hidden_act, set(HIDDEN_ACTS))
        self._validate_rope_scaling()
        self._validate_structure()
        for name in ("pad_token_id", "bos_token_id"):
            token_id_list(name, getattr(self, name), self.vocab_size)
        self._validate_eos()

    def _validate_eos(self) -> None:
        eos = self.eos_token_id
        if eos is None:
            return
        if isinstance(eos, tuple):
            if not eos:
                raise ValueError("eos_token_id must be an int, a non-empty tuple of ints or "
                                 "None (no end-of-sequence token), got ()")
            ids = eos
        else:
            ids = (eos,)
        try:
            token_id_list("eos_token_id", ids, self.vocab_size)
        except ArgTypeError:
            raise ArgTypeError(f"eos_token_id must be an int, a tuple of ints or None, "
                               f"got {eos!r}") from None
        except ValueError as e:
            raise ValueError(f"{e}" + (f" in {eos!r}" if isinstance(eos, tuple) else "")
                             ) from None

    def _validate_mla(self) -> None:
        mla = ("kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim")
        if self.kv_lora_rank is None:
            for name in mla[1:] + ("q_lora_rank",):
                if getattr(self, name) is not None:
                    raise ValueError(f"{name} is an MLA field: set kv_lora_rank too, or leave "
                                     f"{name}=None for grouped-query attention")
            return
        for name in mla + (("q_lora_rank",) if self.q_lora_rank is not None else ()):
            integer(name, getattr(self, name), 1)
        if self.qk_rope_head_dim % 2:
            raise ValueError(f"qk_rope_head_dim must be even for RoPE, got "
                             f"{self.qk_rope_head_dim}")
        if self.head_dim != self.qk_rope_head_dim:
            raise ValueError(f"head_dim must equal qk_rope_head_dim for MLA (the rotated slice, "
                             f"as in HF DeepseekV3Config), got head_dim={self.head_dim}, "
                             f"qk_rope_head_dim={self.qk_rope_head_dim}")

    def _validate_structure(self) -> None:
        for name in ("attention_bias", "attention_out_bias", "qk_norm", "attention_sinks",
                     "gated_mlp", "mlp_bias", "router_bias", "shared_expert_gate"):
            boolean(name, getattr(self, name))
        for name, allowed in (("norm_type", NORM_TYPES),
                              ("position_embedding_type", POSITION_TYPES)):
            choice(name, getattr(self, name), allowed)
        w = integer("sliding_window", self.sliding_window, 1, none=True)
        lt = self.layer_types
        if lt is not None:
            if len(lt) != self.num_hidden_layers or not set(lt) <= set(LAYER_TYPES):
                raise ValueError(f"layer_types must list {self.num_hidden_layers} values from "
                                 f"{LAYER_TYPES}, got {list(lt)!r}")
            if "sliding_attention" in lt and w is None:
                raise ValueError("sliding_window must be set when layer_types has "
                                 "'sliding_attention' layers")
        if self.is_mla and (self.attention_bias or self.attention_out_bias):
            raise ValueError("attention_bias is not modelled for MLA attention")
        if not isinstance(self.unsupported_fields, tuple):
            raise TypeError(f"unsupported_fields must be a tuple of field names, got "
                            f"{self.unsupported_fields!r}")

    def _validate_rope_scaling(self) -> None:
        s = self.rope_scaling
        if s is None:
            return
        if not isinstance(s, dict) or s.get("rope_type") not in ROPE_TYPES:
            got = s.get("rope_type") if isinstance(s, dict) else s
            raise ValueError(f"rope_scaling['rope_type'] must be one of {sorted(ROPE_TYPES)}, "
                             f"got {got!r}")
        for key in ROPE_TYPES[s["rope_type"]]:
            if key not in s:
                raise ValueError(f"rope_scaling['{key}'] is required for rope_type "
                                 f"{s['rope_type']!r}")
        f = s.get("factor")
        number("rope_scaling['factor']", f, 1, none=True)
        if s["rope_type"] == "yarn" and f is None and \
                self.max_position_embeddings < s["original_max_position_embeddings"]:
            raise ValueError("rope_scaling['factor'] is missing and max_position_embeddings < "
                             "original_max_position_embeddings (derived factor < 1)")

    # ------------------------------------------------------------------ helpers
    @property
    def is_mla(self) -> bool:
        """True when attention is multi-head latent attention (``kv_lora_rank`` is set)."""
        return self.kv_lora_rank is not None

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        """Every end-of-sequence id as a tuple of ints: ``(eos_token_id,)`` for one id, the
        tuple itself for several (generation stops at any), ``()`` when ``eos_token_id`` is
        ``None``."""
        eos = self.eos_token_id
        if eos is None:
            return ()
        return tuple(eos) if isinstance(eos, tuple) else (eos,)

    @property
    def is_moe(self) -> bool:
        """True when at least one layer routes tokens to experts (:meth:`layer_is_moe`):
        False for ``num_experts == 0``, for ``first_k_dense_replace >= num_hidden_layers``
        and when no layer from ``first_k_dense_replace`` on is a multiple of
        ``moe_layer_freq``."""
        return any(self.layer_is_moe(i) for i in range(self.num_hidden_layers))

    def _check_layer(self, layer_idx) -> None:
        index("layer_idx", layer_idx, self.num_hidden_layers, "num_hidden_layers")

    def layer_is_moe(self, layer_idx: int) -> bool:
        """True when decoder block ``layer_idx`` uses the MoE feed-forward: ``num_experts > 0``,
        ``layer_idx >= first_k_dense_replace`` and ``layer_idx % moe_layer_freq == 0``
        (HF ``DeepseekV2DecoderLayer``'s rule).

        Raises:
            ValueError: ``layer_idx`` outside ``[0, num_hidden_layers)``.
        """
        self._check_layer(layer_idx)
        return self.num_experts > 0 and layer_idx >= self.first_k_dense_replace and \
            layer_idx % self.moe_layer_freq == 0

    def layer_is_sliding(self, layer_idx: int) -> bool:
        """True when decoder block ``layer_idx`` attends to (and caches) only the last
        ``sliding_window`` tokens.

        Raises:
            ValueError: ``layer_idx`` outside ``[0, num_hidden_layers)``.
        """
        self._check_layer(layer_idx)
        if self.layer_types is not None:
            return self.layer_types[layer_idx] == "sliding_attention"
        return self.sliding_window is not None

    def fields_not_built(self) -> list[str]:
        """Fields whose value the shared model's modules do not build (they are for the cost
        model): non-default structure fields and any ``unsupported_fields``.
        :class:`~tokenflow.model.transformer.TokenFlowModel` refuses a config with any."""
        out = [f.name for f in dataclasses.fields(self) if f.name in _COST_ONLY
               and getattr(self, f.name) != f.default]
        return out + list(self.unsupported_fields)

    def replace(self, **changes: Any) -> "ModelConfig":
        """A validated copy with some fields changed (``head_dim`` is re-derived if not given)."""
        d = asdict(self)
        if "head_dim" not in changes and ({"hidden_size", "num_attention_heads",
                                           "qk_rope_head_dim", "kv_lora_rank"} & set(changes)):
            d["head_dim"] = None
        d.update(changes)
        return ModelConfig(**d)

    def to_dict(self) -> dict:
        """Plain dict of all fields (JSON-serialisable)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "ModelConfig":
        """Inverse of :meth:`to_dict`; unknown keys raise ``TypeError`` naming them."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise TypeError(f"unknown ModelConfig fields: {unknown}")
        return cls(**d)

    @classmethod
    def from_hf_config(cls, hf: Any, *, allow_unsupported: bool = False,
                       **overrides: Any) -> "ModelConfig":
        """Build a config from a Hugging Face ``config.json`` dict or ``transformers`` config.

        The one parser of HF configs (``tokenflow.interop.from_hf_config`` is this function;
        the reading itself is :func:`tokenflow.config.hf_config.parse_hf_config`). Families
        (``model_type``): llama, mistral, qwen2, qwen3, mixtral, qwen2_moe, qwen3_moe,
        deepseek_v2, deepseek_v3, gpt_oss, gpt2 (GPT-2/GPT-3 style); a dict without
        ``model_type`` is read with HF's Llama field names. Every field that changes
        parameter counts, KV-cache bytes or FLOPs is kept (RoPE scaling, sliding windows,
        biases, shared expert gate, ...); metadata and training knobs are ignored.

        Args:
            hf: the ``config.json`` dict or a ``transformers.PretrainedConfig``.
            allow_unsupported: ``False`` (default) raises on a field we cannot express;
                ``True`` drops it and records its name in ``unsupported_fields`` (counts
                then refuse, shapes and routing fields stay usable).
            overrides: fields to set on the result.

        Raises:
            ValueError: a field or value we cannot express, naming it (e.g. DeepSeek-V4's
                ``o_groups``, ``rope_type 'dynamic'``, ``decoder_sparse_step``), or an
                inconsistent resulting config.
        """
        d = dict(hf.to_dict() if hasattr(hf, "to_dict") else hf)
        kw = parse_hf_config(d, allow_unsupported=allow_unsupported)
        kw.update(overrides)
        return cls(**kw)


_COST_ONLY = ("attention_bias", "attention_out_bias", "qk_norm", "attention_sinks",
              "sliding_window", "layer_types", "gated_mlp", "mlp_bias", "norm_type",
              "position_embedding_type", "router_bias", "shared_expert_gate", "moe_layer_freq")


PRESETS: dict[str, dict] = {
    # The shared tiny model every chapter loads: 3 blocks, the first dense, the others MoE with
    # 8 routed experts (top-2) and 1 shared expert. 4 query heads share 2 KV heads of head_dim
    # 32: the smallest head size vLLM's CPU attention takes (hidden = heads x head_dim, as
    # vLLM's Qwen2-MoE derives it). Trained by ``python -m tokenflow.train``.
    "tiny": dict(vocab_size=512, hidden_size=128, num_hidden_layers=3, num_attention_heads=4,
                 num_key_value_heads=2, intermediate_size=384, moe_intermediate_size=128,
                 num_experts=8, num_experts_per_tok=2, num_shared_experts=1,
                 first_k_dense_replace=1, max_position_embeddings=128, name="tiny"),
    # Same shape, dense FFN everywhere (maps onto LlamaForCausalLM).
    "tiny-dense": dict(vocab_size=512, hidden_size=128, num_hidden_layers=3,
                       num_attention_heads=4, num_key_value_heads=2, intermediate_size=384,
                       num_experts=0, num_experts_per_tok=0, num_shared_experts=0,
                       max_position_embeddings=128, name="tiny-dense"),
    # A larger preset for benchmarks (hidden 512, 8 layers, Mixtral-style MoE).
    "small-moe": dict(vocab_size=512, hidden_size=512, num_hidden_layers=8,
                      num_attention_heads=8, num_key_value_heads=4, intermediate_size=1024,
                      moe_intermediate_size=512, num_experts=8, num_experts_per_tok=2,
                      num_shared_experts=0, max_position_embeddings=2048, name="small-moe"),
    "small-dense": dict(vocab_size=512, hidden_size=512, num_hidden_layers=8,
                        num_attention_heads=8, num_key_value_heads=4, intermediate_size=1024,
                        num_experts=0, num_experts_per_tok=0, num_shared_experts=0,
                        max_position_embeddings=2048, name="small-dense"),
}


def preset(name: str, **overrides: Any) -> ModelConfig:
    """Return the named preset (``tiny``, ``tiny-dense``, ``small-moe``, ``small-dense``).

    Raises:
        ValueError: if ``name`` is not a preset.
    """
    choice("preset name", name, set(PRESETS))
    d = dict(PRESETS[name])
    d.update(overrides)
    return ModelConfig(**d)
