"""The model configuration: one dataclass with Hugging Face field names.

Shape letters used across the package: B batch, S sequence, T tokens (B*S), H hidden,
V vocab, E experts, K top-k, D head_dim.

Field names follow the ``config.json`` files that Hugging Face transformers reads
(``LlamaConfig``, ``MixtralConfig``, ``DeepseekV3Config``), so a reader can lay our tiny
config next to a real one (see ``tokenflow/data/models.json`` in the package, where every
config names its sources, and :func:`tokenflow.costmodel.reference_config`).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field, asdict
from typing import Any

__all__ = ["ModelConfig", "PRESETS", "preset"]

_SCORING = ("softmax", "sigmoid")


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
        max_position_embeddings: longest sequence (prompt + generated) the model accepts.
        rope_theta: RoPE base frequency.
        rms_norm_eps: epsilon in RMSNorm.
        tie_word_embeddings: share the embedding table with the LM head.
        pad_token_id, bos_token_id, eos_token_id: special token ids.
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
            without ``rope_theta`` (see :mod:`tokenflow.rope`).

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
    max_position_embeddings: int = 128
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = False
    pad_token_id: int = 0
    bos_token_id: int = 1
    eos_token_id: int = 2
    q_lora_rank: int | None = None
    kv_lora_rank: int | None = None
    qk_rope_head_dim: int | None = None
    qk_nope_head_dim: int | None = None
    v_head_dim: int | None = None
    rope_scaling: dict | None = None
    name: str = field(default="custom", compare=False)

    def __post_init__(self) -> None:
        if self.head_dim is None and self.kv_lora_rank is not None:
            self.head_dim = self.qk_rope_head_dim          # HF DeepseekV3Config's convention
        if self.head_dim is None:
            if not isinstance(self.num_attention_heads, int) or self.num_attention_heads < 1:
                raise ValueError(
                    f"num_attention_heads must be an int >= 1, got {self.num_attention_heads!r}")
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
                    "first_k_dense_replace"]
        for name in ints_ge1 + ints_ge0:
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int):
                raise TypeError(f"{name} must be an int, got {type(v).__name__} {v!r}")
            lo = 1 if name in ints_ge1 else 0
            if v < lo:
                raise ValueError(f"{name} must be >= {lo}, got {v}")
        if self.num_attention_heads % self.num_key_value_heads != 0:
            raise ValueError(
                f"num_key_value_heads ({self.num_key_value_heads}) must divide "
                f"num_attention_heads ({self.num_attention_heads})")
        if self.head_dim % 2 != 0:
            raise ValueError(f"head_dim must be even for RoPE, got {self.head_dim}")
        if self.num_experts > 0:
            if not 1 <= self.num_experts_per_tok <= self.num_experts:
                raise ValueError(
                    f"num_experts_per_tok must be in [1, num_experts={self.num_experts}], "
                    f"got {self.num_experts_per_tok}")
            if self.num_experts % self.n_group != 0:
                raise ValueError(
                    f"n_group ({self.n_group}) must divide num_experts ({self.num_experts})")
            if not 1 <= self.topk_group <= self.n_group:
                raise ValueError(
                    f"topk_group must be in [1, n_group={self.n_group}], got {self.topk_group}")
            if self.n_group > 1 and self.topk_group * (self.num_experts // self.n_group) < \
                    self.num_experts_per_tok:
                raise ValueError(
                    "topk_group * (num_experts // n_group) must be >= num_experts_per_tok, got "
                    f"{self.topk_group} * {self.num_experts // self.n_group} < "
                    f"{self.num_experts_per_tok}")
        if self.scoring_func not in _SCORING:
            raise ValueError(f"scoring_func must be one of {_SCORING}, got {self.scoring_func!r}")
        if self.rope_theta <= 0:
            raise ValueError(f"rope_theta must be > 0, got {self.rope_theta}")
        if self.rms_norm_eps <= 0:
            raise ValueError(f"rms_norm_eps must be > 0, got {self.rms_norm_eps}")
        self._validate_rope_scaling()
        for name in ("pad_token_id", "bos_token_id", "eos_token_id"):
            v = getattr(self, name)
            if not 0 <= v < self.vocab_size:
                raise ValueError(f"{name} must be in [0, vocab_size={self.vocab_size}), got {v}")

    def _validate_mla(self) -> None:
        mla = ("kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim")
        if self.kv_lora_rank is None:
            for name in mla[1:] + ("q_lora_rank",):
                if getattr(self, name) is not None:
                    raise ValueError(f"{name} is an MLA field: set kv_lora_rank too, or leave "
                                     f"{name}=None for grouped-query attention")
            return
        for name in mla + (("q_lora_rank",) if self.q_lora_rank is not None else ()):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be an int >= 1 for MLA, got {v!r}")
        if self.qk_rope_head_dim % 2:
            raise ValueError(f"qk_rope_head_dim must be even for RoPE, got "
                             f"{self.qk_rope_head_dim}")
        if self.head_dim != self.qk_rope_head_dim:
            raise ValueError(f"head_dim must equal qk_rope_head_dim for MLA (the rotated slice, "
                             f"as in HF DeepseekV3Config), got head_dim={self.head_dim}, "
                             f"qk_rope_head_dim={self.qk_rope_head_dim}")

    def _validate_rope_scaling(self) -> None:
        s = self.rope_scaling
        if s is None:
            return
        from .rope import ROPE_TYPES
        if not isinstance(s, dict) or s.get("rope_type") not in ROPE_TYPES:
            got = s.get("rope_type") if isinstance(s, dict) else s
            raise ValueError(f"rope_scaling['rope_type'] must be one of {sorted(ROPE_TYPES)}, "
                             f"got {got!r}")
        for key in ROPE_TYPES[s["rope_type"]]:
            if key not in s:
                raise ValueError(f"rope_scaling['{key}'] is required for rope_type "
                                 f"{s['rope_type']!r}")
        f = s.get("factor")
        if f is not None and (isinstance(f, bool) or not isinstance(f, (int, float)) or f < 1):
            raise ValueError(f"rope_scaling['factor'] must be a number >= 1, got {f!r}")
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
    def is_moe(self) -> bool:
        """True when at least one layer routes tokens to experts."""
        return self.num_experts > 0 and self.first_k_dense_replace < self.num_hidden_layers

    def layer_is_moe(self, layer_idx: int) -> bool:
        """True when decoder block ``layer_idx`` uses the MoE feed-forward."""
        return self.num_experts > 0 and layer_idx >= self.first_k_dense_replace

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
    def from_hf_config(cls, hf: Any, **overrides: Any) -> "ModelConfig":
        """Build a config from a Hugging Face ``config.json`` dict or ``transformers`` config.

        The one parser of HF configs (``tokenflow.interop.from_hf_config`` is this function).
        Understands Llama / Mistral (dense), Mixtral (``num_local_experts``), Qwen2-MoE
        (``num_experts``; ``shared_expert_intermediate_size`` as a multiple of
        ``moe_intermediate_size``; ``mlp_only_layers`` as the first dense layers) and
        DeepSeek-V3 (``n_routed_experts``, ``n_shared_experts``, ``scoring_func``, ``n_group``;
        MLA when ``kv_lora_rank`` is given). RoPE: ``rope_theta`` at the top level or inside
        ``rope_parameters`` (transformers 5) / ``rope_scaling`` (older files), whose
        ``rope_type`` (or legacy ``type``) may be default, linear, llama3 or yarn. Special
        token ids: a list of EOS ids keeps the first; a missing id becomes 0. Fields with no
        meaning in the source family get canonical values (a dense config gets
        ``moe_intermediate_size = intermediate_size``).

        Raises:
            ValueError: a RoPE type we do not implement (naming ``rope_type``), MLA head dims
                that do not add up (``qk_head_dim``), a Qwen2-MoE shared expert width that is
                not a multiple of ``moe_intermediate_size``, MoE layers that are not "the first
                k dense, the rest MoE", or an inconsistent resulting config.
        """
        d = dict(hf.to_dict() if hasattr(hf, "to_dict") else hf)
        g = d.get
        n_heads, hidden = g("num_attention_heads"), g("hidden_size")
        experts = g("num_local_experts") or g("n_routed_experts") or g("num_experts") or 0
        arch = g("architectures")
        arch = arch[0] if isinstance(arch, list) and arch else ""
        mixtral_like = "num_local_experts" in d or "Mixtral" in arch
        kw = dict(
            vocab_size=g("vocab_size"), hidden_size=hidden,
            num_hidden_layers=g("num_hidden_layers"), num_attention_heads=n_heads,
            num_key_value_heads=g("num_key_value_heads") or n_heads,
            head_dim=g("head_dim") or (None if g("kv_lora_rank") else hidden // n_heads),
            intermediate_size=g("intermediate_size"),
            moe_intermediate_size=g("moe_intermediate_size") or g("intermediate_size"),
            num_experts=int(experts),
            num_experts_per_tok=(g("num_experts_per_tok") or 2) if experts else 0,
            num_shared_experts=(g("n_shared_experts") or 0) if experts else 0,
            first_k_dense_replace=g("first_k_dense_replace") or 0,
            scoring_func=g("scoring_func") or ("sigmoid" if g("model_type") == "deepseek_v3"
                                               else "softmax"),   # HF's V3 router: sigmoid
            norm_topk_prob=True if mixtral_like else bool(g("norm_topk_prob", False)),
            routed_scaling_factor=float(g("routed_scaling_factor") or 1.0),
            n_group=g("n_group") or 1, topk_group=g("topk_group") or 1,
            max_position_embeddings=g("max_position_embeddings") or 2048,
            rms_norm_eps=float(g("rms_norm_eps") or 1e-6),
            tie_word_embeddings=bool(g("tie_word_embeddings", False)))
        kw.update(_rope_from_hf(d), **_mla_from_hf(d), **_qwen2_moe_from_hf(d),
                  **_special_tokens_from_hf(d))
        kw.update(overrides)
        return cls(**kw)


def _rope_from_hf(d: dict) -> dict:
    """``rope_theta`` and ``rope_scaling`` from either spelling of HF's RoPE settings."""
    rope = dict(d.get("rope_parameters") or d.get("rope_scaling") or {})
    theta = rope.pop("rope_theta", None) or d.get("rope_theta") or 10000.0
    kind = rope.pop("rope_type", None) or rope.pop("type", None) or "default"
    rope.pop("type", None)
    if rope.pop("partial_rotary_factor", 1.0) != 1.0:
        raise ValueError("partial_rotary_factor != 1 is not implemented (rope_parameters)")
    from .rope import ROPE_TYPES
    if kind not in ROPE_TYPES:
        raise ValueError(f"rope_type {kind!r} is not implemented (supported: "
                         f"{sorted(ROPE_TYPES)})")
    if kind in ("llama3", "yarn"):           # HF's default (standardize_rope_params)
        rope.setdefault("original_max_position_embeddings", d.get("max_position_embeddings"))
    scaling = None if kind == "default" else {"rope_type": kind, **rope}
    return dict(rope_theta=float(theta), rope_scaling=scaling)


def _mla_from_hf(d: dict) -> dict:
    """The MLA fields of a DeepSeek-V2/V3 config (empty for other families)."""
    if d.get("kv_lora_rank") is None:
        return {}
    names = ("q_lora_rank", "kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim",
             "v_head_dim")
    out = {n: d.get(n) for n in names}
    qk = d.get("qk_head_dim")
    if qk is not None and out["qk_nope_head_dim"] is not None \
            and out["qk_rope_head_dim"] is not None \
            and qk != out["qk_nope_head_dim"] + out["qk_rope_head_dim"]:
        raise ValueError(f"qk_head_dim ({qk}) must equal qk_nope_head_dim + qk_rope_head_dim "
                         f"({out['qk_nope_head_dim']} + {out['qk_rope_head_dim']})")
    return out


def _qwen2_moe_from_hf(d: dict) -> dict:
    """Qwen2-MoE's shared expert width and dense layers as our fields."""
    if d.get("model_type") != "qwen2_moe" or not d.get("num_experts"):
        return {}
    moe_i, shared_i = d["moe_intermediate_size"], d.get("shared_expert_intermediate_size", 0)
    if shared_i % moe_i:
        raise ValueError(f"shared_expert_intermediate_size ({shared_i}) must be a multiple "
                         f"of moe_intermediate_size ({moe_i})")
    dense = sorted(d.get("mlp_only_layers") or [])
    if dense != list(range(len(dense))) or d.get("decoder_sparse_step", 1) != 1:
        raise ValueError("only 'first k layers dense, the rest MoE' is modelled, got "
                         f"mlp_only_layers={dense}, "
                         f"decoder_sparse_step={d.get('decoder_sparse_step')}")
    return dict(num_shared_experts=shared_i // moe_i, first_k_dense_replace=len(dense))


def _special_tokens_from_hf(d: dict) -> dict:
    eos = d.get("eos_token_id")
    if isinstance(eos, (list, tuple)):
        eos = eos[0] if eos else None
    ids = (("pad_token_id", d.get("pad_token_id")), ("bos_token_id", d.get("bos_token_id")),
           ("eos_token_id", eos))
    return {name: int(v) if v is not None else 0 for name, v in ids}


PRESETS: dict[str, dict] = {
    # The shared tiny model every chapter loads: 2 blocks, first dense, second MoE with
    # 8 routed experts (top-2) and 1 shared expert. Trained by ``python -m tokenflow.train``.
    "tiny": dict(vocab_size=512, hidden_size=64, num_hidden_layers=3, num_attention_heads=4,
                 num_key_value_heads=2, intermediate_size=192, moe_intermediate_size=64,
                 num_experts=8, num_experts_per_tok=2, num_shared_experts=1,
                 first_k_dense_replace=1, max_position_embeddings=128, name="tiny"),
    # Same shape, dense FFN everywhere (maps onto LlamaForCausalLM).
    "tiny-dense": dict(vocab_size=512, hidden_size=64, num_hidden_layers=3,
                       num_attention_heads=4, num_key_value_heads=2, intermediate_size=192,
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
    if name not in PRESETS:
        raise ValueError(f"preset name must be one of {sorted(PRESETS)}, got {name!r}")
    d = dict(PRESETS[name])
    d.update(overrides)
    return ModelConfig(**d)
