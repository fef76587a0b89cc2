"""Read a Hugging Face ``config.json`` into :class:`~tokenflow.config.ModelConfig` fields.

The one parser of HF configs: :meth:`ModelConfig.from_hf_config` and
``tokenflow.interop.from_hf_config`` both call :func:`parse_hf_config`. It reads the
families below (``model_type``; the field names of ``transformers`` 5.x
``models/<family>/configuration_<family>.py``) and keeps every field that changes a
parameter count, KV-cache bytes or FLOPs. Metadata and training knobs (dropout, aux-loss
coefficients, ``quantization_config``: the weight dtype is an argument of the memory
functions) are ignored by name; any other field with a value raises ``ValueError`` naming it,
instead of being dropped and miscounted. A field a config of a listed ``model_type`` omits
takes the default of that family's ``transformers`` config class (:data:`_HF_DEFAULTS`), as
``AutoConfig`` would give it; a dict without ``model_type`` is our own format (the bundled
reference configs) and keeps the parser's generic defaults.

==============  ==================================================================
model_type      what is read beyond the Llama fields
==============  ==================================================================
llama           ``attention_bias`` (q, k, v, o), ``mlp_bias``
mistral         ``sliding_window`` (every layer)
qwen2, qwen3    q/k/v bias (Qwen2 always; Qwen3 ``attention_bias``), Qwen3 q/k norms,
                ``use_sliding_window`` / ``max_window_layers`` / ``layer_types`` (the
                per-family rules of HF, see ``_windows``)
mixtral         ``num_local_experts``, renormalised top-k, ``sliding_window``
qwen2_moe       ``num_experts``, shared expert (``shared_expert_intermediate_size``) and
                its gate, ``qkv_bias``, ``mlp_only_layers``, ``decoder_sparse_step == 1``
qwen3_moe       as qwen2_moe without the shared expert, with q/k norms
deepseek_v2/v3  MLA fields, ``n_routed_experts``, ``n_shared_experts``, ``n_group`` /
                ``topk_group``, ``first_k_dense_replace``, ``moe_layer_freq``,
                ``scoring_func``, ``num_nextn_predict_layers`` (MTP, counted apart)
gpt_oss         attention biases and sinks, router bias, expert biases,
                ``layer_types`` with ``sliding_window``
gpt2            ``n_embd``/``n_layer``/``n_head``/``n_positions``/``n_inner``: learned
                positions, LayerNorm, 2-matrix GELU FFN ``4H``, biases, tied head
(none)          HF Llama field names (``reference_models()`` entries)
==============  ==================================================================
"""
from __future__ import annotations

from .choices import HIDDEN_ACTS, ROPE_TYPES

__all__ = ["parse_hf_config", "FAMILIES"]

FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "mixtral", "qwen2_moe", "qwen3_moe",
            "deepseek_v2", "deepseek_v3", "gpt_oss", "gpt2")
"""``model_type`` values :func:`parse_hf_config` reads."""

_IGNORED = frozenset("""
_name_or_path architectures model_type dtype torch_dtype transformers_version auto_map
initializer_range initializer_factor use_cache attention_dropout hidden_dropout embd_pdrop
attn_pdrop resid_pdrop output_attentions output_hidden_states return_dict problem_type id2label
label2id chunk_size_feed_forward router_aux_loss_coef output_router_logits router_jitter_noise
aux_loss_alpha seq_aux pretraining_tp rope_interleave
swiglu_limit swiglu_alpha quantization_config ep_size scale_attn_weights
scale_attn_by_inverse_layer_idx reorder_and_upcast_attn n_ctx initial_context_length
tokenizer_class use_bfloat16 torchscript tf_legacy_loss pruned_heads tie_encoder_decoder
is_decoder finetuning_task prefix task_specific_params decoder_start_token_id sep_token_id
is_encoder_decoder add_cross_attention bos_token_id eos_token_id pad_token_id
""".split())
"""Fields that change no count, memory or FLOPs (metadata, dropout, training knobs,
``quantization_config``). ``is_encoder_decoder`` and
``add_cross_attention`` are checked to be false."""
_IGNORED_PREFIXES = ("summary_",)
_GPT2_NAMES = {"n_embd": "hidden_size", "n_layer": "num_hidden_layers",
               "n_head": "num_attention_heads", "n_positions": "max_position_embeddings",
               "n_inner": "intermediate_size", "layer_norm_epsilon": "rms_norm_eps",
               "activation_function": "hidden_act"}


_LLAMA_SHAPE = dict(vocab_size=32000, hidden_size=4096, intermediate_size=11008,
                    num_hidden_layers=32, num_attention_heads=32)
_QWEN_SHAPE = dict(vocab_size=151936, hidden_size=4096, intermediate_size=22016,
                   num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=32,
                   max_position_embeddings=32768)
_QWEN_WINDOW = dict(use_sliding_window=False, sliding_window=4096, max_window_layers=28)
_HF_DEFAULTS = {
    "llama": dict(**_LLAMA_SHAPE, max_position_embeddings=2048, rms_norm_eps=1e-6,
                  attention_bias=False, mlp_bias=False, bos_token_id=1, eos_token_id=2),
    "mistral": dict(_LLAMA_SHAPE, intermediate_size=14336, num_key_value_heads=8,
                    max_position_embeddings=131072, rms_norm_eps=1e-6, sliding_window=4096,
                    bos_token_id=1, eos_token_id=2),
    "qwen2": dict(**_QWEN_SHAPE, **_QWEN_WINDOW, rms_norm_eps=1e-6),
    "qwen3": dict(**_QWEN_SHAPE, **_QWEN_WINDOW, head_dim=128, rms_norm_eps=1e-6,
                  attention_bias=False),
    "mixtral": dict(_LLAMA_SHAPE, intermediate_size=14336, num_key_value_heads=8,
                    max_position_embeddings=131072, rms_norm_eps=1e-5, num_local_experts=8,
                    num_experts_per_tok=2, bos_token_id=1, eos_token_id=2),
    "qwen2_moe": dict(vocab_size=151936, hidden_size=2048, intermediate_size=5632,
                      num_hidden_layers=24, num_attention_heads=16, num_key_value_heads=16,
                      max_position_embeddings=32768, rms_norm_eps=1e-6, **_QWEN_WINDOW,
                      decoder_sparse_step=1, moe_intermediate_size=1408,
                      shared_expert_intermediate_size=5632, num_experts_per_tok=4,
                      num_experts=60, norm_topk_prob=False, qkv_bias=True),
    "qwen3_moe": dict(vocab_size=151936, hidden_size=2048, intermediate_size=6144,
                      num_hidden_layers=24, num_attention_heads=32, num_key_value_heads=4,
                      max_position_embeddings=32768, rms_norm_eps=1e-6, attention_bias=False,
                      use_sliding_window=False, sliding_window=4096, decoder_sparse_step=1,
                      moe_intermediate_size=768, num_experts_per_tok=8, num_experts=128,
                      norm_topk_prob=False),
    "deepseek_v2": dict(vocab_size=102400, hidden_size=4096, intermediate_size=11008,
                        num_hidden_layers=32, num_attention_heads=32,
                        max_position_embeddings=2048, rms_norm_eps=1e-6, attention_bias=False,
                        mlp_bias=False, first_k_dense_replace=0, kv_lora_rank=512,
                        q_lora_rank=1536, n_routed_experts=64, n_shared_experts=2,
                        qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128,
                        routed_scaling_factor=1.0, topk_method="greedy", norm_topk_prob=False,
                        moe_intermediate_size=1407, bos_token_id=1, eos_token_id=2),
    "deepseek_v3": dict(vocab_size=129280, hidden_size=7168, intermediate_size=18432,
                        moe_intermediate_size=2048, num_hidden_layers=61,
                        num_attention_heads=128, num_key_value_heads=128, n_shared_experts=1,
                        n_routed_experts=256, routed_scaling_factor=2.5, kv_lora_rank=512,
                        q_lora_rank=1536, qk_rope_head_dim=64, v_head_dim=128,
                        qk_nope_head_dim=128, n_group=8, topk_group=4, num_experts_per_tok=8,
                        first_k_dense_replace=3, norm_topk_prob=True,
                        max_position_embeddings=4096, rms_norm_eps=1e-6, attention_bias=False,
                        num_nextn_predict_layers=1, bos_token_id=0, eos_token_id=1),
    "gpt_oss": dict(num_hidden_layers=36, num_local_experts=128, vocab_size=201088,
                    hidden_size=2880, intermediate_size=2880, head_dim=64,
                    num_attention_heads=64, num_key_value_heads=8, sliding_window=128,
                    max_position_embeddings=131072, rms_norm_eps=1e-5, num_experts_per_tok=4,
                    attention_bias=True),
    "gpt2": dict(vocab_size=50257, n_positions=1024, n_embd=768, n_layer=12, n_head=12,
                 activation_function="gelu_new", layer_norm_epsilon=1e-5,
                 tie_word_embeddings=True, bos_token_id=50256, eos_token_id=50256),
}
"""What a field a config omits takes, per ``model_type``: the defaults of ``transformers``
5.x's config classes (``LlamaConfig()`` ... ``GPT2Config()``, their ``__init__`` defaults).
Fields HF derives from others (``head_dim``, ``num_key_value_heads`` of Llama and
DeepSeek-V2, ``layer_types``, ``n_inner``) are derived by the parser as HF does; the RoPE
defaults are in :data:`_DEFAULT_ROPE`. A field no entry lists takes the parser's generic
default (``hidden_act`` ``"silu"``, ``tie_word_embeddings`` False, ...), which is also what
that family's HF class uses (``tests/test_hf_config.py`` checks every family)."""
_DEFAULT_ROPE = {"mixtral": ({}, 1e6),
                 "gpt_oss": ({"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0,
                              "beta_slow": 1.0, "truncate": False,
                              "original_max_position_embeddings": 4096}, 150000.0)}
"""``model_type -> (rope_parameters without rope_theta, rope_theta)`` when a config gives
none (HF's ``default_theta`` of the config class and, for gpt-oss, its default YaRN); other
families: plain RoPE with theta 10000."""


class _Reader:
    """``g(key, default)`` reads ``d[key]``; a key ``d`` lacks takes ``defaults[key]`` (the
    family's HF default); ``None`` either way gives ``default``. It remembers the key as
    understood; ``first(keys)`` reads the first of several spellings ``d`` has (else their
    default); ``problem(field, why)`` collects what cannot be expressed."""

    def __init__(self, d: dict, defaults: dict | None = None):
        self.d, self.defaults, self.read, self.problems = d, defaults or {}, set(), []

    def __call__(self, key: str, default=None):
        self.read.add(key)
        v = self.d[key] if key in self.d else self.defaults.get(key)
        return default if v is None else v

    def first(self, keys: tuple, default=None):
        self.read.update(keys)
        for source in (self.d, self.defaults):
            for k in keys:
                if source.get(k) is not None:
                    return source[k]
        return default

    def problem(self, key: str, why: str) -> None:
        self.read.add(key)
        self.problems.append((key, why))


def parse_hf_config(d: dict, allow_unsupported: bool = False) -> dict:
    """``ModelConfig`` keyword arguments from an HF ``config.json`` dict.

    Args:
        d: the config dict (``transformers`` ``PretrainedConfig.to_dict()`` or the file).
        allow_unsupported: record fields we cannot express in ``unsupported_fields``
            instead of raising.

    Returns:
        dict of :class:`~tokenflow.config.ModelConfig` fields.

    Raises:
        ValueError: ``model_type`` not in :data:`FAMILIES`, or fields / values we cannot
            express (each named, with the reason), unless ``allow_unsupported``.
    """
    mt = d.get("model_type")
    if mt is not None and mt not in FAMILIES:
        raise ValueError(f"model_type {mt!r} is not supported (supported: {list(FAMILIES)})")
    defaults = _HF_DEFAULTS.get(mt, {})
    if mt == "gpt2":
        d = {_GPT2_NAMES.get(k, k): v for k, v in d.items()}
        defaults = {_GPT2_NAMES.get(k, k): v for k, v in defaults.items()}
    g = _Reader(d, defaults)
    kw = _common(g, mt)
    for part in (_attention, _windows, _moe, _rope):
        kw.update(part(g, mt))
    kw.update(**_mla(g), **_special_tokens(g))
    if kw["intermediate_size"] is None:                 # an all-MoE model (gpt-oss, V4)
        kw["intermediate_size"] = kw["moe_intermediate_size"]
    for key in ("is_encoder_decoder", "add_cross_attention"):
        if d.get(key):
            g.problem(key, f"{key}=True: only decoder-only models are modelled")
    unknown = sorted(k for k, v in d.items() if k not in g.read and k not in _IGNORED
                     and not k.startswith(_IGNORED_PREFIXES) and v is not None and v is not False)
    for k in unknown:
        g.problems.append((k, f"{k} is not a field we can express"))
    if g.problems and not allow_unsupported:
        raise ValueError("unsupported HF config fields: " +
                         "; ".join(why for _, why in g.problems))
    kw["unsupported_fields"] = tuple(sorted({k for k, _ in g.problems}))
    return kw


def _common(g: _Reader, mt: str | None) -> dict:
    hidden, n_heads = g("hidden_size"), g("num_attention_heads")
    inter = g("intermediate_size") or (4 * hidden if mt == "gpt2" else None)
    gpt2 = mt == "gpt2"
    return dict(
        vocab_size=g("vocab_size"), hidden_size=hidden,
        num_hidden_layers=g("num_hidden_layers"), num_attention_heads=n_heads,
        num_key_value_heads=g("num_key_value_heads") or n_heads,
        head_dim=g("head_dim") or (None if g("kv_lora_rank") else hidden // n_heads),
        intermediate_size=inter,
        max_position_embeddings=g("max_position_embeddings", 2048),
        rms_norm_eps=float(g.first(("rms_norm_eps", "layer_norm_eps"), 1e-6)),
        tie_word_embeddings=bool(g("tie_word_embeddings", gpt2)),
        gated_mlp=not gpt2, norm_type="layernorm" if gpt2 else "rmsnorm",
        position_embedding_type="absolute" if gpt2 else "rope",
        mlp_bias=bool(g("mlp_bias", False)) or mt in ("gpt2", "gpt_oss"),
        hidden_act=_activation(g, mt),
        num_nextn_predict_layers=int(g("num_nextn_predict_layers", 0)))


def _activation(g: _Reader, mt: str | None) -> str:
    """``hidden_act`` (GPT-2: ``activation_function``), one of the activations the model
    runs (:data:`~tokenflow.config.model_config.HIDDEN_ACTS`, HF's ``ACT2FN`` names)."""
    act = g("hidden_act", "gelu_new" if mt == "gpt2" else "silu")
    if act not in HIDDEN_ACTS:
        name = "activation_function" if mt == "gpt2" else "hidden_act"
        g.problem("hidden_act", f"{name} {act!r} is not supported (supported: "
                  f"{sorted(HIDDEN_ACTS)})")
        return "silu"
    return act


def _attention(g: _Reader, mt: str | None) -> dict:
    """Biases, q/k norms and sinks of the attention block."""
    qkv = out = bool(g("attention_bias", False))
    if mt == "qwen2":
        qkv, out = True, False                       # Qwen2Attention: bias on q, k, v only
    elif mt == "qwen2_moe":
        qkv, out = bool(g("qkv_bias", True)), False
    elif mt == "gpt2":
        qkv = out = True                             # c_attn and c_proj have biases
    return dict(attention_bias=qkv, attention_out_bias=out,
                qk_norm=mt in ("qwen3", "qwen3_moe"), attention_sinks=mt == "gpt_oss")


_QWEN_MAX_WINDOW_LAYERS = 28
"""HF's default ``max_window_layers`` (``Qwen2Config``, ``Qwen3Config``, ``Qwen2MoeConfig``)."""


def _windows(g: _Reader, mt: str | None) -> dict:
    """``sliding_window`` and ``layer_types`` (``None`` when every layer is the same).

    Qwen configs without ``layer_types`` derive it as ``transformers`` 5.x does (their
    ``configuration_<family>.py``): the window is used only with ``use_sliding_window``;
    qwen2 / qwen3 slide in layers ``i >= max_window_layers`` (default 28, the first layers
    are full), qwen2_moe in the even layers ``i < max_window_layers``, qwen3_moe in every
    layer (its config has no ``max_window_layers``); gpt-oss alternates, sliding in the even
    layers (``GptOssConfig``). A ``layer_types`` with sliding layers but
    no window in use means every layer is full (HF's attention reads ``sliding_window=None``).
    """
    w, types, L = g("sliding_window"), g("layer_types"), g("num_hidden_layers")
    if mt in ("qwen2", "qwen3", "qwen2_moe", "qwen3_moe"):
        use = bool(g("use_sliding_window", False))
        first = g("max_window_layers", _QWEN_MAX_WINDOW_LAYERS)
        w = w if use and w else None                    # qwen2_moe writes 0 for "none"
        if types is None and w is not None:
            if mt in ("qwen2", "qwen3"):
                types = ["sliding_attention" if i >= first else "full_attention"
                         for i in range(L)]
            elif mt == "qwen2_moe":
                types = ["sliding_attention" if i % 2 == 0 and i < first else "full_attention"
                         for i in range(L)]
    elif mt == "gpt_oss" and types is None and w is not None:
        types = ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(L)]
    if types is not None:
        types = list(types)
        if w is None or "sliding_attention" not in types:
            w, types = None, None
        elif "full_attention" not in types:
            types = None
    return dict(sliding_window=w, layer_types=types)


_FAMILY_TOPK_METHODS = {"deepseek_v2": ("greedy", "group_limited_greedy"),
                        "deepseek_v3": ("noaux_tc",)}
"""The ``topk_method`` values ``transformers``' routers implement: ``DeepseekV2TopkRouter``
branches on the two greedy ones, ``DeepseekV3TopkRouter`` always ranks groups by the sum of
their top-2 scores."""


def _moe(g: _Reader, mt: str | None) -> dict:
    """Experts, top-k, shared experts, router, which layers are MoE."""
    experts = int(g.first(("num_local_experts", "n_routed_experts", "num_experts"), 0))
    k = g.first(("num_experts_per_tok", "experts_per_token"))
    if k is None and experts and mt == "deepseek_v2":
        g.problem("num_experts_per_tok", "num_experts_per_tok is missing: DeepseekV2Config "
                  "has no default for it (None; its router cannot run)")
    k = 2 if k is None else k
    inter = g("intermediate_size")
    scoring = g("scoring_func", "sigmoid" if mt == "deepseek_v3" else "softmax")
    if scoring not in ("softmax", "sigmoid"):
        g.problem("scoring_func", f"scoring_func {scoring!r} is not modelled (softmax, sigmoid)")
        scoring = "softmax"
    method = g("topk_method", "greedy" if mt == "deepseek_v2" else "noaux_tc")
    allowed = _FAMILY_TOPK_METHODS.get(mt, (method,))    # others: ModelConfig checks it
    if method not in allowed:
        g.problem("topk_method", f"topk_method {method!r} is not modelled for model_type "
                  f"{mt!r} (HF's router implements {allowed})")
        method = allowed[0]
    renorm = mt in ("mixtral", "gpt_oss") or (mt is None and "num_local_experts" in g.d)
    kw = dict(num_experts=experts, num_experts_per_tok=int(k) if experts else 0,
              moe_intermediate_size=g("moe_intermediate_size") or inter or 1,
              num_shared_experts=int(g("n_shared_experts") or 0) if experts else 0,
              first_k_dense_replace=int(g("first_k_dense_replace", 0)),
              moe_layer_freq=int(g("moe_layer_freq", 1)), scoring_func=scoring,
              norm_topk_prob=True if renorm else bool(g("norm_topk_prob", False)),
              routed_scaling_factor=float(g("routed_scaling_factor") or 1.0),
              n_group=int(g("n_group") or 1), topk_group=int(g("topk_group") or 1),
              topk_method=method,
              router_bias=mt == "gpt_oss" and experts > 0)
    if mt in ("qwen2_moe", "qwen3_moe") and experts:
        kw.update(_qwen_moe_layers(g))
    return kw


def _qwen_moe_layers(g: _Reader) -> dict:
    """Qwen-MoE's shared expert (width a multiple of ``moe_intermediate_size``; its gate) and
    dense layers (``mlp_only_layers`` must be the first k; ``decoder_sparse_step`` 1)."""
    out = {}
    moe_i, shared_i = g("moe_intermediate_size"), g("shared_expert_intermediate_size", 0)
    if shared_i % moe_i:
        g.problem("shared_expert_intermediate_size",
                  f"shared_expert_intermediate_size ({shared_i}) must be a multiple of "
                  f"moe_intermediate_size ({moe_i})")
    else:
        out.update(num_shared_experts=shared_i // moe_i, shared_expert_gate=shared_i > 0)
    dense = sorted(g("mlp_only_layers", []))
    step = g("decoder_sparse_step", 1)
    if dense != list(range(len(dense))) or step != 1:
        g.problem("mlp_only_layers" if step == 1 else "decoder_sparse_step",
                  "only 'first k layers dense, the rest MoE' is modelled, got "
                  f"mlp_only_layers={dense}, decoder_sparse_step={step}")
    out["first_k_dense_replace"] = len(dense)
    return out


def _rope(g: _Reader, mt: str | None) -> dict:
    """``rope_theta`` and ``rope_scaling`` from either spelling of HF's RoPE settings."""
    default_rope, default_theta = _DEFAULT_ROPE.get(mt, ({}, 10000.0))
    rope = dict(g("rope_parameters") or g("rope_scaling") or default_rope)
    theta = rope.pop("rope_theta", None) or g("rope_theta") or default_theta
    kind = rope.pop("rope_type", None) or rope.pop("type", None) or "default"
    rope.pop("type", None)
    if mt == "gpt2":
        return {}                                    # learned absolute positions
    if rope.pop("partial_rotary_factor", g("partial_rotary_factor", 1.0)) != 1.0:
        g.problem("partial_rotary_factor", "partial_rotary_factor != 1 is not implemented "
                  "(rope_parameters)")
    if kind not in ROPE_TYPES:
        g.problem("rope_parameters", f"rope_type {kind!r} is not implemented (supported: "
                  f"{sorted(ROPE_TYPES)})")
        kind = "default"
    if kind in ("llama3", "yarn"):           # HF's default (standardize_rope_params)
        rope.setdefault("original_max_position_embeddings", g("max_position_embeddings"))
    scaling = None if kind == "default" else {"rope_type": kind, **rope}
    return dict(rope_theta=float(theta), rope_scaling=scaling)


def _mla(g: _Reader) -> dict:
    """The MLA fields of a DeepSeek-V2/V3 config (empty for other families)."""
    names = ("q_lora_rank", "kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim",
             "v_head_dim")
    out = {n: g(n) for n in names}
    qk = g("qk_head_dim")
    if out["kv_lora_rank"] is None:
        for n in names:
            if out[n] is not None:
                g.problem(n, f"{n} without kv_lora_rank (not MLA) is not modelled")
        return {}
    if qk is not None and out["qk_nope_head_dim"] is not None \
            and out["qk_rope_head_dim"] is not None \
            and qk != out["qk_nope_head_dim"] + out["qk_rope_head_dim"]:
        raise ValueError(f"qk_head_dim ({qk}) must equal qk_nope_head_dim + qk_rope_head_dim "
                         f"({out['qk_nope_head_dim']} + {out['qk_rope_head_dim']})")
    return out


def _special_tokens(g: _Reader) -> dict:
    """Special token ids. A list of EOS ids (Llama 3 Instruct: ``[128001, 128009]``) is kept
    whole as a tuple (one id: that int; an empty list or a missing id: ``None``, no EOS);
    a missing pad or bos id becomes 0."""
    eos = g("eos_token_id")
    if isinstance(eos, (list, tuple)):
        eos = tuple(int(v) for v in eos) if len(eos) > 1 else (int(eos[0]) if eos else None)
    elif eos is not None:
        eos = int(eos)
    ids = (("pad_token_id", g("pad_token_id")), ("bos_token_id", g("bos_token_id")))
    return {**{name: int(v) if v is not None else 0 for name, v in ids}, "eos_token_id": eos}
